"""A queue's held messages: in the queue, not available until their `not_before_ms`.

A part of `QueueState` (its base class). When a message is held and when it is released is
`broker.engine.holds`'s rule; this keeps them apart from the available ones, so dispatch,
paging and the filters' indexes never see one early, and lets them go when due. Releasing is
not journaled: it follows from the time, so a replay or a restart holds the message again
and the first tick after its moment releases it.
"""

from __future__ import annotations

import heapq

from mypy_extensions import trait

from broker.engine.message import Message
from broker.values import Bookmark


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class Holding:
    messages: dict[Bookmark, Message]
    held: dict[Bookmark, Message]
    hold_timers: list[tuple[int, int, Bookmark]]  # (not_before, seq, bm): a heap, lazy

    def _make_available(self, msg: Message) -> None:
        raise NotImplementedError

    def _hold(self, msg: Message) -> None:
        assert msg.not_before_ms is not None
        self.messages[msg.bookmark] = msg
        self.held[msg.bookmark] = msg
        heapq.heappush(self.hold_timers, (msg.not_before_ms, msg.seq, msg.bookmark))

    def _unhold(self, msg: Message) -> bool:
        """Take a held message out of the held ones (it is leaving). False if not held."""
        if self.held.pop(msg.bookmark, None) is None:
            return False
        msg.not_before_ms = None
        return True

    def release_due(self, now: int) -> int:
        """Make available the held messages due by `now`; how many there were."""
        timers, released = self.hold_timers, 0
        while timers and timers[0][0] <= now:
            at, _, bm = heapq.heappop(timers)
            msg = self.held.get(bm)
            if msg is None or msg.not_before_ms != at:
                continue  # stale: it left, or was held again until later
            self._unhold(msg)
            self._make_available(msg)
            released += 1
        return released
