"""What each barrier of a queue waits for, kept as counts rather than a set of messages."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mypy_extensions import trait
from sortedcontainers import SortedDict

from broker.engine.ordered import OrderIndex
from broker.expr import compile_expression
from broker.values import Bookmark

if TYPE_CHECKING:
    from broker.engine.message import Message


class BarrierWaits:
    """How many unfinished messages (not acked, removed or sent) lie before each barrier.

    A barrier goes once everything before it is finished. Each barrier counts the unfinished
    messages between the barrier before it and itself; messages after the last barrier count
    in `after`. A change costs O(log barriers) and memory grows with the barriers, not with
    the messages (a set of the unfinished seqs cost some 36 bytes per queued message).
    Barriers themselves are not counted: an earlier barrier still queued is the first.
    """

    __slots__ = ("_seqs", "_before", "after")

    def __init__(self) -> None:
        self._seqs: list[int] = []  # the barriers' seqs, ascending
        self._before: dict[int, int] = {}  # barrier seq -> unfinished messages it waits for
        self.after = 0

    def barrier_added(self, seq: int) -> None:
        """A new barrier: the latest arrival, so everything counted after the last one is
        before it (a restore, where arrivals come in any order, uses `rebuild`)."""
        assert not self._seqs or seq > self._seqs[-1], "barriers arrive in seq order"
        self._seqs.append(seq)
        self._before[seq], self.after = self.after, 0

    def barrier_left(self, seq: int) -> None:
        """A barrier sent or removed: what it waited for, the next one waits for."""
        i = bisect.bisect_left(self._seqs, seq)
        if i == len(self._seqs) or self._seqs[i] != seq:
            return
        del self._seqs[i]
        left = self._before.pop(seq)
        if i < len(self._seqs):
            self._before[self._seqs[i]] += left
        else:
            self.after += left

    def count(self, seq: int, n: int) -> None:
        """A message (not a barrier) with this seq became unfinished (+1) or finished (-1)."""
        i = bisect.bisect_right(self._seqs, seq)
        if i < len(self._seqs):
            self._before[self._seqs[i]] += n
        else:
            self.after += n

    def clear(self, seq: int) -> bool:
        """Whether the barrier `seq` is the first and waits for nothing."""
        return bool(self._seqs) and self._seqs[0] == seq and self._before[seq] == 0

    def rebuild(self, barriers: Iterable[int], unfinished: Iterable[int]) -> None:
        """Count from scratch: the barriers' seqs and the unfinished messages' seqs."""
        self._seqs = sorted(barriers)
        self._before = dict.fromkeys(self._seqs, 0)
        self.after = 0
        for seq in unfinished:
            self.count(seq, 1)


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class BehindBarriers:
    """A part of `QueueState` (its base class): in a priority queue holding barriers, the
    available messages behind each barrier, gathered by the nearest barrier before them
    (`behind`), and those no barrier precedes (`ahead`, the only ones dispatch may take)."""

    ranked: bool
    matching: dict[str, OrderIndex]
    fresh: list[Message]

    def _init_barriers(self, expression: str | None) -> None:
        self.barrier = compile_expression(expression) if expression else None
        self.barriers: SortedDict = SortedDict()  # seq -> every barrier still queued
        # Priority queues with barriers: the available messages no barrier precedes (the
        # only ones dispatch may take, best first; barriers themselves are sent by their own
        # rule and are in neither), and the others gathered by the nearest barrier before
        # them (barrier seq -> bookmark -> message). When a barrier leaves, what it gathered
        # joins the one before it, or `ahead`: each message moves once per barrier.
        self.ahead: OrderIndex | None = OrderIndex() if self.ranked and expression else None
        self.behind: dict[int, dict[Bookmark, Message]] = {}
        # Barrier queues: how many unfinished messages each barrier waits for
        self.waits: BarrierWaits | None = BarrierWaits() if expression else None

    def _barrier_before(self, seq: int) -> int:
        """The seq of the nearest barrier queued before `seq` (-1: none)."""
        i = self.barriers.bisect_left(seq)
        return self.barriers.keys()[i - 1] if i else -1

    def _hold_behind(self, msg: Message) -> bool:
        """Put an available message with the others behind the barrier before it, if any."""
        before = self._barrier_before(msg.seq)
        if before < 0:
            return False
        self.behind.setdefault(before, {})[msg.bookmark] = msg
        return True

    def _release_behind(self, barrier_seq: int) -> None:
        """A barrier left: what waited behind it waits behind the one before, or goes ahead."""
        if self.ahead is None:
            return
        gathered = self.behind.pop(barrier_seq, {})
        before = self._barrier_before(barrier_seq)
        if before >= 0:
            self.behind.setdefault(before, {}).update(gathered)
            return
        for msg in gathered.values():
            self.ahead[msg.order] = msg
            if self.matching:
                self.fresh.append(msg)
