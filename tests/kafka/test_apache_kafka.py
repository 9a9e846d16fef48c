"""The transaction isolation `exactly_once` relies on, on Apache Kafka (the embedded broker
shows aborted records to every reader)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from broker import wire
from broker.client import QueueClient
from broker.engine.transitions import Kind
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from broker.service.journal import transitions_in
from tests.integration.kit import (
    KQ,
    ROOT,
    ServeProcess,
    drain,
    ensure_topic,
    kq,
    publish,
    uid,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def read_until(bootstrap: str, topic: str, last: bytes, **settings: Any) -> list[bytes]:
    """Every value of the topic's partition 0 from the start, up to and including `last`."""
    reader = clients.consumer(bootstrap, **settings)
    reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while not seen or seen[-1] != last:
            assert time.monotonic() < deadline, f"{last!r} not read within 30 s; read {seen}"
            msg = reader.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append(msg.value())
    finally:
        reader.close()
    return seen


def test_a_read_committed_reader_never_sees_an_aborted_transaction(kafka_bootstrap):
    topic = f"eos-{uid()}"
    ensure_topic(kafka_bootstrap, topic)
    # kq's own factories: the producer of `exactly_once = true`, and the reader settings of
    # recovery, the client and dead-letter consumers (librdkafka's default read_committed)
    producer = clients.service_producer(kafka_bootstrap, None, f"kq-test-{uid()}")
    producer.begin_transaction()
    for n in range(3):
        producer.produce(topic, b"aborted-%d" % n)
    producer.flush(10)  # in the log before the abort, as a crash mid-commit leaves them
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(10)

    assert read_until(kafka_bootstrap, topic, b"committed") == [b"committed"]
    # the aborted records are there all the same: only isolation hides them
    everything = read_until(kafka_bootstrap, topic, b"committed",
                            **{"isolation.level": "read_uncommitted"})
    assert everything == [b"aborted-0", b"aborted-1", b"aborted-2", b"committed"]


def test_a_second_service_producer_fences_the_first(kafka_bootstrap):
    # A takeover starts a producer with the shard's transactional id; the old owner (a zombie
    # that wakes up) must then fail to commit, not write beside the new one.
    topic, tid = f"eos-{uid()}", f"kq-test-{uid()}"
    ensure_topic(kafka_bootstrap, topic)
    zombie = clients.service_producer(kafka_bootstrap, None, tid)
    clients.service_producer(kafka_bootstrap, None, tid)
    with pytest.raises(KafkaException):
        zombie.begin_transaction()
        zombie.produce(topic, b"from the zombie")
        zombie.commit_transaction(10)



# -- what the embedded broker hid: it creates topics with their leaders at once and accepts
# any group session timeout ---------------------------------------------------------------


def test_a_topic_just_created_is_read_and_written_at_once(kafka_bootstrap):
    # Apache Kafka answers "not leader" / "unknown partition" for a moment after it created
    # a topic: kq serve crashed at start about one time in ten reading its new status topic
    admin = clients.admin(kafka_bootstrap)
    reader = clients.consumer(kafka_bootstrap)
    producer = clients.producer(kafka_bootstrap)
    try:
        for n in range(15):
            topic = f"fresh-{uid()}-{n}"
            clients.ensure_topics(admin, [topic], partitions=4)
            assert [clients.watermarks(reader, topic, p, kafka_bootstrap)
                    for p in range(4)] == [(0, 0)] * 4
            producer.produce(topic, b"first", partition=3)
            assert producer.flush(10) == 0
    finally:
        reader.close()


def test_kqs_busiest_topics_are_made_with_small_segment_indexes(kafka_bootstrap, tmp_path):
    # A new segment's index of 10 MiB (Kafka's default) held the partition's writer for
    # 25-180 ms when first written on this machine: a new worker's delivery topic held back
    # every produce of the service (one connection's requests are answered in turn)
    u = uid()
    cfg = write_config(tmp_path / "kq.toml", f"kqi{u}", [f"I_{u}"], tmp_path / "state",
                       kafka_bootstrap)
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        with QueueClient(kafka_bootstrap, name=f"w{u}", topic_prefix=f"kqi{u}"):
            admin = clients.admin(kafka_bootstrap)
            for topic in (f"kqi{u}.journal", f"kqi{u}.commands", f"kqi{u}.flow",
                          f"kqi{u}.instances", f"kqi{u}.deliver.w{u}"):
                resource = ConfigResource(ResourceType.TOPIC, topic)
                got = admin.describe_configs([resource])[resource].result(10)
                assert {k: got[k].value for k in clients.SMALL_INDEXES} == \
                    clients.SMALL_INDEXES, topic
    finally:
        assert serve.stop() == 0


