"""The commit order's pipeline (broker.service.commit), against a producer whose
acknowledgements the test hands out: each step waits for the one before, and the service
goes on with the next batch while a journal is on its way."""

from __future__ import annotations

from typing import Any

import pytest

from broker.engine.engine import Engine
from broker.errors import DeliveryFailedError
from broker.service.coalesce import StateWindow
from broker.service.commit import Committer, Outbox, OutRecord
from broker.state.layout import Checkpoint, load_meta, offset_key
from broker.state.payload import Payload
from broker.state.store import MemoryStore
from broker.values import Bookmark

JOURNAL = "kq.journal"


class _Sent:
    def __init__(self, topic: str, offset: int) -> None:
        self._topic, self._offset = topic, offset

    def topic(self) -> str:
        return self._topic

    def offset(self) -> int:
        return self._offset


class Broker:
    """A producer whose records are acknowledged when the test says so (`ack`), or at once
    with `auto` (True, or the one topic so acknowledged; a flush always acknowledges
    everything, as Kafka would)."""

    def __init__(self, auto: bool | str = False) -> None:
        self.auto = auto
        self.produced: list[tuple[str, bytes | None]] = []  # in produce order
        self._pending: list[tuple[str, Any]] = []
        self._acked: list[tuple[str, Any]] = []
        self._offsets: dict[str, int] = {}

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, *,
                headers: Any = None, partition: int = -1, on_delivery: Any = None) -> None:
        self.produced.append((topic, value))
        self._pending.append((topic, on_delivery))

    def ack(self, topic: str | None = None) -> None:
        """The broker acknowledges the pending records (of `topic`); the producer's next poll
        calls their callbacks."""
        keep = []
        for rec in self._pending:
            (self._acked if topic in (None, rec[0]) else keep).append(rec)
        self._pending = keep

    def poll(self, _timeout: float = 0) -> int:
        if self.auto:
            self.ack(None if self.auto is True else self.auto)
        served, self._acked = self._acked, []
        for topic, callback in served:
            offset = self._offsets.get(topic, 0)
            self._offsets[topic] = offset + 1
            callback(None, _Sent(topic, offset))
        return len(served)

    def flush(self, _timeout: float = 0) -> int:
        self.ack()
        self.poll()
        return 0

    def topics(self) -> list[str]:
        return [t for t, _ in self.produced]


def _batch(n: int) -> tuple[Checkpoint, Outbox]:
    cp = Checkpoint(positions={("Q", "orders", 0): n})
    return cp, Outbox(deliveries=[OutRecord("kq.deliver.w1", b"lease %d" % n)])


def _committer(broker: Broker, window: StateWindow) -> tuple[Broker, MemoryStore, Committer]:
    store = MemoryStore()
    committer = Committer(broker, store, Engine([]), JOURNAL, next_batch=0,  # type: ignore[arg-type]
                          window=window)
    return broker, store, committer


@pytest.fixture
def parts():
    # each batch's state written on its own (a window of 0 ms closes at every batch)
    return _committer(Broker(), StateWindow(window_ms=0))


def _position(store: MemoryStore) -> int | None:
    raw = store.get(offset_key("Q", "orders", 0))
    return int(raw) if raw else None


def test_deliveries_wait_for_the_journal_and_the_state_for_the_deliveries(parts):
    broker, store, committer = parts
    committer.commit(*_batch(1))
    assert broker.topics() == [JOURNAL]  # the journal only: deliveries wait for it
    committer.advance()
    assert broker.topics() == [JOURNAL]  # not acknowledged yet: nothing moves
    broker.ack(JOURNAL)
    committer.advance()
    assert broker.topics() == [JOURNAL, "kq.deliver.w1"]
    assert _position(store) is None  # the state waits for the deliveries
    broker.ack()
    committer.advance()
    assert _position(store) == 1
    assert load_meta(store)["offset"] == 0  # with the journal offset it reached
    assert not committer.holding


