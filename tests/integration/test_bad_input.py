"""Bad input of every kind: a clear error to the sender (or a log line and a metric), and the
service keeps serving. One service for the module; each test uses its own clients."""

import io
import json
import os
import subprocess
import sys
import time

import fastavro
import pytest
from confluent_kafka import Producer

from broker import wire
from broker.client import CommandError, QueueClient
from broker.kafka import clients
from broker.kafka.embedded import EmbeddedBroker, free_port
from broker.values import Bookmark
from tests.integration.kit import (
    KQ,
    ROOT,
    config,
    drain,
    ensure_topic,
    kq,
    publish,
    read_topic,
    running_service,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc(bootstrap, tmp_path_factory):
    u = uid()
    q, dlq = f"BAD_{u}", f"BAD_{u}_DLQ"
    ensure_topic(bootstrap, q)
    cfg = config(f"kq{u}", str(tmp_path_factory.mktemp("bad")), [
        {"name": q, "dead_letter_topic": dlq, "lease_period": "2s"},
    ], heartbeat_timeout="3s")
    with running_service(bootstrap, cfg) as service:
        service.queue, service.dlq, service.prefix = q, dlq, f"kq{u}"
        yield service


def client(bootstrap, svc, **kw):
    return QueueClient(bootstrap, topic_prefix=svc.prefix, request_timeout=5, **kw)


def bad_commands(svc) -> float:
    return svc.metrics.registry.get_sample_value("kq_bad_commands_total") or 0.0


def still_serving(bootstrap, svc) -> None:
    """A fresh client can subscribe, receive and ack: the service is fine."""
    with client(bootstrap, svc) as c:
        sub = c.subscribe(svc.queue, max_backlog=10)
        (bm,) = publish(bootstrap, svc.queue, [b'{"ok": true}'])
        for m in sub.messages(timeout=5):
            m.ack()  # whatever earlier tests left behind too
            if m.bookmark == bm:
                return
        raise AssertionError("the service stopped delivering")


def receive(sub, bookmark: str, timeout: float = 5):
    """The first delivery of `bookmark` (others are acked out of the way)."""
    for m in sub.messages(timeout=timeout):
        if m.bookmark == bookmark:
            return m
        m.ack()
    raise AssertionError(f"{bookmark} was not delivered")


def queued(svc, bookmark: str) -> bool:
    return Bookmark.parse(bookmark) in svc.engine.queues[svc.queue].messages


def raw_command(bootstrap, svc, value: bytes | None) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(f"{svc.prefix}.commands", value, partition=0)
    p.flush(10)


def command(**fields) -> dict:
    base = {"type": "heartbeat", "client": "raw", "request_id": "", "queue": None,
            "sub_id": None, "max_backlog": None, "filter": None, "mode": None,
            "bookmarks": [], "query": None, "sent_ms": 0}
    return {**base, **fields}


# -- records on the commands topic that cannot be understood: logged and counted ---------------

@pytest.mark.parametrize("value", [
    b"\xff\xfe not avro at all",
    b"",
    None,
    wire.encode("command", command(client="has space")),  # not a possible topic name
], ids=["garbage", "empty", "null", "bad-client-name"])
def test_unreadable_commands_are_counted_and_the_service_keeps_serving(bootstrap, svc, value):
    before = bad_commands(svc)
    raw_command(bootstrap, svc, value)
    wait_for(lambda: bad_commands(svc) > before, what="the bad command to be counted")
    still_serving(bootstrap, svc)


def test_valid_avro_with_an_unknown_command_type_is_counted(bootstrap, svc):
    # a newer client's schema: one more command type
    schema = json.loads((ROOT / "schemas" / "command.avsc").read_text())
    schema["fields"][0]["type"]["symbols"].append("self_destruct")
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema),
                               command(type="self_destruct"))
    before = bad_commands(svc)
    raw_command(bootstrap, svc, buf.getvalue())
    wait_for(lambda: bad_commands(svc) > before, what="the unknown type to be counted")
    still_serving(bootstrap, svc)


# -- commands the service understands and refuses: CommandError within a second ----------------

def _ack_twice(c, svc, sub):
    (bm,) = publish(c.bootstrap_servers, svc.queue, [b'{"twice": 1}'])
    receive(sub, bm)
    c.ack(svc.queue, [bm])
    c.ack(svc.queue, [bm])


