"""Fencing by the broker: with `exactly_once`, each shard's producer has the transactional id
PREFIX.shard.K, so a new owner's start makes the broker refuse every later write of the old
one. The embedded broker does this (it does not isolate transactions, but it fences)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException

from broker import wire
from broker.engine.engine import Engine
from broker.errors import FencedError
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from broker.service.commit import Committer
from broker.service.sending import FENCED
from broker.state.store import MemoryStore
from tests.integration.kit import ensure_topic, uid


def _owner(bootstrap: str, journal: str) -> Committer:
    producer = clients.service_producer(bootstrap, None, f"{journal}.shard.0")
    return Committer(producer, MemoryStore(), Engine([]), journal, next_batch=0,
                     transactional=True)


def _journal(bootstrap: str, topic: str) -> list[str]:
    c = clients.consumer(bootstrap)
    try:
        (lo, end), = real_ends(c, [(topic, 0)]).values()
        return [wire.decode("journal", r.value())["marker"]
                for r in records(c, topic, 0, lo, end)]
    finally:
        c.close()


def test_an_old_owner_writes_nothing_once_a_new_one_started(bootstrap):
    journal = f"kq{uid()}.journal"
    ensure_topic(bootstrap, journal, partitions=1)
    old = _owner(bootstrap, journal)
    old.write_marker("old")
    new = _owner(bootstrap, journal)  # its producer's start fences the old one
    with pytest.raises(FencedError, match="Kafka fenced this instance's producer"):
        old.write_marker("old, woken")
    new.write_marker("new")
    with pytest.raises(FencedError):
        old.write_marker("old, again")
    assert _journal(bootstrap, journal) == ["old", "new"]


def test_a_fenced_producer_says_so_again_when_asked_to_abort(bootstrap):
    # how the committer names a fenced flush that confluent-kafka reported as a bare
    # SystemError (broker.service.sending)
    topic = f"kq{uid()}.fenced"
    ensure_topic(bootstrap, topic, partitions=1)
    old = clients.service_producer(bootstrap, None, f"{topic}.shard.0")
    clients.service_producer(bootstrap, None, f"{topic}.shard.0")
    old.begin_transaction()
    old.produce(topic, b"late")
    with pytest.raises((KafkaException, SystemError)):
        old.flush(10)
    with pytest.raises(KafkaException) as asked:
        old.abort_transaction(5)
    assert asked.value.args[0].fatal() and asked.value.args[0].code() in FENCED