def test_the_next_batch_is_processed_while_journals_are_on_their_way(parts):
    """commit() returns with the journal unacknowledged; the next batch's journal goes out
    behind it at once (Kafka keeps one partition's records in order), and a third waits for
    the first (whose deliveries then go out) before producing its own."""
    broker, store, committer = parts
    committer.commit(*_batch(1))
    assert committer.holding  # the caller goes on with the next batch meanwhile
    committer.commit(*_batch(2))
    assert broker.topics() == [JOURNAL, JOURNAL]  # nothing waited for
    broker.auto = True  # from now on Kafka answers each poll
    committer.commit(*_batch(3))
    assert broker.topics() == [JOURNAL, JOURNAL, "kq.deliver.w1", "kq.deliver.w1", JOURNAL]
    committer.flush_held()
    assert broker.topics().count("kq.deliver.w1") == 3 and _position(store) == 3
    assert not committer.holding


def test_an_idle_service_sends_deliveries_once_journaled_without_waiting_for_their_answers(
        parts):
    """With no input waiting, the service waits for the journals on their way, so that their
    deliveries go out at once; their answers come with a later poll, and the state with them.
    (Waiting for those too held back records arriving meanwhile by another round trip.)"""
    broker, store, committer = parts
    committer.commit(*_batch(1))
    broker.auto = JOURNAL  # Kafka answers the journal, and not yet the deliveries
    committer.send_held()
    assert broker.topics() == [JOURNAL, "kq.deliver.w1"]
    assert not committer.holding  # nothing for the loop to wait for: it reads inputs again
    assert _position(store) is None  # the state still waits for the deliveries' answers
    broker.auto = True
    committer.advance()
    assert _position(store) == 1 and load_meta(store)["offset"] == 0


def test_an_idle_service_stops_when_its_deliveries_go_unanswered():
    """Nothing else waits for an idle service's last deliveries: unanswered for 15 s (the
    broker gone), it says so and stops, as a busy one does at its next commit (librdkafka
    would report them only after its message.timeout.ms, 5 minutes)."""
    now = [0.0]
    broker, store = Broker(auto=JOURNAL), MemoryStore()  # deliveries never answered
    committer = Committer(broker, store, Engine([]), JOURNAL, next_batch=0,  # type: ignore[arg-type]
                          window=StateWindow(window_ms=0), clock=lambda: now[0])
    committer.commit(*_batch(1))
    committer.send_held()
    now[0] = 14.9
    committer.advance()  # still within the deadline
    now[0] = 15.1
    with pytest.raises(DeliveryFailedError,
                       match="producing deliveries failed: 1 of 1 not acknowledged within 15 s"):
        committer.advance()
    assert _position(store) is None  # nothing written as if they had gone out


def test_a_batchs_deliveries_wait_for_the_journals_before_its_own(parts):
    """Journals counted in order: a later one acknowledged first (not Kafka's way within a
    partition, but nothing may count on it) sends nothing until the one before is in."""
    broker, _, committer = parts
    committer.commit(*_batch(1))
    committer.commit(*_batch(2))
    committer._flight[1].journal.left = 0  # batch 2's journal answered, batch 1's not
    committer.advance()
    assert broker.topics() == [JOURNAL, JOURNAL]
    broker.ack(JOURNAL)
    committer.advance()
    assert broker.topics() == [JOURNAL, JOURNAL, "kq.deliver.w1", "kq.deliver.w1"]


def test_at_most_the_last_three_journaled_batches_lack_their_state(parts):
    """Recovery sends the leases of the last three journaled batches again: a fourth journal
    waits until the first batch's deliveries are acknowledged and its state written."""
    broker, store, committer = parts
    broker.auto = JOURNAL  # journals answered at each poll, deliveries not
    for n in (1, 2, 3):
        committer.commit(*_batch(n))
    committer.advance()
    assert broker.topics().count(JOURNAL) == 3
    assert broker.topics().count("kq.deliver.w1") == 3  # out, none acknowledged
    assert _position(store) is None
    broker.auto = True
    committer.commit(*_batch(4))
    assert _position(store) == 1  # batch 1 written before journal 4 went out; 2, 3 not yet
    assert broker.topics().count(JOURNAL) == 4


