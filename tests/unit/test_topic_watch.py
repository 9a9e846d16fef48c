"""TopicWatch: Kafka's topics listed off the caller's thread, and kq's own topics vanishing
noticed (no Kafka: a stand-in admin client)."""

import logging
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.errors import StateError
from broker.service.topics import TopicWatch


class StandInAdmin:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics
        self.answering = threading.Event()
        self.answering.set()
        self.down = False

    def list_topics(self, timeout: float) -> SimpleNamespace:
        if self.down or not self.answering.wait(timeout):
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        return SimpleNamespace(topics={
            name: SimpleNamespace(partitions=dict.fromkeys(range(n)), error=None)
            for name, n in self.topics.items()})


def first_listing(watch: TopicWatch, within_s: float = 5.0) -> dict | None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        listed = watch.latest()
        if listed is not None:
            return listed
        time.sleep(0.01)
    return None


def test_a_listing_kafka_is_slow_to_answer_never_holds_up_the_caller():
    admin = StandInAdmin({"kq.journal": 2, "orders": 4})
    admin.answering.clear()  # Kafka takes its time
    watch = TopicWatch(admin, {"kq.journal"}, every_s=0, timeout_s=30)
    started = time.monotonic()
    for _ in range(100):
        assert watch.latest() is None
    assert time.monotonic() - started < 1  # a blocking listing would take 30 s
    admin.answering.set()
    assert first_listing(watch) == {"kq.journal": 2, "orders": 4}


def test_kq_topics_missing_from_two_listings_in_a_row_mean_kafka_lost_data():
    admin = StandInAdmin({"kq.journal": 1})
    watch = TopicWatch(admin, {"kq.journal", "kq.commands"}, every_s=0)
    assert watch.now() == {"kq.journal": 1}  # once: a broker may not know it yet
    admin.topics["kq.commands"] = 1
    assert watch.now() is not None  # back: the count starts again
    del admin.topics["kq.commands"]
    watch.now()
    with pytest.raises(StateError, match="kq.commands are gone from Kafka"):
        watch.now()


def test_kafka_away_is_said_once_and_its_return_too(caplog):
    admin = StandInAdmin({"kq.journal": 1})
    admin.down = True
    watch = TopicWatch(admin, {"kq.journal"}, every_s=0)
    with caplog.at_level(logging.DEBUG, logger="kq.topics"):
        assert [watch.now() for _ in range(3)] == [None, None, None]
        admin.down = False
        assert watch.now() == {"kq.journal": 1}
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [m for level, m in said if level == logging.WARNING] == [
        "could not list Kafka's topics (trying again every 0 s): "
        "KafkaError{code=_TRANSPORT,val=-195,str=\"Broker transport failure\"}"]
    assert said[-1] == (logging.INFO, "Kafka lists its topics again")
