"""The payloads of the messages that arrived last, kept in memory for their deliveries.

A delivery carries its message's payload, stored packed in RocksDB at arrival. Reading it
back is a random get, about 3 µs: a tenth of `kq serve`'s instructions in a drain. But in a
queue that keeps up each delivery comes soon after its message arrived, so the packed
payloads of the latest arrivals stay here too, up to a byte budget (a sixty-fourth of the
shard's `memory_budget`, taken from the pager's part: 1 MiB by default, about a second's
payloads at 5,000 messages a second), the oldest dropped first, and all of them
once the service falls idle (what they leave behind in Python's allocator stays resident:
the budget is kept small for that). A payload is the same for every reading of its record (a
bookmark names one record), so an entry is never stale: one whose message is gone only
waits to be dropped.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from broker.state.layout import as_packed, payload_key
from broker.state.store import Store
from broker.values import Bookmark

SHARE: Final = 64  # the budget: this fraction of a shard's memory budget
# What an entry holds besides its payload's bytes: the bytes object and the dict's slot
ENTRY_OVERHEAD: Final = 100


def budget_of(shard_budget: int) -> int:
    return shard_budget // SHARE


class RecentPayloads:
    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._held = 0  # bytes, as counted against the budget
        self._payloads: dict[Bookmark, bytes] = {}
        self._order: deque[Bookmark] = deque()  # the same, in arrival order: oldest first

    def __len__(self) -> int:
        return len(self._payloads)

    def add(self, bm: Bookmark, packed: bytes) -> None:
        """`bm`'s record arrived: its payload joins the latest (one read again, after a
        rewind, is the same record: kept as it is)."""
        size = len(packed) + ENTRY_OVERHEAD
        if size > self._budget or bm in self._payloads:
            return
        self._payloads[bm] = packed
        self._order.append(bm)
        self._held += size
        while self._held > self._budget:  # the oldest make room
            self._held -= len(self._payloads.pop(self._order.popleft())) + ENTRY_OVERHEAD

    def get(self, bm: Bookmark) -> bytes | None:
        return self._payloads.get(bm)

    def shed_memory(self) -> bool:
        """The service fell idle: nothing arrives, nothing is acked, so no delivery is near.
        The payloads go (their memory with them, at the idle trim); deliveries that come
        later read from the store, ahead when in order."""
        self._payloads, self._order, self._held = {}, deque(), 0
        return True

    def read(self, bm: Bookmark, store: Store) -> bytes | None:
        """`bm`'s payload, not kept here: from the store (None: it has none)."""
        return as_packed(store.get(payload_key(bm)))
