"""`kq journal grep BOOKMARK` asks Kafka what it has before it fetches: a fetch of a record
that is not there waits out its whole timeout (10 s), so a wrong topic or partition must be
named without one, and an offset past the end fetched only briefly (some brokers report an
end below the last records of a batch). Kafka faked: the timeouts are what is checked."""

from types import SimpleNamespace

import pytest

from broker.values import Bookmark
from cli import journal


@pytest.fixture
def kafka(monkeypatch):
    fetches: list[float] = []

    def fetch(_consumer, bookmarks, timeout):
        fetches.append(timeout)
        return {}

    monkeypatch.setattr(journal.clients, "admin", lambda *_: None)
    monkeypatch.setattr(journal.clients, "topic_partitions", lambda _admin: {"T": 2})
    monkeypatch.setattr(journal.clients, "watermarks", lambda *_: (5, 10))
    monkeypatch.setattr(journal, "fetch_records", fetch)
    return fetches


SOURCE = SimpleNamespace(bootstrap="x:1", kafka={})


@pytest.mark.parametrize("bookmark, said", [
    ("NOPE/0/0", "there is no topic NOPE"),
    ("T/2/0", "T has 2 partition(s), numbered from 0"),
    ("T/1/4", "deleted by retention: T/1 holds offsets from 5"),
])
def test_a_record_kafka_cannot_have_is_named_without_a_fetch(kafka, bookmark, said):
    assert journal._fetch_one(Bookmark.parse(bookmark), SOURCE, None) == (None, said)
    assert kafka == []


def test_past_the_end_is_looked_for_briefly_then_named(kafka):
    found = journal._fetch_one(Bookmark.parse("T/0/99"), SOURCE, None)
    assert found == (None, "past the end of T/0: its next offset is 10")
    assert kafka == [2]


def test_a_record_within_the_offsets_gets_the_whole_fetch(kafka):
    assert journal._fetch_one(Bookmark.parse("T/0/7"), SOURCE, None) == (None, None)
    assert kafka == [10]