def test_serve_starts_every_time_on_a_prefix_nobody_used(kafka_bootstrap, tmp_path):
    for n in range(6):  # each start creates its topics, then reads them at once
        u = uid()
        cfg = write_config(tmp_path / f"kq{n}.toml", f"kqf{u}", [f"F_{u}"],
                           tmp_path / f"state{n}", kafka_bootstrap)
        serve = ServeProcess(cfg, tmp_path / f"serve{n}.log").start()
        assert serve.stop() == 0, (tmp_path / f"serve{n}.log").read_text()


def test_a_session_timeout_the_broker_refuses_stops_the_start_naming_the_key(
        kafka_bootstrap, tmp_path):
    # kq's Apache Kafka accepts sessions from 1 s (a stock broker: 6 s); below, kq serve
    # waited for ever at "joining group"
    u = uid()
    cfg = write_config(tmp_path / "kq.toml", f"kqs{u}", [f"S_{u}"], tmp_path / "state",
                       kafka_bootstrap, service='session_timeout = "500ms"')
    started = time.monotonic()
    run = kq("serve", "--config", str(cfg), timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    said = " ".join((run.stdout + run.stderr).split())
    assert 'session_timeout = "500ms"' in said
    assert "from 1s to 30m" in said  # what the broker accepts, read from it
    assert time.monotonic() - started < 30


def values_of(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every value of the topic's partition 0, as a reader with this isolation level sees it."""
    reader = clients.consumer(bootstrap, **{"isolation.level": isolation})
    try:
        (lo, end), = real_ends(reader, [(topic, 0)]).values()
        return [rec.value() for rec in records(reader, topic, 0, lo, end)]
    finally:
        reader.close()


def leases_of(values: list[bytes], bookmark: str) -> int:
    parts = [wire.decode("journal", v) for v in values]
    return sum(1 for p in parts for t in transitions_in(p)
               if t.kind is Kind.LEASED and str(t.bookmark) == bookmark)


def deliveries_of(values: list[bytes], bookmark: str) -> int:
    envelopes = [wire.decode("envelope", v) for v in values]
    return sum(e["batch"]["bookmarks"].split("\n").count(bookmark) for e in envelopes
               if e["kind"] == "messages")


def test_a_crash_inside_an_exactly_once_commit_leaves_nothing_committed_readers_see(
        kafka_bootstrap, tmp_path):
    # exactly_once = true: a batch's journal part is written in a Kafka transaction. kill -9
    # after it was flushed, before the commit: the restart's producer fences the dead one and
    # its transaction is aborted. Recovery and every read_committed reader see the lease
    # once (the one made after the restart); the aborted part stays in the log.
    u = uid()
    name, prefix, client = f"X_{u}", f"kq{u}", f"w-{u}"
    ensure_topic(kafka_bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", prefix, [name], tmp_path / "state",
                       kafka_bootstrap, extra='lease_period = "1h"\n',
                       service="exactly_once = true")
    serve = ServeProcess(cfg, tmp_path / "serve.log")
    serve.start(KQ_CRASH_AFTER_STEP="2", KQ_CRASH_ON_KIND="leased", KQ_CRASH_BEFORE_COMMIT="1")
    with QueueClient(kafka_bootstrap, topic_prefix=prefix, name=client) as c:
        sub = c.subscribe(name)
        (bm,) = publish(kafka_bootstrap, name, [b'{"n": 1}'])
        assert serve.wait_exit() == -9  # killed inside the transaction
        serve.start()
        try:
            (msg,) = drain(sub, 1, timeout=30)
            assert (msg.bookmark, msg.delivery_count) == (bm, 1)
            msg.ack()
            c.flush()
        finally:
            serve.stop()
    journal, deliver = f"{prefix}.journal", f"{prefix}.deliver.{client}"
    assert leases_of(values_of(kafka_bootstrap, journal, "read_committed"), bm) == 1
    assert leases_of(values_of(kafka_bootstrap, journal, "read_uncommitted"), bm) == 2
    # the dead batch's delivery never went out: the client got the lease once
    assert deliveries_of(values_of(kafka_bootstrap, deliver, "read_uncommitted"), bm) == 1


def test_kq_broker_apache_serves_and_leaves_nothing_behind_when_its_owner_is_killed(tmp_path):
    from broker.kafka.embedded import free_port, port_open
    from tests.conftest import why_no_apache

    if why_no_apache():
        pytest.skip(why_no_apache())
    port = free_port()
    broker = subprocess.Popen([*KQ, "broker", "--apache", "--port", str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "COLUMNS": "200"})
    try:
        assert broker.stdout is not None
        said = ""
        while "listening at" not in said and broker.poll() is None:  # after "fetching..."
            said = broker.stdout.readline()
        assert f"listening at 127.0.0.1:{port}" in said, said
        data = Path(said.split("data in ")[1].split(",")[0])
        assert data.is_dir()
        topic = f"owned-{uid()}"
        ensure_topic(f"127.0.0.1:{port}", topic)  # it serves clients
    finally:
        broker.kill()  # kill -9 of `kq broker --apache`: the guard stops the JVM
        broker.wait()
    deadline = time.monotonic() + 30
    while (port_open("127.0.0.1", port) or data.exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not port_open("127.0.0.1", port), "Apache Kafka outlived its owner"
    assert not data.exists(), "its data directory was left behind"


def test_an_idle_subscriber_costs_kafka_few_requests_and_still_gets_a_message_at_once(
        kafka_bootstrap, tmp_path, monkeypatch):
    """Apache Kafka answers a fetch as soon as a record arrives, so the client's consumer may
    wait long per fetch: idle, it sends a few requests a second instead of 200, and a
    message published then still reaches it within milliseconds."""
    from broker.kafka import stats
    from tests.integration.kit import serving_one_queue

    monkeypatch.setenv(stats.ENV, str(tmp_path / "counted"))
    with serving_one_queue(kafka_bootstrap, tmp_path, "IDLE") as (name, _, prefix, _serve), \
            QueueClient(kafka_bootstrap, topic_prefix=prefix, name=f"w{uid()}") as c:
        sub = c.subscribe(name, max_backlog=10)
        waits = []
        for i in range(5):
            assert not drain(sub, 0, timeout=1.5)  # idle a while: nothing to read
            sent = time.time()
            publish(kafka_bootstrap, name, [b'{"n": %d}' % i])
            (m,) = drain(sub, 1)
            waits.append(time.time() - sent)
            m.ack()
        before = stats.read(tmp_path / "counted")
        time.sleep(3)  # idle: only fetches that come back empty
        idle = stats.difference(stats.read(tmp_path / "counted"), before)
    fetches = idle["requests"].get("Fetch", 0)
    # five long-lived consumers (the client's, the service's inputs, commands, status and
    # group): about 10 fetches a second each; with 5 ms waits it was over 2,000 in 3 s
    assert fetches < 300, f"{fetches} fetch requests in 3 s idle (client and service)"
    assert sorted(waits)[2] < 0.1, f"publish -> delivery took {waits} s"


def test_the_brokers_collector_pauses_are_logged_for_the_bench(kafka_bootstrap):
    """`kq broker --apache` logs each pause of its JVM's collector, and the bench reads them
    (`paced_broker_gc`): a pause the test forces is found in its window."""
    import shutil
    import sys

    sys.path.insert(0, str(ROOT))
    from ops.bench import broker_pid
    from ops.broker_gc import broker_gc, gc_log_of

    pid = broker_pid(kafka_bootstrap)
    assert pid is not None and gc_log_of(pid) is not None, "the broker keeps no GC log"
    jcmd = shutil.which("jcmd")
    assert jcmd, "jcmd (Java 17's JDK) not on PATH"
    since = time.time()
    subprocess.run([jcmd, str(pid), "GC.run"], check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 10  # (the JVM writes its log line as the pause ends)
    while (found := broker_gc(pid, since)) is not None and not found["pauses"]:
        assert time.monotonic() < deadline, "the forced pause was not logged within 10 s"
        time.sleep(0.1)
    assert found is not None and found["pauses"] >= 1 and found["longest_ms"] > 0
