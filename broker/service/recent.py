"""The payloads of the messages that arrived last, kept in memory for their deliveries.

A delivery carries its message's payload, stored packed in RocksDB at arrival. Reading it
back is a random get: a tenth of `kq serve`'s instructions in a drain of 20,000. But most
deliveries come soon after their message arrived (a queue that keeps up, a backlog that
fits), so the packed payloads of the latest arrivals stay here too, up to a byte budget
(a sixteenth of the shard's `memory_budget`, taken from the pager's part), the oldest
dropped first. A payload is the same for every reading of its record (a bookmark names one
record), so an entry is never stale: one whose message is gone only waits to be dropped.
"""

from __future__ import annotations

from typing import Final

from broker.values import Bookmark

SHARE: Final = 16  # the budget: this fraction of a shard's memory budget
# What an entry holds besides its payload's bytes: the bytes object and the dict's slot
ENTRY_OVERHEAD: Final = 100


def budget_of(shard_budget: int) -> int:
    return shard_budget // SHARE


class RecentPayloads:
    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._held = 0  # bytes, as counted against the budget
        self._payloads: dict[Bookmark, bytes] = {}  # in arrival order: the oldest first

    def __len__(self) -> int:
        return len(self._payloads)

    def add(self, bm: Bookmark, packed: bytes) -> None:
        """`bm`'s record arrived (again): its payload joins the latest."""
        old = self._payloads.pop(bm, None)
        if old is not None:
            self._held -= len(old) + ENTRY_OVERHEAD
        size = len(packed) + ENTRY_OVERHEAD
        if size > self._budget:
            return
        self._payloads[bm] = packed
        self._held += size
        while self._held > self._budget:  # the oldest make room
            oldest = next(iter(self._payloads))
            self._held -= len(self._payloads.pop(oldest)) + ENTRY_OVERHEAD

    def get(self, bm: Bookmark) -> bytes | None:
        return self._payloads.get(bm)
