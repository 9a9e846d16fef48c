"""The Qpid Broker-J queue types end to end: the real service, broker and client."""

import json
import signal
import time

import pytest

from broker.client import QueueClient
from tests.integration.kit import drain, kq, publish, serving_one_queue, wait_for

pytestmark = pytest.mark.integration


def enqueued(cfg) -> int:
    return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]["enqueued"]


def test_a_priority_levels_queue_delivers_by_the_kq_priority_header_across_a_kill(
        bootstrap, tmp_path):
    """Qpid's priority queue: JMS priorities 0-9 in the kq-priority header, two levels
    (0-4 low, 5-9 high), oldest first within a level; the levels survive kill -9."""
    with serving_one_queue(bootstrap, tmp_path, "LEVELS",
                           'priority_levels = 2\nlease_period = "1h"\n') as (name, cfg, prefix,
                                                                          serve):
        sent = {}
        for label, prio in (("low-a", b"1"), ("high-a", b"9"), ("none", None),
                            ("high-b", b"5"), ("low-b", b"4")):
            headers = [("kq-priority", prio)] if prio is not None else []
            (sent[label],) = publish(bootstrap, name, [json.dumps({"l": label}).encode()],
                                     key=b"k", headers=headers)  # one key: in this order
        wait_for(lambda: enqueued(cfg) == 5, what="all five enqueued")
        serve.proc.send_signal(signal.SIGKILL)
        serve.wait_exit()
        serve.start()  # the levels come back from RocksDB (journaled with each arrival)
        rows = json.loads(kq("inspect", name, "--config", str(cfg), "--json").stdout)
        assert {m["bookmark"]: m["priority"] for m in rows["messages"]} == {
            sent["low-a"]: 0, sent["high-a"]: 1, sent["none"]: 0, sent["high-b"]: 1,
            sent["low-b"]: 0}
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            got = drain(c.subscribe(name, max_backlog=10), 5)
        assert [m.data["l"] for m in got] == ["high-a", "high-b", "low-a", "none", "low-b"]


def test_a_nondestructive_queue_shows_every_subscriber_everything_and_keeps_it(
        bootstrap, tmp_path):
    """Qpid's non-destructive queue: every subscription browses (whatever mode it asked
    for); messages stay until they expire."""
    with serving_one_queue(bootstrap, tmp_path, "ND", 'nondestructive = true\n'
                           'expiration = "1h"\n') as (name, cfg, prefix, _):
        sent = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}'], key=b"k")
        wait_for(lambda: enqueued(cfg) == 2, what="both enqueued")
        with QueueClient(bootstrap, name="one", topic_prefix=prefix) as a, \
                QueueClient(bootstrap, name="two", topic_prefix=prefix) as b:
            sub_a = a.subscribe(name, max_backlog=1)  # asks to consume
            assert sub_a.mode == "browse"
            got_a = drain(sub_a, 2)
            got_b = drain(b.subscribe(name, max_backlog=1), 2)
            assert [m.bookmark for m in got_a] == [m.bookmark for m in got_b] == sent
            assert all(m.lease_deadline is None for m in got_a)
            for m in got_a:
                m.ack()  # a copy: nothing to ack, and nothing is
            a.flush()
        row = json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]
        assert (row["depth"], row["acked"]) == (2, 0)


def test_a_message_leaves_on_its_kq_expiration_header_even_across_a_kill(bootstrap, tmp_path):
    """TTL: kq-expiration (ms from the record's timestamp) on a queue with no expiration of
    its own; max_ttl bounds the ones without; both are kept across kill -9."""
    with serving_one_queue(bootstrap, tmp_path, "TTL", 'max_ttl = "1h"\n'
                           'dead_letter_topic = "TTL_DLQ"\n') as (name, cfg, prefix, serve):
        short = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}'], key=b"k",
                        headers=[("kq-expiration", b"3000")])
        (kept,) = publish(bootstrap, name, [b'{"n": 3}'], key=b"k")  # max_ttl: an hour
        wait_for(lambda: enqueued(cfg) == 3, what="all three enqueued")
        serve.proc.send_signal(signal.SIGKILL)
        serve.wait_exit()
        serve.start()  # each one's expiry comes back from RocksDB

        def row() -> dict:
            return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]
        wait_for(lambda: row()["removed"].get("expired") == 2, timeout=20,
                 what="the two with kq-expiration expired")
        assert (row()["depth"], row()["dead_lettered"]) == (1, 2)
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            (m,) = drain(c.subscribe(name, max_backlog=5), 1)
        assert m.bookmark == kept and m.bookmark not in short