def test_a_payload_is_read_from_memory_until_its_state_is_written(parts):
    broker, _, committer = parts
    bm = Bookmark("orders", 0, 7)
    cp, outbox = _batch(1)
    cp.payloads[bm] = Payload(None, b"{}", [], 0)
    committer.commit(cp, outbox)
    broker.ack(JOURNAL)
    committer.commit(*_batch(2))  # batch 1 journaled, its deliveries on their way
    assert committer.held_payload(bm) == cp.payloads[bm]
    committer.flush_held()
    assert committer.held_payload(bm) is None  # in the store now (the store's business)


def test_a_refused_journal_stops_the_service(parts):
    broker, _, committer = parts

    def refuse(topic: str, *args: Any, on_delivery: Any = None, **kw: Any) -> None:
        on_delivery(_Error(), _Sent(topic, -1))

    broker.produce = refuse  # type: ignore[method-assign]
    committer.commit(*_batch(1))
    with pytest.raises(DeliveryFailedError, match="producing journal failed: .*broker down"):
        committer.advance()


class _Error:
    def code(self) -> int:
        return -1

    def str(self) -> str:
        return "broker down"


@pytest.fixture
def windowed():
    """A committer whose state window is never due on its own (a clean stop closes it)."""
    return _committer(Broker(auto=True), StateWindow(window_ms=10**9))


def test_a_windows_batches_are_journaled_and_delivered_and_their_state_written_at_its_end(
        windowed):
    broker, store, committer = windowed
    for n in (1, 2, 3, 4):
        committer.commit(*_batch(n))
    committer.flush_held()  # idle: everything goes out, the state waits for its window
    assert broker.topics().count(JOURNAL) == 4 and broker.topics().count("kq.deliver.w1") == 4
    assert not committer.holding
    assert _position(store) is None and load_meta(store)["offset"] == -1
    committer.flush_held(stopping=True)
    assert _position(store) == 4  # the last batch's position, with its journal offset
    assert load_meta(store) == {"offset": 3, "batch": 3, "writer": None}


def test_a_due_window_closes_at_a_batch_the_journal_records(windowed):
    """The window's rows carry its last batch's journal offset: a batch that journals
    nothing (replies only) cannot close it, even when the window is due."""
    broker, store, committer = windowed
    broker.auto = False
    committer.commit(*_batch(1))
    committer._window._window_s = 0  # due from now on
    committer.commit(Checkpoint(), Outbox(deliveries=[OutRecord("kq.deliver.w1", b"reply")]))
    assert _position(store) is None
    committer.flush_held()
    assert _position(store) == 1 and load_meta(store)["offset"] == 0


def test_a_payload_is_read_from_memory_until_its_window_is_written(windowed):
    _, store, committer = windowed
    bm = Bookmark("orders", 0, 7)
    cp, outbox = _batch(1)
    cp.payloads[bm] = Payload(None, b"{}", [], 0)
    committer.commit(cp, outbox)
    committer.commit(*_batch(2))
    committer.flush_held()
    assert committer.held_payload(bm) == cp.payloads[bm]  # delivered, not written
    committer.flush_held(stopping=True)
    assert committer.held_payload(bm) is None


def test_a_burst_of_arrivals_closes_the_window_before_its_time():
    """Arrivals hold their payloads in memory until their window is written: a deep backlog
    loading must not keep a whole window's worth of them."""
    _, store, committer = _committer(Broker(auto=True),
                                     StateWindow(window_ms=10**9, max_arrivals=3))
    for n, offsets in ((1, (1, 2)), (2, (3, 4)), (3, (5,))):
        cp, outbox = _batch(n)
        for offset in offsets:
            cp.payloads[Bookmark("orders", 0, offset)] = Payload(None, b"{}", [], 0)
        committer.commit(cp, outbox)
        committer.flush_held()
        assert _position(store) == (None if n == 1 else 2)  # 4 arrivals closed it at batch 2
    assert committer.held_payload(Bookmark("orders", 0, 3)) is None
    assert committer.held_payload(Bookmark("orders", 0, 5)) is not None  # the next window's
