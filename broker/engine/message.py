"""What a queue holds: its messages (the payload lives in the store), its subscriptions, its
counters, and a compact column of offsets."""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.engine.states import MessageState
from broker.expr import Doc, Expression
from broker.values import Bookmark


class Message:
    """What the queue knows of one unfinished message (the payload lives in the store)."""

    __slots__ = (
        "bookmark",
        "seq",
        "timestamp_ms",
        "state",
        "delivery_count",
        "cancel_count",
        "holder",
        "deadline_ms",
        "priority",
        "doc",
        "is_barrier",
        "expires_ms",
        "not_before_ms",
        "size",
        "sort_value",
        "group",
    )

    def __init__(
        self,
        bookmark: Bookmark,
        seq: int,
        timestamp_ms: int,
        state: MessageState = MessageState.AVAILABLE,
        delivery_count: int = 0,
        cancel_count: int = 0,
        holder: str | None = None,
        deadline_ms: int | None = None,
    ) -> None:
        self.bookmark = bookmark
        self.seq = seq
        self.timestamp_ms = timestamp_ms
        self.state = state
        self.delivery_count = delivery_count
        self.cancel_count = cancel_count
        self.holder = holder  # sub_id of the lease holder (LEASED, SENT)
        self.deadline_ms = deadline_ms
        self.priority: float | None = None  # NULL and non-numbers are the lowest
        # What expressions see, when kept in memory (engines without a doc loader); with a
        # loader the engine reads it from the store when a filter asks.
        self.doc: Doc | None = None
        self.is_barrier = False
        # its own expiry (broker.engine.ttl), or None: the queue's `expiration`, if any
        self.expires_ms: int | None = None
        # held until then (broker.engine.holds), or None: available when not leased
        self.not_before_ms: int | None = None
        self.size = 0  # bytes of key, value and headers, kept when the queue has max_bytes
        self.sort_value: tuple[int, float | str] | None = None  # sorted queues (ordering)
        self.group: str | None = None  # message groups: its group_key's value (engine.groups)

    @property
    def order(self) -> Any:
        """Where it stands among the available: highest priority first, then oldest (in a
        sorted queue: by its sort key, then oldest)."""
        if self.sort_value is not None:
            return (self.sort_value, self.seq)
        if self.priority is None:
            return (math.inf, self.seq)
        return (-self.priority, self.seq)

    def __repr__(self) -> str:
        return f"Message({self.bookmark}, {self.state.value}, dc={self.delivery_count})"


@dataclass(eq=False)
class Subscription:
    sub_id: str
    client: str
    queue: str
    max_backlog: int  # as asked by the subscriber
    cap: int  # min(max_backlog, max_per_subscription_backlog)
    held: set[Bookmark] = field(default_factory=set)
    filter: Expression | None = None
    # A browser leases nothing: it is shown a copy of each message in arrival order; cursor
    # is the seq of the last one shown (or skipped, journaled), looked_upto the last one it
    # has looked at (seqs only grow, so a browser with looked_upto at the queue's last seq
    # has nothing left to see).
    browse: bool = False
    cursor: int = -1
    principal: str | None = None  # under [auth]: the client's commands must come from it
    looked_upto: int = -1

    def wants(self, doc: Doc | None) -> bool:
        """Whether the filter takes a message that expressions see as `doc`."""
        if self.filter is None:
            return True
        return doc is not None and self.filter.matches(doc)

    @property
    def room(self) -> int:
        return self.cap - len(self.held)


@dataclass
class QueueStats:
    """Counters that survive restarts (they are stored with the queue)."""

    next_seq: int = 0
    enqueued: int = 0
    acked: int = 0
    delivered: int = 0
    removed: Counter[str] = field(default_factory=Counter)
    dead_lettered: int = 0


class Ascending:
    """Integers appended in ascending order, kept as steps from the first one: 4 bytes each
    (8 once one is more than 2**32 past it); `first` drops from the front the ones no longer
    wanted (each once), so the lowest wanted one costs amortised O(1)."""

    __slots__ = ("_values", "_head", "_base")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._values = array("I")
        self._head = 0
        self._base = 0
        for value in values:
            self.append(value)

    def __len__(self) -> int:
        return len(self._values) - self._head

    def append(self, value: int) -> None:
        """Add VALUE, above `last()`; with none wanted left, any value starts the column
        afresh (a queue read again from an earlier offset: its base may be below the old)."""
        values = self._values
        if self._head == len(values):
            if values:
                values = self._values = array("I")
                self._head = 0
            self._base = value
        step = value - self._base
        if step > 0xFFFF_FFFF and values.typecode == "I":
            values = self._values = array("q", values)
        values.append(step)

    def last(self) -> int | None:
        return self._base + self._values[-1] if len(self) else None

    def first(self, wanted: Callable[[int], bool]) -> int | None:
        values, base = self._values, self._base
        while self._head < len(values) and not wanted(base + values[self._head]):
            self._head += 1
        if self._head > 4096 and 2 * self._head > len(values):
            del values[:self._head]
            self._head = 0
        return base + values[self._head] if self._head < len(values) else None
