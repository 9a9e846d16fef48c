"""A queue's window: which available messages it holds in memory, and the pager for the rest.

A part of `QueueState` (its base class), kept apart: paging out and back in, the filters' look
into the pager, and the streaming restore at start. Paged-out messages all come after every
available one held in memory, barriers aside (they never leave memory): dispatch takes the
head of `available` after `refill`. Only a filter's scan (`paged_matches`) reaches past them,
and what it finds is leased straight from the pager, so that order holds.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterable
from heapq import heappush
from typing import Any, Final

from sortedcontainers import SortedDict

from broker.config import QueueConfig
from broker.engine.barriers import BarrierWaits
from broker.engine.message import Ascending, Message, QueueStats
from broker.engine.ordered import OrderIndex
from broker.engine.ordering import NUMBER, STRING, BySortKey
from broker.engine.paging import Pager
from broker.engine.stamps import Stamps
from broker.engine.states import MessageState
from broker.expr import Expression
from broker.packed import AVAILABLE_CODE, message_head
from broker.values import Bookmark

RESTORE_PAGE_OUT: Final = 10_000  # paged out together while a queue is restored

# Timers go stale (a lease acked, returned or renewed; a message acked before its expiry) and
# are dropped lazily: left in their heaps, a lease period's worth (2,400,000 at 40,000 msgs/s
# and 60 s leases) would keep their bookmarks for the collector to walk. A heap is rebuilt
# from its live timers whenever it has doubled since its last rebuild (from this size).
TIMERS_AT_LEAST: Final = 4096

def _rebuilt(live: list[Any]) -> tuple[list[Any], int]:
    """A timer heap of `live`, and the size at which it is rebuilt next."""
    heapq.heapify(live)
    return live, max(TIMERS_AT_LEAST, 2 * len(live))


# Available messages a queue holds in memory (twice this before it pages the last ones out;
# refilled below half of it): the rest wait in the pager.
WINDOW = 10_000


class Window:
    """The paging part of QueueState: the state it shares is declared here."""

    config: QueueConfig
    pager: Pager | None
    window: int
    paged: int
    _floor: Any
    filter_scan: dict[str, Any]
    group_scan: Any
    group_seen: set[str]
    messages: dict[Bookmark, Message]
    available: OrderIndex
    barriers: SortedDict
    waits: BarrierWaits | None
    stats: QueueStats
    timestamps: Stamps
    offsets: dict[tuple[str, int], Ascending]
    # (deadline, seq, delivery count, bookmark): the seq settles a tie of deadlines (leases
    # made in one millisecond) at once, before the bookmarks would be compared
    lease_timers: list[tuple[int, int, int, Bookmark]]
    lease_timers_limit: int  # the size at which stale ones are dropped
    expiry_timers: list[tuple[int, int, Bookmark]]
    expiry_timers_limit: int
    ranked: bool
    sorted_by: BySortKey | None
    byte_count: int
    name: str  # the config's, read per message: not through the config

    def expires_at(self, msg: Message) -> int | None:
        raise NotImplementedError

    def _time_lease(self, msg: Message) -> None:
        """A timer for the lease `msg` holds until its deadline (one made stale by an ack,
        a return or a later lease is skipped when due)."""
        assert msg.deadline_ms is not None
        if len(self.lease_timers) >= self.lease_timers_limit:
            self._drop_stale_lease_timers()
        heappush(self.lease_timers, (msg.deadline_ms, msg.seq, msg.delivery_count,
                                     msg.bookmark))

    def _drop_stale_lease_timers(self) -> None:
        """Keep the timers of leases still held (as `Timers._lapse_leases` tells them)."""
        messages = self.messages
        self.lease_timers, self.lease_timers_limit = _rebuilt([
            t for t in self.lease_timers if (m := messages.get(t[3])) is not None
            and m.deadline_ms == t[0] and m.delivery_count == t[2]])

    def _make_available(self, msg: Message) -> None:
        raise NotImplementedError

    def _hold_available(self, msg: Message) -> None:
        raise NotImplementedError

    def _leave(self, msg: Message) -> None:
        raise NotImplementedError

    def _set_expiry_timer(self, msg: Message, paged: bool) -> None:
        """In memory for a message held in memory, in the pager for one paged out (a deep
        queue with an expiration holds no timer per message)."""
        expires = self.expires_at(msg)
        if expires is None:
            return
        if paged and self.pager is not None:
            self.pager.add_timer(self.name, expires, msg.seq, msg.bookmark)
        else:
            if len(self.expiry_timers) >= self.expiry_timers_limit:
                self._drop_stale_expiry_timers()
            heapq.heappush(self.expiry_timers, (expires, msg.seq, msg.bookmark))

    def _drop_stale_expiry_timers(self) -> None:
        """Keep the timers of messages still available in memory: one leased gets a new
        timer when it comes back, one paged out has its timer in the pager."""
        messages = self.messages
        self.expiry_timers, self.expiry_timers_limit = _rebuilt([
            t for t in self.expiry_timers if (m := messages.get(t[2])) is not None
            and m.seq == t[1] and m.state is MessageState.AVAILABLE])

    def _page_out(self, msg: Message) -> None:
        assert self.pager is not None
        self.messages.pop(msg.bookmark, None)
        self.pager.put(self.name, msg)
        self._paged_out(msg)

    def _paged_out(self, msg: Message) -> None:
        self.paged += 1
        if self._floor is None or msg.order < self._floor:
            self._floor = msg.order
        for text, scanned in self.filter_scan.items():
            if scanned is not None and msg.order <= scanned:
                self.filter_scan[text] = None  # look again from the start
        if self.group_scan is not None and msg.order <= self.group_scan:
            self.group_scan = None  # (engine.groups) the same: its group may not be first
            self.group_seen.clear()

    def _evict(self) -> None:
        """Too many available messages in memory: page out the last ones."""
        while len(self.available) - len(self.barriers) > self.window:
            i = -1
            while self.available.peekitem(i)[1].is_barrier:
                i -= 1
            msg = self.available.peekitem(i)[1]
            self._leave(msg)
            self._page_out(msg)
            self._set_expiry_timer(msg, paged=True)  # (its timer in memory is then stale)

    def _page_in(self, bm: Bookmark) -> Message | None:
        """Bring one paged-out message back into memory (before a transition changes it)."""
        if not self.paged or self.pager is None:
            return None
        msg = self.pager.take(self.name, bm)
        if msg is not None:
            self.paged -= 1
            if msg.order == self._floor:  # it was the first: the pager knows the next
                self._floor = self.pager.first_order(self.name)
            self._hold_available(msg)
        return msg

    def refill(self) -> bool:
        """Before dispatch: page back in the first paged-out messages once fewer than half
        a window of available ones are left in memory. True when it did."""
        if not self.paged or self.pager is None:
            return False
        held = len(self.available) - len(self.barriers)
        if held >= (self.window + 1) // 2:
            return False
        for msg in self.pager.take_first(self.name, self.window - held):
            self.paged -= 1
            self._hold_available(msg)
        self._floor = self.pager.first_order(self.name)
        return True

    def paged_matches(self, text: str, expr: Expression, doc_of: Any,
                      limit: int) -> Message | None:
        """The first paged-out message filter `text` takes, looking at no more than `limit`
        (then None: the look goes on from there next time)."""
        if not self.paged or self.pager is None:
            return None
        scanned = self.filter_scan.get(text)
        for msg in self.pager.after(self.name, scanned, limit):
            doc = doc_of(msg)
            if doc is not None and expr.matches(doc):
                return msg
            self.filter_scan[text] = msg.order
        return None

    def restore(self, messages: Iterable[Message],
                offsets: dict[tuple[str, int], array[int]] | None = None,
                unfinished: array[int] | None = None) -> None:
        """Put back every message loaded from the store, in any order (recovery, not a
        transition). Streams: what dispatch needs next stays in memory, the rest is paged
        out as it comes, so a deep queue is never all in memory at once. `offsets` and
        `unfinished` (seqs) hold what `restore_stored` counted of the messages it took."""
        offsets = offsets if offsets is not None else {}
        unfinished = unfinished if unfinished is not None else array("q")
        best: list[tuple[Any, Message]] = []  # the window so far, worst on top
        out: list[Message] = []
        for msg in messages:
            self._as_configured(msg)
            bm = msg.bookmark
            self.stats.next_seq = max(self.stats.next_seq, msg.seq + 1)
            offsets.setdefault((bm.topic, bm.partition), array("q")).append(bm.offset)
            if msg.state is not MessageState.SENT:
                self.timestamps.add(msg.timestamp_ms)
                self.byte_count += msg.size
                if not msg.is_barrier:
                    unfinished.append(msg.seq)
            if msg.is_barrier:
                self.barriers[msg.seq] = msg
            if (msg.state is MessageState.AVAILABLE and not msg.is_barrier and self.pager
                    and msg.not_before_ms is None):
                heapq.heappush(best, (_worst_first(msg.order), msg))
                if len(best) > self.window:
                    out.append(heapq.heappop(best)[1])
                    if len(out) >= RESTORE_PAGE_OUT:
                        self._page_out_all(out)
                continue
            self.messages[bm] = msg
            if msg.state is MessageState.AVAILABLE:
                self._make_available(msg)
            elif msg.deadline_ms is not None:
                self._time_lease(msg)
        self._page_out_all(out)
        for _, msg in sorted(best, reverse=True):  # all before every paged-out one
            self.messages[msg.bookmark] = msg
            self._make_available(msg)
        for tp, values in offsets.items():
            self.offsets[tp] = Ascending(sorted(values))
        if self.waits is not None:  # the barriers are all known now
            self.waits.rebuild(self.barriers.keys(), unfinished)

    @property
    def restores_raw(self) -> bool:
        """Whether `restore_stored` pages the stored records out as they are."""
        return self.pager is not None and not self.config.expiration and self.sorted_by is None

    def restore_stored(self, records: Iterable[tuple[str, bytes]],
                       load: Callable[[str, bytes], Message], paged: bool = False) -> None:
        """`restore` from stored records (bookmark text, packed message): an available
        message that is paged out goes to the pager as stored, without becoming a Message
        (`load` builds one when needed), so a restart costs a few microseconds per queued
        message. `paged`: the pager holds every available one already (a clean stop left
        it so, `page_out_window`): they are counted, not paged out again."""
        if not self.restores_raw:
            self.restore(load(text, data) for text, data in records)
            return
        best: list[tuple[float, int, str, bytes | Message]] = []  # the window, worst on top
        out: list[tuple[Any, int, str, bytes]] = []
        out_loaded: list[Message] = []
        offsets: dict[str, array[int]] = {}  # "topic/partition" -> offsets
        others: list[Message] = []  # leased, sent and barriers: `restore` takes them
        stamps: dict[int, int] = {}
        seqs = array("q")  # of the available messages taken here (barrier queues)
        next_seq = self.stats.next_seq
        # Per record, only what must be done: this loop is most of a restart's time (a
        # million records take seconds), so no allocation or call it can do without.
        for bm_text, data in records:
            head = message_head(data)
            if head is None or (head[3] is not None and not self.ranked):
                msg = load(bm_text, data)  # an older layout, or a priority no longer used
                if (msg.state is not MessageState.AVAILABLE or msg.is_barrier
                        or msg.not_before_ms is not None):
                    others.append(msg)  # not for the pager
                    continue
                msg.priority = msg.priority if self.ranked else None
                self.byte_count += msg.size
                item: bytes | Message = msg
                seq, ts, first = msg.seq, msg.timestamp_ms, msg.order[0]
            elif head[2] != AVAILABLE_CODE or head[4]:
                others.append(load(bm_text, data))
                continue
            else:
                seq, ts, _, priority, _ = head
                first, item = math.inf if priority is None else -priority, data
            if seq >= next_seq:
                next_seq = seq + 1
            where, _, offset = bm_text.rpartition("/")
            column = offsets.get(where)
            if column is None:
                column = offsets[where] = array("q")
            column.append(int(offset))
            stamps[ts] = stamps.get(ts, 0) + 1
            if self.waits is not None:
                seqs.append(seq)
            if paged:
                continue
            if len(best) < self.window:
                heapq.heappush(best, (-first, -seq, bm_text, item))
                continue
            worst = best[0]  # of those kept: the one taking its place is paged out instead
            if -first > worst[0] or (-first == worst[0] and -seq > worst[1]):
                negfirst, negseq, bm_text, item = heapq.heapreplace(
                    best, (-first, -seq, bm_text, item))
                first, seq = -negfirst, -negseq
            if isinstance(item, Message):
                out_loaded.append(item)
            else:
                out.append(((first, seq), seq, bm_text, item))
            if len(out) >= RESTORE_PAGE_OUT:
                self._page_out_raw(out, load)
        self._page_out_raw(out, load)
        self._page_out_all(out_loaded)
        self.stats.next_seq = next_seq
        for ts, count in stamps.items():
            self.timestamps.add(ts, count)
        for _, _, text, held in sorted(best, reverse=True):  # before every paged-out one
            msg = held if isinstance(held, Message) else load(text, held)
            self.messages[msg.bookmark] = msg
            self._make_available(msg)
        if paged and self.pager is not None:  # the window comes from the pager's front
            self.paged = self.pager.count(self.name)
            self._floor = self.pager.first_order(self.name)
        self.restore(others, offsets={
            (where.rpartition("/")[0], int(where.rpartition("/")[2])): values
            for where, values in offsets.items()}, unfinished=seqs)
        if paged:
            self.refill()

    def page_out_window(self) -> None:
        """At a clean stop: page out the available messages held in memory as well (those
        a restore would page out or hold), so that the pager holds every one and the next
        start can use it as it is (`restore_stored(paged=True)`)."""
        for msg in [m for m in self.messages.values() if m.state is MessageState.AVAILABLE
                    and not m.is_barrier and m.not_before_ms is None]:
            self._leave(msg)
            self._page_out(msg)
            self._set_expiry_timer(msg, paged=True)

    def _as_configured(self, msg: Message) -> None:
        """A stored message ranked as the queue's config ranks now (it may have changed)."""
        if self.sorted_by is not None:
            kind, value = msg.sort_value or (None, None)
            msg.sort_value = self.sorted_by.sort_value(value if kind in (NUMBER, STRING)
                                                       else None)
            msg.priority = None
        else:
            msg.sort_value = None
            if not self.ranked:
                msg.priority = None  # stored under an earlier config that had a priority

    def _page_out_raw(self, items: list[tuple[Any, int, str, bytes]],
                      load: Callable[[str, bytes], Message]) -> None:
        assert self.pager is not None
        if not items:
            return
        self.pager.put_raw_many(self.name, items, load)
        self.paged += len(items)
        lowest = min(items)[0]  # (an order is unique: the rest of the item is never compared)
        if self._floor is None or lowest < self._floor:
            self._floor = lowest
        items.clear()

    def _page_out_all(self, msgs: list[Message]) -> None:
        """Page out restored messages (never in `messages`) in one write."""
        if not msgs:
            return  # (a queue that is not paged restores with nothing to page out)
        assert self.pager is not None
        self.pager.put_many(self.name, msgs)
        for msg in msgs:
            self._set_expiry_timer(msg, paged=True)
            self._paged_out(msg)
        msgs.clear()


class _Reversed:
    """An order compared the other way round (a max-heap of orders that cannot be negated:
    a sorted queue's hold strings)."""

    __slots__ = ("order",)

    def __init__(self, order: Any) -> None:
        self.order = order

    def __lt__(self, other: _Reversed) -> bool:
        return bool(other.order < self.order)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.order == other.order


def _worst_first(order: Any) -> Any:
    """A heap key putting the worst order on top: negated numbers where they are numbers."""
    first, seq = order
    return _Reversed(order) if isinstance(first, tuple) else (-first, -seq)