def test_an_avro_queue_filters_orders_and_decodes_with_its_schema(bootstrap, tmp_path):
    """format = "avro": payloads are Avro binary of the queue's schema; expressions read
    their fields, and the client decodes msg.data with the schema the service sends it."""
    import io

    import fastavro

    schema = {"type": "record", "name": "Trade", "fields": [
        {"name": "sym", "type": "string"}, {"name": "urgency", "type": "int"}]}
    path = tmp_path / "trade.avsc"
    path.write_text(json.dumps(schema))

    def avro(record: dict) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
        return out.getvalue()

    with serving_one_queue(bootstrap, tmp_path, "AV", f'format = "avro"\nschema = "{path}"\n'
                           'priority = "/urgency"\n') as (name, cfg, prefix, _):
        publish(bootstrap, name, [avro({"sym": "IBM", "urgency": 1}),
                                  avro({"sym": "MSFT", "urgency": 9}),
                                  b"not avro at all",
                                  avro({"sym": "IBM", "urgency": 5})], key=b"k")
        wait_for(lambda: enqueued(cfg) == 4, what="all four enqueued")
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            got = drain(c.subscribe(name, filter="/sym = 'IBM'", max_backlog=5), 2)
        assert [m.data for m in got] == [{"sym": "IBM", "urgency": 5},
                                         {"sym": "IBM", "urgency": 1}]


def test_held_and_delayed_messages_wait_their_time_without_blocking_across_a_kill(
        bootstrap, tmp_path):
    """Hold until (kq-not-before with hold_on_publish) and redelivery delay: a held message
    is shown as held, survives kill -9 held, and is delivered only when due; the message
    behind it is not blocked; a cancelled one comes back after the queue's delay, or after
    the one msg.cancel(delay=...) asks for."""
    with serving_one_queue(bootstrap, tmp_path, "HOLD", 'hold_on_publish = true\n'
                           'redelivery_delay = "2s"\nlease_period = "1h"\n') as (
                               name, cfg, prefix, serve):
        due = int(time.time() * 1000) + 6_000
        (held,) = publish(bootstrap, name, [b'{"n": 1}'], key=b"k",
                          headers=[("kq-not-before", str(due).encode())])
        (free,) = publish(bootstrap, name, [b'{"n": 2}'], key=b"k")
        wait_for(lambda: enqueued(cfg) == 2, what="both enqueued")
        serve.proc.send_signal(signal.SIGKILL)
        serve.wait_exit()
        serve.start()  # the moment comes back from RocksDB
        rows = json.loads(kq("inspect", name, "--config", str(cfg), "--json").stdout)
        assert {m["bookmark"]: (m["state"], m["not_before_ms"]) for m in rows["messages"]} == {
            held: ("held", due), free: ("available", None)}
        assert rows["summary"]["held"] == 1
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            sub = c.subscribe(name, max_backlog=5)
            (first,) = drain(sub, 1)
            assert first.bookmark == free  # not blocked by the held one
            cancelled = time.time()
            first.cancel()  # redelivery_delay: 2 s
            got = {m.bookmark: (m, time.time()) for m in drain(sub, 2, timeout=20)}
            assert set(got) == {held, free}
            assert got[held][1] * 1000 >= due  # never early
            assert got[free][1] - cancelled >= 2.0 and got[free][0].delivery_count == 2
            again = time.time()
            got[held][0].cancel(delay="1500ms")  # this one's own delay
            (back,) = drain(sub, 1)
            assert back.bookmark == held and time.time() - again >= 1.5
