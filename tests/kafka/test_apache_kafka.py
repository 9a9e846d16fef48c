"""kq on Apache Kafka: the integration suite, and the transaction isolation `exactly_once`
relies on (the embedded broker shows aborted records to every reader)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.kafka import why_not_here

# At module level, so that a machine without Docker lists the reason once, not once per test.
_REASON = why_not_here()
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition  # noqa: E402

from broker.kafka import clients  # noqa: E402
from tests.integration.kit import ROOT, ensure_topic, uid  # noqa: E402

# The first test to ask for the container waits for it: an image pull, then Kafka's start.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.mark.timeout(1800)
def test_the_integration_suite_passes_on_apache_kafka(kafka_bootstrap):
    # A subprocess: tests/conftest.py picks the broker once per session, from KQ_TEST_BOOTSTRAP.
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration", "-q", "-x", "-p", "no:cacheprovider"],
        cwd=ROOT, env={**os.environ, "KQ_TEST_BOOTSTRAP": kafka_bootstrap},
        capture_output=True, text=True, timeout=1700)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]


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

