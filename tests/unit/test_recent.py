"""The latest arrivals' payloads are delivered from memory (broker.service.recent): within a
byte budget, the oldest dropped first; what is not there still comes from the store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from broker.service.recent import ENTRY_OVERHEAD, RecentPayloads
from broker.state.layout import Payload, payload_key
from broker.values import Bookmark

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))

import bench_cpu  # noqa: E402


def bm(offset: int) -> Bookmark:
    return Bookmark("T", 0, offset)


def test_the_latest_payloads_are_kept_within_the_budget_the_oldest_dropped_first():
    recent = RecentPayloads(budget=3 * (10 + ENTRY_OVERHEAD))
    for i in range(5):
        recent.add(bm(i), b"%010d" % i)
    assert [recent.get(bm(i)) for i in range(5)] == [None, None, b"0000000002",
                                                     b"0000000003", b"0000000004"]
    assert len(recent) == 3


def test_a_record_read_again_is_kept_once():
    recent = RecentPayloads(budget=2 * (10 + ENTRY_OVERHEAD))
    recent.add(bm(0), b"a" * 10)
    recent.add(bm(1), b"b" * 10)
    recent.add(bm(0), b"a" * 10)  # read again (a rewind): the same record, not a second entry
    assert len(recent) == 2 and recent.get(bm(1)) == b"b" * 10
    recent.add(bm(2), b"c" * 10)  # room made by the oldest, 0
    assert (recent.get(bm(0)), recent.get(bm(1)), recent.get(bm(2))) == (
        None, b"b" * 10, b"c" * 10)


def test_a_payload_larger_than_the_budget_is_not_kept_and_drops_nothing():
    recent = RecentPayloads(budget=200)
    recent.add(bm(0), b"small")
    recent.add(bm(1), b"x" * 200)
    assert recent.get(bm(1)) is None and recent.get(bm(0)) == b"small"


class CountingStore:
    """The service's store, counting the reads of payloads."""

    def __init__(self, store: Any) -> None:
        self.store, self.reads = store, 0

    def get(self, key: bytes) -> bytes | None:
        self.reads += key.startswith(payload_key(bm(0))[:2])  # (the payloads' prefix)
        return self.store.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_delivery_reads_the_store_only_for_payloads_no_longer_in_memory(tmp_path):
    svc, _ = bench_cpu._service(tmp_path)
    counting = CountingStore(svc._store)
    svc._store = counting
    kept = 50
    one = Payload(None, b'{"n": 0000}', [], 0).encode()  # (every payload here that long)
    svc._recent = RecentPayloads(budget=kept * (len(one) + ENTRY_OVERHEAD))
    batch = bench_cpu._batch(svc)
    for i in range(200):
        svc._source_record(bench_cpu._record("T", b'{"n": %04d}' % i, i), bm(i), ["Q"],
                           1_000, batch)
    svc._commit(batch, 200)
    svc._committer.flush_held()  # stored: the state write is done
    assert [Payload.decode(svc._packed(bm(i), bench_cpu._batch(svc), "Q")).value
            for i in range(150, 200)] == [b'{"n": %04d}' % i for i in range(150, 200)]
    assert counting.reads == 0  # the latest 50: from memory
    assert [Payload.decode(svc._packed(bm(i), bench_cpu._batch(svc), "Q")).value
            for i in range(150)] == [b'{"n": %04d}' % i for i in range(150)]
    assert counting.reads == 150  # the rest from the store


def test_an_idle_service_drops_the_payloads_it_kept():
    recent = RecentPayloads(budget=1 << 20)
    recent.add(bm(0), b"payload")
    assert recent.shed_memory() is True  # done at once: nothing to put off
    assert recent.get(bm(0)) is None and len(recent) == 0
    recent.add(bm(1), b"payload")  # and keeps again once busy
    assert recent.get(bm(1)) == b"payload"
