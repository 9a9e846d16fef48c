"""Topic creation with settings for speed only: applied where the broker takes them, dropped
(never failing the start) where it refuses them; any other refusal still stops the caller."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.kafka import clients


class FakeAdmin:
    """Just enough of an AdminClient: topics it holds, and settings it refuses."""

    def __init__(self, refuses: set[str] = frozenset(), existing: dict[str, dict] | None = None,
                 fails_with: int | None = None) -> None:
        self.topics: dict[str, dict[str, str]] = dict(existing or {})
        self.refuses = refuses
        self.fails_with = fails_with
        self.asked: list[dict[str, str]] = []

    def create_topics(self, new_topics, operation_timeout):
        out = {}
        for t in new_topics:
            self.asked.append(dict(t.config))
            f: Future = Future()
            if self.fails_with == KafkaError.TOPIC_ALREADY_EXISTS:
                self.topics.setdefault(t.topic, {})  # made meanwhile by another client
            if self.fails_with is not None:
                f.set_exception(KafkaException(KafkaError(self.fails_with)))
            elif set(t.config) & self.refuses:
                f.set_exception(KafkaException(KafkaError(KafkaError.INVALID_CONFIG)))
            else:
                self.topics[t.topic] = dict(t.config)
                f.set_result(None)
            out[t.topic] = f
        return out

    def list_topics(self, topic=None, timeout=None):
        part = SimpleNamespace(leader=1, error=None)
        return SimpleNamespace(topics={n: SimpleNamespace(error=None, partitions={0: part})
                                       for n in self.topics if topic in (None, n)})


def test_a_topic_gets_the_tuning_and_its_own_settings_where_the_broker_takes_them():
    admin = FakeAdmin()
    clients.ensure_topics(admin, ["kq.journal"], config={"retention.ms": "1000"},
                          tuning=clients.SMALL_INDEXES)
    assert admin.topics["kq.journal"] == {**clients.SMALL_INDEXES, "retention.ms": "1000"}


def test_a_broker_refusing_the_tuning_gets_the_topic_without_it_and_says_so(caplog):
    admin = FakeAdmin(refuses={"segment.index.bytes"})
    with caplog.at_level(logging.INFO, logger="kq.kafka"):
        clients.ensure_topics(admin, ["kq.deliver.w1"], config={"retention.ms": "1000"},
                              tuning=clients.SMALL_INDEXES)
    assert admin.topics["kq.deliver.w1"] == {"retention.ms": "1000"}
    assert "kq.deliver.w1" in caplog.text and "segment.index.bytes=65536" in caplog.text


def test_a_refused_setting_the_caller_needs_still_stops_it():
    admin = FakeAdmin(refuses={"retention.ms"})
    with pytest.raises(KafkaException):
        clients.ensure_topics(admin, ["kq.journal"], config={"retention.ms": "1000"},
                              tuning=clients.SMALL_INDEXES)
    with pytest.raises(KafkaException):
        clients.ensure_topics(FakeAdmin(refuses={"retention.ms"}), ["kq.journal"],
                              config={"retention.ms": "1000"})


def test_other_refusals_raise_and_an_existing_topic_is_left_alone():
    with pytest.raises(KafkaException):
        clients.ensure_topics(FakeAdmin(fails_with=KafkaError.CLUSTER_AUTHORIZATION_FAILED),
                              ["kq.deliver.w1"], tuning=clients.SMALL_INDEXES)
    admin = FakeAdmin(existing={"kq.deliver.w1": {}})
    clients.ensure_topics(admin, ["kq.deliver.w1"], tuning=clients.SMALL_INDEXES)
    assert admin.asked == [] and admin.topics["kq.deliver.w1"] == {}
    racing = FakeAdmin(fails_with=KafkaError.TOPIC_ALREADY_EXISTS)
    clients.ensure_topics(racing, ["kq.deliver.w1"], tuning=clients.SMALL_INDEXES)
    assert racing.topics == {"kq.deliver.w1": {}}
