"""Filters, priority and ack by filter end to end (SPEC section 6), with the CLI."""

import json

import pytest

from broker.client import CommandError, QueueClient
from broker.engine.acks import SWEEP_PART
from tests.integration.kit import (
    ServeProcess,
    drain,
    ensure_topic,
    kq,
    publish,
    serving_one_queue,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def served(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "EX",
                           'priority = "/urgency"\nlease_period = "1h"\n') as served_queue:
        yield served_queue


def test_filtered_subscribers_get_their_messages_in_priority_order(bootstrap, served):
    name, cfg, prefix, _ = served
    with QueueClient(bootstrap, topic_prefix=prefix) as c:
        publish(bootstrap, name, [
            json.dumps({"sym": "IBM", "urgency": 1}).encode(),
            json.dumps({"sym": "MSFT", "urgency": 9}).encode(),
            json.dumps({"sym": "IBM", "urgency": 5}).encode(),
            b"not json at all",
        ])
        wait_for(lambda: json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]
                 ["enqueued"] == 4, what="all four enqueued")
        ibm = c.subscribe(name, filter="/sym = 'IBM'", max_backlog=10)
        got = drain(ibm, 2)
        assert [(m.data["sym"], m.data["urgency"]) for m in got] == [("IBM", 5), ("IBM", 1)]
        assert drain(ibm, 1, timeout=0.5) == []  # MSFT and the unparseable one wait
        rest = c.subscribe(name, max_backlog=10)
        others = drain(rest, 2)
        assert [m.value for m in others] == [b'{"sym": "MSFT", "urgency": 9}', b"not json at all"]


def test_ack_where_by_client_and_cli_and_inspect_filter(bootstrap, served):
    name, cfg, prefix, _ = served
    publish(bootstrap, name, [json.dumps({"status": s, "urgency": 0}).encode()
                              for s in ("void", "ok", "void", "void")])

    def inspect(*extra):
        out = kq("inspect", name, "--config", str(cfg), "--json", *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["messages"]

    wait_for(lambda: len(inspect()) == 4, what="four messages")
    assert len(inspect("--filter", "/status = 'void'")) == 3
    with QueueClient(bootstrap, topic_prefix=prefix) as c:
        assert c.ack_where(name, "/status = 'void' AND /urgency = 0") == 3
    assert [m["state"] for m in inspect()] == ["available"]
    out = kq("ack", name, "--where", "/status = 'ok'", "--config", str(cfg), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["acked"] == 1
    assert inspect() == []
    bad = kq("ack", name, "--where", "/status = ", "--config", str(cfg))
    assert bad.returncode == 2 and "column" in bad.stderr


def test_ack_where_of_a_queue_deeper_than_one_part_acks_every_match(bootstrap, served):
    # the service reads a deep queue a part at a time between its other work (engine.acks)
    name, cfg, _, _ = served
    n = 2 * SWEEP_PART + 500
    publish(bootstrap, name, [json.dumps({"status": "ok" if i % 3 else "void"}).encode()
                              for i in range(n)])

    def queue() -> dict:
        return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]

    wait_for(lambda: queue()["enqueued"] == n, what=f"all {n} enqueued")
    out = kq("ack", name, "--where", "/status = 'void'", "--config", str(cfg), "--json")
    voids = len(range(0, n, 3))
    assert out.returncode == 0 and json.loads(out.stdout)["acked"] == voids, out.stderr
    assert queue()["depth"] == n - voids


def test_priorities_and_filters_survive_a_restart(bootstrap, served):
    name, cfg, prefix, serve = served
    publish(bootstrap, name, [json.dumps({"sym": s, "urgency": u}).encode()
                              for s, u in (("IBM", 1), ("IBM", 7), ("MSFT", 9), ("IBM", 3))])
    wait_for(lambda: json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]
             ["enqueued"] == 4, what="all four enqueued")
    serve.stop()
    serve.start()  # priorities from RocksDB, payloads (for the filter) re-read from it
    with QueueClient(bootstrap, topic_prefix=prefix) as c:
        got = drain(c.subscribe(name, filter="/sym = 'IBM'", max_backlog=10), 3)
    assert [m.data["urgency"] for m in got] == [7, 3, 1]


@pytest.mark.parametrize("priority", ["header('prio') * 1", "header('prio')"])
def test_a_priority_read_from_a_header_orders_the_queue(bootstrap, tmp_path, priority):
    """A producer that is not kq writes its priority as a header, so as text: the text reads
    as a number, in arithmetic and as the priority itself."""
    with serving_one_queue(bootstrap, tmp_path, "HP",
                           f'priority = "{priority}"\n') as (name, cfg, prefix, _):
        bms = {}
        for prio in (b"1", b"5", b"3"):  # one key: Kafka keeps their order
            (bms[prio],) = publish(bootstrap, name, [b'{"job": ' + prio + b"}"], key=b"k",
                                   headers=[("prio", prio)])
        wait_for(lambda: json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]
                 ["enqueued"] == 3, what="all three enqueued")
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            sub = c.subscribe(name, max_backlog=1)
            order = []
            for _ in range(3):
                (m,) = drain(sub, 1)
                order.append(m.bookmark)
                m.ack()
                c.flush()
        assert order == [bms[b"5"], bms[b"3"], bms[b"1"]]