def _ack_someone_elses_lease(c, svc, sub):
    (bm,) = publish(c.bootstrap_servers, svc.queue, [b'{"theirs": 1}'])
    receive(sub, bm)
    with QueueClient(c.bootstrap_servers, topic_prefix=svc.prefix, request_timeout=5) as other:
        other.subscribe(svc.queue, max_backlog=0)
        other.ack(svc.queue, [bm])


def _unsubscribe_someone_elses(c, svc, sub):
    with QueueClient(c.bootstrap_servers, topic_prefix=svc.prefix, request_timeout=5) as other:
        other._request("unsubscribe", sub_id=sub.sub_id)


def _cancel_available(c, svc, sub):
    sub.close()
    (bm,) = publish(c.bootstrap_servers, svc.queue, [b'{"idle": 1}'])
    wait_for(lambda: queued(svc, bm), what="the message")
    with QueueClient(c.bootstrap_servers, topic_prefix=svc.prefix, request_timeout=5) as other:
        other.subscribe(svc.queue, max_backlog=0)
        other._request("cancel", queue=svc.queue, bookmarks=[bm])


REFUSALS = {
    "subscribe unknown queue": (lambda c, svc, sub: c.subscribe("NOPE_QUEUE"), "unknown queue"),
    "subscribe negative backlog": (lambda c, svc, sub: c.subscribe(svc.queue, max_backlog=-3),
                                   "max_backlog must be >= 0"),
    "subscribe fractional backlog": (lambda c, svc, sub: c.subscribe(svc.queue, max_backlog=2.5),
                                     "must be an integer"),
    "subscribe text backlog": (lambda c, svc, sub: c.subscribe(svc.queue, max_backlog="5"),
                               "must be an integer"),
    "subscribe boolean backlog": (lambda c, svc, sub: c.subscribe(svc.queue, max_backlog=True),
                                  "must be an integer"),
    "subscribe with a bad filter": (lambda c, svc, sub: c.subscribe(svc.queue, filter="/a = ("),
                                    "bad filter.*column 7"),
    "browse with a negative replay period": (lambda c, svc, sub: c._request(
        "subscribe", queue=svc.queue, sub_id="b1", mode="browse", replay_period_ms=-5),
        "replay_period needs mode='browse' and a duration >= 0"),
    "subscribe unknown mode": (lambda c, svc, sub: c._request(
        "subscribe", queue=svc.queue, sub_id="m1", mode="sideways"), "mode"),
    "ack unknown bookmark": (lambda c, svc, sub: c.ack(svc.queue, [f"{svc.queue}/0/999999"]),
                             "not in queue"),
    "ack malformed bookmark": (lambda c, svc, sub: c.ack(svc.queue, ["not-a-bookmark"]),
                               "bad bookmark"),
    "ack on unknown queue": (lambda c, svc, sub: c.ack("NOPE_QUEUE", [f"{svc.queue}/0/1"]),
                             "unknown queue"),
    "ack already acked": (_ack_twice, "already acked"),
    "ack of someone else's lease": (_ack_someone_elses_lease, "leased to another subscriber"),
    "cancel of an available message": (_cancel_available, "not leased"),
    "cancel unknown bookmark": (lambda c, svc, sub: c._request(
        "cancel", queue=svc.queue, bookmarks=[f"{svc.queue}/0/999999"]), "not in queue"),
    "expire unknown bookmark": (lambda c, svc, sub: c._request(
        "expire", queue=svc.queue, bookmarks=[f"{svc.queue}/0/999999"]), "not in queue"),
    "unsubscribe someone else's": (_unsubscribe_someone_elses, "is not yours"),
    "query of an unknown kind": (lambda c, svc, sub: c.query(what="everything"),
                                 "unknown query"),
    "inspect unknown queue": (lambda c, svc, sub: c.query(what="inspect", queue="NOPE_QUEUE"),
                              "unknown queue"),
    "inspect unknown state": (lambda c, svc, sub: c.query(what="inspect", queue=svc.queue,
                                                          state="sleeping"), "unknown state"),
    "query that is not JSON": (lambda c, svc, sub: c._request("query", query="{what:"),
                               "bad query command"),
    "ack_where with a bad expression": (lambda c, svc, sub: c.ack_where(svc.queue, "/a = = 1"),
                                        "column 6"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_commands_raise_command_error_within_a_second(bootstrap, svc, case):
    action, words = REFUSALS[case]
    with client(bootstrap, svc) as c:
        c.bootstrap_servers = bootstrap
        sub = c.subscribe(svc.queue, max_backlog=5)
        started = time.monotonic()
        with pytest.raises(CommandError, match=words):
            action(c, svc, sub)
        assert time.monotonic() - started < 1.0 or case in SLOW_SETUP
    still_serving(bootstrap, svc)


# these first get a message delivered, then do the refused thing
SLOW_SETUP = {"ack already acked", "ack of someone else's lease",
              "cancel of an available message", "unsubscribe someone else's"}


def test_a_bad_client_name_is_refused_by_the_client(bootstrap, svc):
    with pytest.raises(ValueError, match="bad client name"):
        QueueClient(bootstrap, name="no spaces please", topic_prefix=svc.prefix)


# -- payloads -------------------------------------------------------------------------------------

def test_max_backlog_zero_is_valid_and_gets_no_ordinary_message(bootstrap, svc):
    with client(bootstrap, svc) as c:
        sub = c.subscribe(svc.queue, max_backlog=0)
        assert sub.backlog == 0
        publish(bootstrap, svc.queue, [b'{"n": 1}'])
        assert drain(sub, 1, timeout=1) == []
    still_serving(bootstrap, svc)


def test_a_payload_that_is_not_json_arrives_with_data_none(bootstrap, svc):
    with client(bootstrap, svc) as c:
        sub = c.subscribe(svc.queue, max_backlog=10)
        (bm,) = publish(bootstrap, svc.queue, [b"{not json"])
        m = receive(sub, bm)
        assert m.data is None and m.value == b"{not json"
        # an expression over it sees NULL (no match), and the service counts it
        before = svc.metrics.registry.get_sample_value(
            "kq_unparseable_payloads_total", {"queue": svc.queue}) or 0
        assert c.ack_where(svc.queue, "/x IS NULL OR /x IS NOT NULL") == 0
        after = svc.metrics.registry.get_sample_value(
            "kq_unparseable_payloads_total", {"queue": svc.queue})
        assert after is not None and after > before
        m.ack()


def test_a_record_without_a_value_is_delivered(bootstrap, svc):
    with client(bootstrap, svc) as c:
        sub = c.subscribe(svc.queue, max_backlog=10)
        p = Producer({"bootstrap.servers": bootstrap})
        p.produce(svc.queue, None, b"k", partition=0)
        p.flush(10)
        got = [m for m in drain(sub, 10, timeout=3) if m.key == b"k"]
        assert got and got[0].value is None and got[0].data is None
        got[0].ack()


def allow_large_records(bootstrap: str, topic: str, size: int) -> None:
    """Apache Kafka refuses records over 1 MB unless the topic allows more (the embedded
    broker has no such limit, and ignores topic configs)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    resource = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
        "max.message.bytes", str(size), incremental_operation=AlterConfigOpType.SET)])
    admin = clients.admin(bootstrap)  # kept until the answer came: a freed handle drops it
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


def test_a_5mb_message_is_dead_lettered_as_too_large_and_the_log_says_so(
        bootstrap, broker_kind, svc, caplog):
    if broker_kind != "embedded":
        allow_large_records(bootstrap, svc.queue, 10_000_000)
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000})
    p.produce(svc.queue, b"x" * 5_000_000, partition=0)
    assert p.flush(30) == 0
    dead = wait_for(lambda: [r for r in read_topic(bootstrap, svc.dlq, 100, timeout=2)
                             if dict(r.headers())["kq-reason"] == b"too-large"],
                    timeout=20, what="the too-large dead letter")
    assert dead[0].value() is None
    assert dict(dead[0].headers())["kq-original-size"] == b"5000000"
    said = [r.getMessage() for r in caplog.records if "larger than the largest" in r.getMessage()]
    assert said and svc.queue in said[0] and f"dead-lettered to {svc.dlq}" in said[0]
    still_serving(bootstrap, svc)


HOLDER = """
import sys, time
from broker.client import QueueClient
c = QueueClient(sys.argv[1], name=sys.argv[4], topic_prefix=sys.argv[2])
sub = c.subscribe(sys.argv[3], max_backlog=10)
for m in sub.messages(timeout=60):
    print(m.bookmark, flush=True)
"""


def test_a_delivery_topic_deleted_under_a_live_subscription(bootstrap, svc):
    """The subscriber runs in its own process: librdkafka may crash in a consumer whose topic
    is deleted (confluentinc/librdkafka#4778, seen here on the embedded broker). Whatever
    becomes of it, the service keeps serving and the subscriber's leases come back."""
    name = f"doomed-{uid()}"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, bootstrap, svc.prefix, svc.queue,
                               name], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: any(s.client == name for s in svc.engine.subs.values()), 10,
                 "the doomed subscription")
        (bm,) = publish(bootstrap, svc.queue, [b'{"held": "by the doomed one"}'])
        assert holder.stdout.readline().strip() == bm
        admin = clients.admin(bootstrap)
        for f in admin.delete_topics([f"{svc.prefix}.deliver.{name}"],
                                     operation_timeout=10).values():
            f.result()
        still_serving(bootstrap, svc)
        # the held message comes back: on the lapse of its lease (2 s), or of the holder's
        # heartbeats (3 s) if the holder died (on the embedded broker it may; on Apache
        # Kafka it lives on and the message may be leased to it again)
        held = Bookmark.parse(bm)
        wait_for(lambda: (msg := svc.engine.queues[svc.queue].messages.get(held)) is None
                 or msg.delivery_count >= 2, 10, "the held message's lease to lapse")
        holder.kill()
        if held in svc.engine.queues[svc.queue].messages:  # not taken and acked meanwhile
            with client(bootstrap, svc) as other:
                sub = other.subscribe(svc.queue, max_backlog=10)
                m = receive(sub, bm, timeout=10)
                assert m.delivery_count >= 2
                m.ack()
    finally:
        holder.kill()
        holder.wait()


def test_the_broker_restarting_empty_under_the_service_stops_it_cleanly(tmp_path):
    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    bootstrap = broker.bootstrap_servers
    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state", bootstrap)
    log = tmp_path / "serve.log"
    with open(log, "a") as out:
        proc = subprocess.Popen([*KQ, "serve", "--config", str(cfg)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "ready:" in log.read_text(), 30, "kq serve")
        publish(bootstrap, "Q", [b'{"n": %d}' % i for i in range(5)])
        wait_for(lambda: json.loads(kq("queues", "--config", str(cfg), "--json").stdout
                                    or "[{}]")[0].get("enqueued") == 5, 20, "five journaled")
        broker.kill()  # the broker dies and comes back empty
        broker = EmbeddedBroker(port=port).start()
        publish(bootstrap, "Q", [b'{"n": "again"}'])
        assert proc.wait(60) == 1
        text = log.read_text()
        # it notices either by the journal going back, or by its writes no longer being
        # acknowledged (the restarted broker does not know its idempotent producer)
        assert "Kafka lost data" in text or "producing journal failed" in text
        assert "Traceback" not in text
        # and the local state is refused, not silently reused, on the next start
        again = subprocess.run([*KQ, "serve", "--config", str(cfg)], cwd=ROOT, timeout=60,
                               capture_output=True, text=True)
        assert again.returncode == 1 and "Kafka lost data" in again.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        broker.stop(timeout=0)


def test_with_kafka_gone_a_stop_is_prompt_and_nothing_is_taken_for_a_freeze(tmp_path):
    """Kafka away: the service keeps turning (no listing of topics holds it up, so no
    false "loop did not turn" alarm), and SIGTERM ends it in seconds, not a row of Kafka
    timeouts that could outlast an orchestrator's grace period."""
    broker = EmbeddedBroker(port=free_port()).start()
    bootstrap = broker.bootstrap_servers
    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q0", "Q1"], tmp_path / "state",
                       bootstrap, service="shards = 2")
    cfg.write_text(cfg.read_text().replace('name = "Q1"', 'name = "Q1"\nshard = 1'))
    log = tmp_path / "serve.log"
    with open(log, "a") as out:
        proc = subprocess.Popen([*KQ, "serve", "--config", str(cfg)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: log.read_text().count("ready:") == 2, 30, "both shards")
        publish(bootstrap, "Q0", [b'{"n": 1}'])
        broker.kill()
        wait_for(lambda: "could not list" in log.read_text(), 30,
                 "the service meeting Kafka's absence")
        started = time.monotonic()
        proc.terminate()
        assert proc.wait(60) == 0
        took = time.monotonic() - started
        text = log.read_text()
        assert took < 8, f"stopping took {took:.1f} s"
        assert "did not turn" not in text and "Traceback" not in text
        # said once by each that lists them (the instance and its two shards), not on
        assert text.count("could not list Kafka's topics") <= 3
    finally:
        if proc.poll() is None:
            proc.kill()
        broker.stop(timeout=0)
