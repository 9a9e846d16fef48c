"""Payloads of a deep queue's messages paged back in, held until their delivery.

A message paged out while the service had its payload in hand carries the payload in its
pager row (broker.state.pager); paged back in, the payload waits here, so that delivering it
reads nothing from the store. Bounded by bytes, not by messages (a payload may be up to a
megabyte): when the newer half reaches its budget it becomes the older half and the older
half is dropped as a whole. A payload dropped, or never held, is read from the store:
holding one is only ever a saving.
"""

from __future__ import annotations

from typing import Final

from broker.values import Bookmark

BYTES_KEPT: Final = 2 << 20  # per half
ENTRY: Final = 100  # what an entry costs besides its payload (the bytes object, its slot)


class HeldPayloads:
    def __init__(self, budget: int = BYTES_KEPT) -> None:
        self._budget = budget
        self._newer: dict[Bookmark, bytes] = {}
        self._older: dict[Bookmark, bytes] = {}
        self._newer_bytes = 0  # put into `_newer` since it was started

    def hold(self, bm: Bookmark, payload: bytes) -> None:
        self._newer[bm] = payload
        self._newer_bytes += len(payload) + ENTRY
        if self._newer_bytes >= self._budget:
            self._older, self._newer, self._newer_bytes = self._newer, {}, 0

    def take(self, bm: Bookmark) -> bytes | None:
        """`bm`'s payload, handed over once; None when none is held."""
        return self._newer.pop(bm, None) or self._older.pop(bm, None)

    def clear(self) -> None:
        self._newer, self._older, self._newer_bytes = {}, {}, 0