def test_a_barrier_synchronises_all_subscribers(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "BAR",
                           'barrier_expression = "/type = \'eod\'"\n') as (name, _, prefix, _), \
            QueueClient(bootstrap, topic_prefix=prefix) as a, \
            QueueClient(bootstrap, topic_prefix=prefix) as b:
        sa = a.subscribe(name, max_backlog=1)
        sb = b.subscribe(name, max_backlog=0)  # gets only barriers
        bms = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}', b'{"type": "eod"}',
                                        b'{"n": 3}'])
        (m1,) = drain(sa, 1)
        assert m1.bookmark == bms[0]
        m1.ack()
        (m2,) = drain(sa, 1)
        assert drain(sb, 1, timeout=0.3) == []  # the barrier waits for m2's ack
        m2.ack()
        (bar_a,) = drain(sa, 1)
        (bar_b,) = drain(sb, 1)
        assert bar_a.is_barrier and bar_b.is_barrier and bar_a.bookmark == bms[2]
        bar_a.ack()  # harmless
        (m3,) = drain(sa, 1)  # only after the barrier
        assert m3.bookmark == bms[3] and not m3.is_barrier
        m3.ack()
        a.flush()
        assert not a.errors


@pytest.fixture
def entitled(bootstrap, tmp_path):
    """A service with [auth]: worker-U reads PUB_U, auditor-U reads SEC_U; yields U."""
    u = uid()
    public, secret = f"PUB_{u}", f"SEC_{u}"
    for t in (public, secret):
        ensure_topic(bootstrap, t)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [public, secret], tmp_path / "state",
                       bootstrap)
    cfg.write_text(cfg.read_text().replace(
        "[[queue]]", f'[auth]\n"worker-{u}" = "^PUB_"\n"auditor-{u}" = "^SEC_"\n[[queue]]', 1))
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        yield u
    finally:
        serve.stop()


def test_entitlements_refuse_subscribe_browse_and_ack_on_queues_a_principal_may_not_read(
        bootstrap, entitled):
    u = entitled
    public, secret = f"PUB_{u}", f"SEC_{u}"
    with QueueClient(bootstrap, name=f"w-{u}", principal=f"worker-{u}",
                     topic_prefix=f"kq{u}") as w:
        w.subscribe(public)
        with pytest.raises(CommandError, match="not entitled"):
            w.subscribe(secret)
        with pytest.raises(CommandError, match="not entitled"):
            w.subscribe(secret, mode="browse")
        (bm,) = publish(bootstrap, secret, [b'{"s": 1}'])
        with pytest.raises(CommandError, match="not entitled"):
            w.ack(secret, [bm])
        with pytest.raises(CommandError, match="not entitled"):
            w.ack_where(secret, "/s = 1")
    with QueueClient(bootstrap, name=f"auditor-{u}", topic_prefix=f"kq{u}") as a:
        (m,) = drain(a.subscribe(secret), 1)  # the name is the principal by default
        assert m.bookmark == bm


def test_the_command_topic_not_the_record_says_who_sent_a_command(bootstrap, entitled):
    u = entitled
    with QueueClient(bootstrap, principal=f"worker-{u}", topic_prefix=f"kq{u}") as w:
        w.principal = f"auditor-{u}"  # a claim inside the record: not believed
        with pytest.raises(CommandError, match=f"'worker-{u}' may not read"):
            w.subscribe(f"SEC_{u}")
        assert w._io.commands_topic == f"kq{u}.commands.worker-{u}"
    # no command topic of its own: the shared one vouches for nobody
    with QueueClient(bootstrap, principal=f"stranger-{u}", topic_prefix=f"kq{u}") as s:
        assert s._io.commands_topic == f"kq{u}.commands"
        s.principal = f"worker-{u}"
        with pytest.raises(CommandError, match="own command topic"):
            s.subscribe(f"PUB_{u}")


def test_a_worker_started_before_the_service_finds_its_command_topic(bootstrap, tmp_path):
    u = uid()
    ensure_topic(bootstrap, f"PUB_{u}")
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [f"PUB_{u}"], tmp_path / "state",
                       bootstrap)
    cfg.write_text(cfg.read_text().replace("[[queue]]", f'[auth]\n"worker-{u}" = "^PUB_"\n'
                                           "[[queue]]", 1))
    with QueueClient(bootstrap, principal=f"worker-{u}", topic_prefix=f"kq{u}") as w:
        assert w._io.commands_topic == f"kq{u}.commands"  # no service yet, no topic of its own
        serve = ServeProcess(cfg, tmp_path / "serve.log").start()  # it creates the topic
        try:
            (bm,) = publish(bootstrap, f"PUB_{u}", [b'{"n": 1}'])
            (m,) = drain(w.subscribe(f"PUB_{u}"), 1)  # refused on the shared topic, then not
            assert m.bookmark == bm
            assert w._io.commands_topic == f"kq{u}.commands.worker-{u}"
        finally:
            serve.stop()
