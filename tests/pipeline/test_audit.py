"""`kq journal audit`: the journal's state on Spark against the live service, at one batch."""

import json
import threading

import pytest

from broker.client import QueueClient
from tests.conftest import broker_kinds
from tests.integration.kit import (
    ServeProcess,
    drain,
    ensure_topic,
    kq,
    publish,
    serving_one_queue,
    uid,
    wait_for,
)

# Each test runs `kq journal audit`, which starts Spark in its own process (30-60 s here
# when the machine is busy): more than the suite's default timeout.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=[k for k in broker_kinds() if k != "embedded"]
                or broker_kinds())
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Apache Kafka only, when the suite runs it: the audit's Spark processes are among the
    suite's slowest (its 30-minute budget), and what they read of the embedded broker, the
    journal through the data source and a service's snapshot, test_report.py and the
    journal command tests read on both."""
    return str(request.param)


def audit(cfg):
    out = kq("journal", "audit", "--config", str(cfg), "--json", timeout=300)
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)


def depth(cfg) -> dict:
    return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]


@pytest.mark.timeout(400)
def test_a_busy_service_killed_and_restarted_has_no_differences(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "AUD", 'lease_period = "1h"\n') as (
            name, cfg, prefix, serve):
        stop = threading.Event()
        published: list[str] = []

        def load() -> None:
            """Keeps publishing, about 400 a second, while the service is killed and the
            audit takes its snapshot (a few seconds in); at most 4,000, so Spark has little
            to read."""
            i = 0
            while not stop.is_set() and i < 4_000:
                published.extend(publish(bootstrap, name, [b'{"n": %d}' % i for i in range(
                    i, i + 20)], key=b"k"))
                i += 20
                stop.wait(0.05)

        with QueueClient(bootstrap, topic_prefix=prefix, name=f"w-{prefix}") as c:
            sub = c.subscribe(name, max_backlog=10)
            producer = threading.Thread(target=load, daemon=True)
            producer.start()
            got = drain(sub, 10)
            for m in got[:6]:
                m.ack()
            got[6].cancel()
            c.flush()
            serve.proc.kill()  # kill -9 under load
            serve.proc.wait()
            serve.start()
            # the restarted service has queued more than 300 (it catches up from its journal
            # and the topic first)
            queued = wait_for(lambda: (d := depth(cfg)["depth"]) > 300 and d, 60,
                              "more queued after the restart")  # only grows: no more acks
            code, result = audit(cfg)  # while publishing goes on
            stop.set()
            producer.join(10)
    assert code == 0 and result["differences"] == [], result["differences"][:5]
    # every message queued was compared (on Apache Kafka an audit once compared none)
    assert result["queues"] == 1 and result["messages"] >= queued > 300
    assert result["transitions"] > result["messages"]


@pytest.mark.timeout(400)
def test_a_lost_state_write_is_reported_as_a_difference(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "LOST", 'lease_period = "1h"\n') as (
            name, cfg, prefix, serve):
        serve.stop()
        # loses what the first ack did (each batch's state written on its own: a window of
        # batches would lose the lease before it too)
        serve.start(KQ_TEST_DROP_STATE_WRITE="acked", KQ_TEST_STATE_WINDOW_MS="0")
        bms = publish(bootstrap, name, [b'{"n": %d}' % i for i in range(5)], key=b"k")
        with QueueClient(bootstrap, topic_prefix=prefix, name=f"w-{prefix}") as c:
            first, second = drain(c.subscribe(name, max_backlog=2), 2)
            first.ack()
            second.ack()
            c.flush()
            wait_for(lambda: depth(cfg)["acked"] == 2, what="two acks")
            # memory is right, disk is not (an audit now finds nothing: one Spark start less
            # than proving it; the busy test above audits a healthy service)
            serve.stop()
            serve.start()  # the lost write is loaded back: an acked message is back
            code, result = audit(cfg)
    assert code == 1
    assert result["differences"] == [{"queue": name, "bookmark": bms[0], "field": "state",
                                      "journal": None, "service": "leased"}]


@pytest.mark.timeout(400)
def test_each_shard_is_audited_as_of_its_own_batch(bootstrap, tmp_path):
    u = uid()
    names = [f"AUD0_{u}", f"AUD1_{u}"]
    for name in names:
        ensure_topic(bootstrap, name)
    cfg = tmp_path / "kq.toml"
    cfg.write_text(f"""
