"""One queue's state: its messages, indexes, subscriptions and counters.

`apply` is the only method that changes state; it is driven by the engine's decisions and, on
recovery, by journaled transitions. Which available messages are held in memory and which are
paged out is `broker.engine.window`'s part; the message and subscription types are in
`broker.engine.message`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, Final

from broker.config import QueueConfig
from broker.engine.barriers import BehindBarriers
from broker.engine.groups import MessageGroups
from broker.engine.holding import Holding
from broker.engine.message import Ascending, Message, QueueStats, Subscription
from broker.engine.ordered import OrderIndex
from broker.engine.ordering import ByArrival, BySortKey, ordering_of
from broker.engine.paging import Pager
from broker.engine.stamps import Stamps
from broker.engine.states import TERMINAL, MessageState, next_state
from broker.engine.transitions import ACTION_OF, Kind, Reason, Transition
from broker.engine.window import TIMERS_AT_LEAST, WINDOW, Window
from broker.errors import StateError
from broker.expr import compile_expression
from broker.values import Bookmark

# Removals that copy nothing to the dead-letter topic: a barrier leaves once sent, a reset
# starts the queue again from its recovery point, and a last value is replaced by design.
NOT_DEAD_LETTERED: Final = frozenset({Reason.BARRIER_SENT.value, Reason.RESET.value,
                                      Reason.REPLACED.value})


class QueueState(Window, Holding, BehindBarriers, MessageGroups):
    def __init__(self, config: QueueConfig, pager: Pager | None = None,
                 window: int = WINDOW) -> None:
        self.config = config
        # read per message, so kept here: compiled, an attribute of this class is read
        # directly, one of the config (a pydantic model) by a generic lookup
        self.name, self.at_most_once = config.name, config.at_most_once
        self.target_queue_depth, self.format = config.target_queue_depth, config.format
        self.lease_ms, self.fairness = config.lease_period.ms, config.effective_fairness
        self.expiration_ms = config.expiration.ms if config.expiration else None
        # Paging (broker.engine.paging): not for priority queues holding barriers, where
        # what may go next is spread through the order (they keep every message in memory).
        self.ordering = ordering_of(config)  # how it orders (broker.engine.ordering)
        self.ranked = not isinstance(self.ordering, ByArrival)
        self.sorted_by = self.ordering if isinstance(self.ordering, BySortKey) else None
        # Nor ranked ring queues (their victim, the oldest of the lowest priority, is found in
        # memory; their limits bound them anyway).
        self.pager = None if self.ranked and (config.barrier_expression or
                                              config.overflow_policy == "ring") else pager
        self.window = max(1, window)
        self.paged = 0  # available messages paged out
        self._floor: Any = None  # the delivery order of the first of them
        # per filter (by text): the paged-out messages up to this order do not match it
        self.filter_scan: dict[str, Any] = {}
        # Every unfinished message held in memory (all but the paged-out available ones).
        self.messages: dict[Bookmark, Message] = {}
        self.available = OrderIndex()  # Message.order -> Message, in memory
        # Held until their not_before_ms (broker.engine.holding), in `messages` too
        self.held: dict[Bookmark, Message] = {}
        self.hold_timers: list[tuple[int, int, Bookmark]] = []
        self.subs: dict[str, Subscription] = {}  # consumers, in subscription order
        self.browsers: dict[str, Subscription] = {}
        self.stats = QueueStats()
        self.byte_count = 0  # of the messages in the queue, when it has max_bytes
        # Last-value queues: the newest message per key (the one named may have left since);
        self.lvq_key = compile_expression(config.lvq_key) if config.lvq_key else None
        self.latest: dict[Any, Bookmark] | None = None  # None: to build (engine.admission)
        self._init_groups()  # message groups: their heads and holders (engine.groups)
        self.flow_paused: bool | None = None  # flow-control: what PREFIX.flow said last
        self.rr_last: str | None = None  # round-robin cursor: sub_id served last
        # Where the queue starts in its topics: as configured, and as a time (records older
        # than start_ms are not enqueued; 0 for earliest). None until first configured.
        self.recovery_point: str | None = None
        self.start_ms = 0
        self._init_barriers(config.barrier_expression)  # (engine.barriers)
        # Per subscription filter (by text): the available messages it matches (barriers
        # aside: they go by their own rule), in delivery order, so a filtered subscription
        # finds its next message without walking the queue. Kept by the dispatcher: messages
        # made available since it last looked wait in `fresh`; a message leaving the
        # available ones leaves every index at once.
        self.matching: dict[str, OrderIndex] = {}
        self.fresh: list[Message] = []
        self.clock_checked_ms = 0  # when filters reading NOW() last looked again
        self.clock_scan: Any = None  # where their walk beyond the front goes on (an order)
        # TargetQueueDepth: where reading stopped per partition, acks waiting for their
        # message, and whether records were turned away since the queue last had room
        self.read_upto: dict[tuple[str, int], int] = {}
        self.pending_acks: set[Bookmark] = set()
        self.deferring = False
        self.lease_timers: list[tuple[int, int, int, Bookmark]] = []  # heaps: see Window
        self.expiry_timers: list[tuple[int, int, Bookmark]] = []  # (expires_at, seq, bm)
        self.lease_timers_limit = self.expiry_timers_limit = TIMERS_AT_LEAST
        # Kept as messages come and go so queries cost O(log n), not a walk of the queue:
        # record timestamps of the messages still in it (timestamp -> how many; sent ones
        # have left), and per source partition the offsets of its messages in arrival order,
        # finished ones dropped lazily from the front (arrival order is offset order within
        # a partition, so the front is the lowest unfinished offset).
        self.timestamps = Stamps()
        self.offsets: dict[tuple[str, int], Ascending] = {}

    @property
    def needs_doc(self) -> bool:
        """Whether arrivals are judged by their payload (the service decodes it then)."""
        return (self.ordering.needs_doc or self.barrier is not None or self.lvq_key is not None
                or self.group_expr is not None)

    @property
    def dispatchable(self) -> OrderIndex:
        """The available messages dispatch may take now, in delivery order (`order` ->
        message): all of them, or in a priority queue holding barriers those ahead of
        every barrier (in other queues the order is the arrival order, so dispatch stops
        at the first barrier itself)."""
        return self.available if self.ahead is None else self.ahead

    # -- reading ---------------------------------------------------------------------------
    def expires_at(self, msg: Message) -> int | None:
        if msg.expires_ms is not None:
            return msg.expires_ms
        exp = self.expiration_ms
        return None if exp is None else msg.timestamp_ms + exp

    def depth(self) -> int:
        """Messages still in the queue: available, held and leased (sent ones have left)."""
        return len(self.available) + self.paged + len(self.held) + self.leased_count()

    def available_count(self) -> int:
        return len(self.available) + self.paged

    def find(self, bm: Bookmark) -> Message | None:
        """An unfinished message, in memory or paged out (then a copy: change it through
        `apply`, which pages it back in)."""
        msg = self.messages.get(bm)
        if msg is None and self.paged and self.pager is not None:
            msg = self.pager.get(self.name, bm)
        return msg

    def by_seq(self, after_seq: int = -1) -> Iterator[Message]:
        """Every unfinished message with a seq above `after_seq`, in arrival order (those
        in memory sorted, merged with the paged-out ones as the pager reads them)."""
        held = sorted((m for m in self.messages.values() if m.seq > after_seq),
                      key=lambda m: m.seq)
        if not self.paged or self.pager is None:
            return iter(held)
        return heapq.merge(held, self.pager.by_seq(self.name, after_seq), key=lambda m: m.seq)

    def leased_count(self) -> int:
        # at-least-once queues hold only available and leased messages; at-most-once ones
        # only available and sent (which have left the queue)
        waiting = len(self.available) + len(self.held)
        return 0 if self.at_most_once else len(self.messages) - waiting

    @property
    def full(self) -> bool:
        """TargetQueueDepth reached: the active part takes no more messages."""
        tqd = self.target_queue_depth
        return tqd is not None and self.depth() >= tqd

    def queued(self, bm: Bookmark) -> bool:
        """Whether the message is in the queue. A record beyond the furthest this queue has
        enqueued from its partition cannot be, which spares the pager a lookup per arrival."""
        if bm.offset >= self.read_upto.get((bm.topic, bm.partition), 0):
            return False
        return self.find(bm) is not None

    def not_read_yet(self, bm: Bookmark) -> bool:
        """Whether a bookmark lies beyond what this TargetQueueDepth queue has read."""
        return (self.target_queue_depth is not None
                and self.config.topic_regex.search(bm.topic) is not None
                and bm.offset >= self.read_upto.get((bm.topic, bm.partition), 0))

    def browse_start(self, since_ms: int | None) -> int:
        """A new browser's cursor: before the whole queue, or (with a replay period) before
        the first queued message stamped after then (a period of 0: nothing queued yet);
        it then sees everything after that."""
        if since_ms is None:
            return -1
        recent = next((m.seq for m in self.by_seq() if m.timestamp_ms > since_ms), None)
        return recent - 1 if recent is not None else self.stats.next_seq - 1

    def subscription(self, sub_id: str) -> Subscription | None:
        """A consumer or a browser of this queue."""
        return self.subs.get(sub_id) or self.browsers.get(sub_id)

    def first_barrier(self) -> Message | None:
        """The earliest barrier still queued: nothing after it may be delivered yet."""
        return self.barriers.peekitem(0)[1] if self.barriers else None

    def clear_before(self, barrier: Message) -> bool:
        """Whether every message before the barrier is acknowledged or removed."""
        assert self.waits is not None  # (barriers are in barrier queues only)
        return self.waits.clear(barrier.seq)

    def oldest_timestamp(self) -> int | None:
        """The record timestamp of the oldest message still in the queue."""
        return self.timestamps.oldest()

    # -- changing --------------------------------------------------------------------------
    def apply(self, t: Transition) -> Message | None:
        """Apply one transition. Return the message it touched (None for subscription kinds)."""
        if t.kind is Kind.SUBSCRIBED:
            self._subscribe(t)
            return None
        if t.kind is Kind.UNSUBSCRIBED:
            self.subs.pop(t.sub_id or "", None)
            self.browsers.pop(t.sub_id or "", None)
            if self.group_expr is not None:
                self._group_holder_ended(t.sub_id or "")
            if self.rr_last == t.sub_id:
                self.rr_last = None
            return None
        if t.kind is Kind.CONFIGURED:
            self.recovery_point, self.start_ms = t.reason, t.timestamp_ms
            return None
        if t.kind is Kind.REMEMBERED:
            assert t.bookmark is not None
            self.pending_acks.add(t.bookmark)
            return None
        if t.kind is Kind.EXTENDED:
            return self._extend(t)
        if t.kind is Kind.BROWSED:
            browser = self.browsers.get(t.sub_id or "")
            if browser is not None:
                browser.cursor = max(browser.cursor, t.seq)
                browser.looked_upto = max(browser.looked_upto, browser.cursor)
            return None
        assert t.bookmark is not None
        if t.kind is Kind.ENQUEUED:
            if self.queued(t.bookmark):
                raise StateError(f"{t.bookmark} is already queued in {self.name}")
            next_state(None, ACTION_OF[t.kind])
            msg = Message(t.bookmark, t.seq, t.timestamp_ms)
            # a priority journaled under an earlier config that had one no longer counts
            msg.priority = t.priority if self.ranked else None
            if self.sorted_by is not None:  # its key, not a priority
                text = t.sort_text
                msg.sort_value = self.sorted_by.sort_value(text if text is not None
                                                           else msg.priority)
                msg.priority = None
            msg.is_barrier = t.barrier
            msg.expires_ms = t.deadline_ms  # (ENQUEUED: its own expiry)
            msg.not_before_ms = t.not_before_ms
            msg.size = t.size or 0
            msg.group = t.group if self.group_expr is not None else None
            self.byte_count += msg.size
            self.messages[t.bookmark] = msg
            self._count_in(msg)
            tp = (t.bookmark.topic, t.bookmark.partition)
            self.read_upto[tp] = max(self.read_upto.get(tp, 0), t.bookmark.offset + 1)
            if msg.is_barrier:
                self.barriers[msg.seq] = msg
                if self.waits is not None:
                    self.waits.barrier_added(msg.seq)
            elif self.waits is not None:
                self.waits.count(msg.seq, 1)
            self._make_available(msg)
            self.stats.next_seq = max(self.stats.next_seq, t.seq + 1)
            self.stats.enqueued += 1
            return msg
        found = self.messages.get(t.bookmark) or self._page_in(t.bookmark)
        if found is None:
            raise StateError(f"{t.bookmark} is not queued in {self.name}")
        msg = found
        new_state = next_state(msg.state, ACTION_OF[t.kind])
        self._leave(msg)
        if msg.state is not MessageState.SENT and (new_state in TERMINAL
                                                   or new_state is MessageState.SENT):
            self.timestamps.remove(msg.timestamp_ms)  # it has finished
            self.byte_count -= msg.size
            if self.waits is not None and not msg.is_barrier:
                self.waits.count(msg.seq, -1)
        msg.state = new_state
        msg.delivery_count = max(msg.delivery_count, t.delivery_count)
        msg.cancel_count = max(msg.cancel_count, t.cancel_count)
        if new_state in (MessageState.LEASED, MessageState.SENT):
            msg.holder, msg.deadline_ms = t.sub_id, t.deadline_ms
            sub = self.subs.get(t.sub_id or "")
            if sub is not None:
                sub.held.add(msg.bookmark)
            if self.group_expr is not None:
                self._group_leased(msg)
            if t.deadline_ms is not None:
                self._time_lease(msg)
            self.stats.delivered += 1
        elif new_state is MessageState.AVAILABLE:
            msg.not_before_ms = t.not_before_ms  # (RETURNED: a redelivery delay)
            self._make_available(msg)
        else:  # terminal
            del self.messages[msg.bookmark]  # its entry in offsets goes when it reaches the front
            if msg.is_barrier:
                self.barriers.pop(msg.seq, None)
                if self.waits is not None:
                    self.waits.barrier_left(msg.seq)
                self._release_behind(msg.seq)
            if new_state is MessageState.ACKED:
                self.stats.acked += 1
                self.pending_acks.discard(msg.bookmark)
            else:  # removed by policy, or an at-most-once message released unacked
                self.stats.removed[t.reason or "removed"] += 1
                if (t.kind is Kind.REMOVED and self.config.dead_letter_topic
                        and t.reason not in NOT_DEAD_LETTERED):
                    self.stats.dead_lettered += 1
        return msg

    def _extend(self, t: Transition) -> Message:
        """A lease renewed: a later deadline (the timer of the earlier one finds it stale)."""
        msg = self.messages.get(t.bookmark) if t.bookmark is not None else None
        if msg is None or msg.state is not MessageState.LEASED or t.deadline_ms is None:
            raise StateError(f"cannot extend {t.bookmark}: it is not leased in {self.name}")
        msg.deadline_ms = t.deadline_ms
        self._time_lease(msg)
        return msg

    def _subscribe(self, t: Transition) -> None:
        assert t.sub_id is not None and t.client is not None
        cap = min(t.max_backlog, self.config.max_per_subscription_backlog)
        sub = Subscription(t.sub_id, t.client, self.name, t.max_backlog, cap,
                           filter=compile_expression(t.filter) if t.filter else None,
                           principal=t.principal)
        if t.browse:
            sub.browse, sub.cap, sub.cursor = True, 0, t.seq
            sub.looked_upto = t.seq
            self.browsers[t.sub_id] = sub
            return
        sub.held = {  # leased messages are never paged out
            m.bookmark
            for m in self.messages.values()
            if m.holder == t.sub_id and m.state in (MessageState.LEASED, MessageState.SENT)
        }
        self.subs[t.sub_id] = sub

    def _count_in(self, msg: Message) -> None:
        """Enter a new or restored message in the indexes queries read."""
        bm = msg.bookmark
        tp = (bm.topic, bm.partition)
        offsets = self.offsets.get(tp)
        if offsets is None:  # (not setdefault: that builds an array per arrival)
            offsets = self.offsets[tp] = Ascending()
        # Rebuilt when read again from an earlier offset (a reset), and when finished ones
        # pile up behind an old unfinished one at the front (amortised O(1)).
        last = offsets.last()
        if (last is not None and last >= bm.offset) or len(offsets) > 2 * (
                len(self.messages) + self.paged) + 1024:
            self.offsets[tp] = Ascending(sorted(
                m.bookmark.offset for m in self.by_seq()
                if (m.bookmark.topic, m.bookmark.partition) == tp))
        else:
            offsets.append(bm.offset)
        if msg.state is not MessageState.SENT:
            self.timestamps.add(msg.timestamp_ms)

    def _make_available(self, msg: Message) -> None:
        msg.holder = msg.deadline_ms = None
        if msg.not_before_ms is not None:
            self._hold(msg)  # not available yet
            return
        if self.paged and not msg.is_barrier and msg.order > self._floor:
            self._page_out(msg)  # others come first: it waits among them
            self._set_expiry_timer(msg, paged=True)
            return
        self._set_expiry_timer(msg, paged=False)
        self._hold_available(msg)
        if self.pager is not None and len(self.available) - len(self.barriers) > 2 * self.window:
            self._evict()

    def _hold_available(self, msg: Message) -> None:
        self.messages[msg.bookmark] = msg
        self.available[msg.order] = msg
        if self.ahead is not None and not msg.is_barrier and not self._hold_behind(msg):
            self.ahead[msg.order] = msg
        if self.matching:
            self.fresh.append(msg)
        if self.group_expr is not None:
            self._group_in(msg)

    def _leave(self, msg: Message) -> None:
        """Take the message out of the index of the state it is leaving."""
        if msg.state is MessageState.AVAILABLE:
            if msg.not_before_ms is not None and self._unhold(msg):
                return  # it was held: in none of the available ones' indexes
            self.available.pop(msg.order, None)

            if (self.ahead is not None and not msg.is_barrier
                    and self.ahead.pop(msg.order, None) is None):
                self.behind[self._barrier_before(msg.seq)].pop(msg.bookmark)
            for index in self.matching.values():
                index.pop(msg.order, None)
            if self.group_expr is not None:
                self._group_out(msg)
        elif msg.holder is not None:
            sub = self.subs.get(msg.holder)
            if sub is not None:
                sub.held.discard(msg.bookmark)
            if self.group_expr is not None:
                self._group_let_go(msg)
