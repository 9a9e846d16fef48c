"""Where a deep queue keeps the available messages it does not hold in memory.

A queue holds in memory its leased messages, its barriers and a window of the available ones
that come next in delivery order; the rest are paged out to a `Pager`, which keeps them in
delivery order (to refill the window), in arrival order (browsers, `kq inspect`) and by
bookmark. It also keeps their expiry timers (`add_timer`, `due_timers`), so a deep queue with
an expiration holds no timer per message in memory. The pager is the engine's own swap space,
not its durable state: a page-out takes effect at once and nothing in it survives a crash
(the service rebuilds it from its store; a clean stop keeps it, broker.service.swap). The
service's pager is RocksDB (`broker.state.pager`); `MemoryPager` serves the tests and
behaves the same, so every queue rule is tested with a window small enough to page all the
time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from sortedcontainers import SortedDict

from broker.values import Bookmark

if TYPE_CHECKING:
    from broker.engine.queue import Message


class Pager(Protocol):
    """Paged-out available messages of every queue. `order` is `Message.order`."""

    def put(self, queue: str, msg: Message) -> None: ...

    def put_many(self, queue: str, msgs: list[Message]) -> None: ...

    def put_raw_many(self, queue: str, items: list[tuple[Any, int, str, bytes]],
                     load: Callable[[str, bytes], Message]) -> None:
        """Page out stored records as they are: (order, seq, bookmark text, packed message);
        `load` turns one into a Message."""

    def take(self, queue: str, bm: Bookmark) -> Message | None:
        """Page one message back in (remove it); None if it is not paged out."""

    def get(self, queue: str, bm: Bookmark) -> Message | None:
        """A paged-out message, left where it is."""

    def take_first(self, queue: str, limit: int) -> list[Message]:
        """Page back in the first `limit` messages in delivery order."""

    def first_order(self, queue: str) -> Any:
        """The delivery order of the first paged-out message; None when there is none."""

    def after(self, queue: str, order: Any, limit: int) -> list[Message]:
        """Up to `limit` paged-out messages whose order comes after `order` (None: from the
        start), in delivery order, left where they are."""

    def by_seq(self, queue: str, after_seq: int) -> Iterator[Message]:
        """The paged-out messages with a seq above `after_seq`, in arrival order, read as
        the iterator goes (do not page in or out meanwhile)."""

    def count(self, queue: str) -> int: ...

    def add_timer(self, queue: str, at: int, seq: int, bm: Bookmark) -> None:
        """Remember that the message (seq, bookmark) is due at `at` (epoch ms)."""

    def due_timers(self, queue: str, now: int, limit: int) -> list[tuple[int, int, Bookmark]]:
        """Up to `limit` timers due by `now`, earliest first, forgotten as they are returned.
        A timer is not removed when its message leaves: the caller checks it is still
        meant (lazy invalidation, as the engine's timer heaps)."""

    def shed_memory(self) -> bool:
        """Hand back memory held only to make writes cheaper (the service falls idle);
        False: not now, ask again at a later idle turn."""


class _Queue:
    def __init__(self) -> None:
        self.by_order: SortedDict = SortedDict()
        self.by_seq: SortedDict = SortedDict()
        self.by_bm: dict[Bookmark, Message] = {}
        self.timers: list[tuple[int, int, Bookmark]] = []  # a heap


class MemoryPager:
    """A pager in memory: the same behaviour, no saving (tests, and engines without a store)."""

    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}

    def _q(self, queue: str) -> _Queue:
        q = self._queues.get(queue)
        if q is None:
            q = self._queues[queue] = _Queue()
        return q

    def put(self, queue: str, msg: Message) -> None:
        q = self._q(queue)
        q.by_order[msg.order] = msg
        q.by_seq[msg.seq] = msg
        q.by_bm[msg.bookmark] = msg

    def put_many(self, queue: str, msgs: list[Message]) -> None:
        for msg in msgs:
            self.put(queue, msg)

    def put_raw_many(self, queue: str, items: list[tuple[Any, int, str, bytes]],
                     load: Callable[[str, bytes], Message]) -> None:
        self.put_many(queue, [load(text, raw) for _, _, text, raw in items])

    def take(self, queue: str, bm: Bookmark) -> Message | None:
        q = self._q(queue)
        msg = q.by_bm.pop(bm, None)
        if msg is not None:
            del q.by_order[msg.order]
            del q.by_seq[msg.seq]
        return msg

    def get(self, queue: str, bm: Bookmark) -> Message | None:
        return self._q(queue).by_bm.get(bm)

    def take_first(self, queue: str, limit: int) -> list[Message]:
        q = self._q(queue)
        out = [q.by_order.peekitem(i)[1] for i in range(min(limit, len(q.by_order)))]
        for msg in out:
            self.take(queue, msg.bookmark)
        return out

    def first_order(self, queue: str) -> Any:
        q = self._q(queue)
        return q.by_order.peekitem(0)[0] if q.by_order else None

    def after(self, queue: str, order: Any, limit: int) -> list[Message]:
        q = self._q(queue)
        keys = q.by_order.irange(minimum=order, inclusive=(False, False)) if order is not None \
            else iter(q.by_order)
        out: list[Message] = []
        for key in keys:
            if len(out) >= limit:
                break
            out.append(q.by_order[key])
        return out

    def by_seq(self, queue: str, after_seq: int) -> Iterator[Message]:
        q = self._q(queue)
        for seq in q.by_seq.irange(minimum=after_seq, inclusive=(False, False)):
            yield q.by_seq[seq]

    def count(self, queue: str) -> int:
        return len(self._q(queue).by_bm)

    def add_timer(self, queue: str, at: int, seq: int, bm: Bookmark) -> None:
        heapq.heappush(self._q(queue).timers, (at, seq, bm))

    def due_timers(self, queue: str, now: int, limit: int) -> list[tuple[int, int, Bookmark]]:
        timers = self._q(queue).timers
        out: list[tuple[int, int, Bookmark]] = []
        while timers and timers[0][0] <= now and len(out) < limit:
            out.append(heapq.heappop(timers))
        return out

    def shed_memory(self) -> bool:
        return True  # it is all memory