[service]
topic_prefix = "kq{u}"
bootstrap_servers = "{bootstrap}"
data_dir = "{tmp_path / 'state'}"
metrics_port = 0
shards = 2
[[queue]]
name = "{names[0]}"
shard = 0
lease_period = "1h"
[[queue]]
name = "{names[1]}"
shard = 1
lease_period = "1h"
""")
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        wait_for(lambda: serve.log_path.read_text().count("ready:") == 2, 30, "both shards")
        publish(bootstrap, names[0], [b'{"n": %d}' % i for i in range(4)], key=b"k")
        publish(bootstrap, names[1], [b'{"n": %d}' % i for i in range(7)], key=b"k")
        with QueueClient(bootstrap, topic_prefix=f"kq{u}", name=f"w-{u}") as c:
            drain(c.subscribe(names[0], max_backlog=10), 4)[0].ack()  # shard 0 moves on
            c.flush()
            code, result = audit(cfg)
    finally:
        serve.stop()
    assert code == 0 and result["differences"] == [], result["differences"][:5]
    assert result["queues"] == 2 and result["messages"] == 4 + 7 - 1
    assert [b["shard"] for b in result["batches"]] == [0, 1]
    assert all(b["batch"] > 0 for b in result["batches"])


def test_a_snapshots_state_is_continued_by_the_journal_after_it(spark):
    """The audit's rebuild from a stored snapshot (the journal's head deleted): the journal
    after it has the last word on a message's state; counts never fall, except for a
    message enqueued anew; messages it does not mention stay as the snapshot has them."""
    from broker.pipeline.audit import ROWS, journal_state

    base = spark.createDataFrame([
        ("Q", "T/0/1", "available", 0, 0, None),
        ("Q", "T/0/2", "leased", 1, 0, "w1"),
        ("Q", "T/0/3", "leased", 2, 1, "w1"),
        ("Q", "T/0/4", "available", 1, 1, None),
        ("Q", "T/0/5", "leased", 3, 0, "w1"),
    ], ROWS)
    tail = spark.createDataFrame([
        # batch, offset, index, kind, queue, bookmark, client, delivery_count, cancel_count
        (8, 20, 0, "acked", "Q", "T/0/2", "w1", 1, 0),
        (8, 20, 1, "returned", "Q", "T/0/3", None, 0, 2),
        (9, 21, 0, "leased", "Q", "T/0/4", "w2", 2, 0),
        (9, 21, 1, "enqueued", "Q", "T/0/6", None, 0, 0),
        (9, 21, 2, "removed", "Q", "T/0/5", None, 3, 0),
        (9, 21, 3, "enqueued", "Q", "T/0/5", None, 0, 0),  # a recovery-point reset
        (10, 22, 0, "leased", "Q", "T/0/1", "w3", 1, 0),  # after the audited batch
    ], "batch long, offset long, index int, kind string, queue string, bookmark string, "
       "client string, delivery_count int, cancel_count int")
    got = {r["bookmark"]: tuple(r)[2:] for r in journal_state(tail, 9, base).collect()}
    assert got == {
        "T/0/1": ("available", 0, 0, None),
        "T/0/3": ("available", 2, 2, None),
        "T/0/4": ("leased", 2, 1, "w2"),
        "T/0/5": ("available", 0, 0, None),
        "T/0/6": ("available", 0, 0, None),
    }
