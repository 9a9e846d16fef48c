"""How many of a queue's messages carry each record timestamp, for the oldest one's age."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Final

CHUNK: Final = 512  # timestamps per chunk before it splits in two


class Stamps:
    """Distinct record timestamps with how many messages carry each, 16 bytes per timestamp.

    A queue fed slowly gives each message a millisecond of its own, so this is sized per
    message: as a dict of counts and a heap (about 124 bytes a timestamp) it was more than
    the rest of a paged-out message. Kept in sorted chunks of two arrays (timestamps, counts)
    with each chunk's last timestamp for bisection: adding the newest timestamp appends,
    any other costs a bisection and a move within one chunk, and the oldest is the first
    element. Removing the last message of a timestamp drops it at once.
    """

    __slots__ = ("_stamps", "_counts", "_lasts", "_chunk", "_len")

    def __init__(self, chunk: int = CHUNK) -> None:
        self._stamps: list[array[int]] = []
        self._counts: list[array[int]] = []
        self._lasts: list[int] = []
        self._chunk = chunk
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def oldest(self) -> int | None:
        return self._stamps[0][0] if self._stamps else None

    def add(self, ts: int, n: int = 1) -> None:
        lasts = self._lasts
        if lasts and ts == lasts[-1]:  # the newest again: a burst within one millisecond
            self._counts[-1][-1] += n
            return
        if not lasts or ts > lasts[-1]:  # newer: as records mostly arrive
            if not lasts or len(self._stamps[-1]) >= self._chunk:
                self._stamps.append(array("q"))
                self._counts.append(array("q"))
                lasts.append(ts)
            self._stamps[-1].append(ts)
            self._counts[-1].append(n)
            lasts[-1] = ts
            self._len += 1
            return
        i = bisect_left(lasts, ts)
        stamps, counts = self._stamps[i], self._counts[i]
        j = bisect_left(stamps, ts)
        if stamps[j] == ts:  # (j < len: lasts[i] >= ts)
            counts[j] += n
            return
        stamps.insert(j, ts)
        counts.insert(j, n)
        self._len += 1
        if len(stamps) > 2 * self._chunk:
            half = len(stamps) // 2
            self._stamps[i + 1:i + 1] = [stamps[half:]]
            self._counts[i + 1:i + 1] = [counts[half:]]
            del stamps[half:], counts[half:]
            lasts.insert(i, stamps[-1])

    def remove(self, ts: int) -> None:
        """One message of timestamp `ts` (added before) has left."""
        stamps = self._stamps[0]
        if stamps[0] == ts:  # the oldest, as messages mostly leave in arrival order: no search
            i, j, counts = 0, 0, self._counts[0]
        else:
            i = bisect_left(self._lasts, ts)
            stamps, counts = self._stamps[i], self._counts[i]
            j = bisect_left(stamps, ts)
        if counts[j] > 1:
            counts[j] -= 1
            return
        del stamps[j], counts[j]
        self._len -= 1
        if not stamps:
            del self._stamps[i], self._counts[i], self._lasts[i]
        elif j == len(stamps):
            self._lasts[i] = stamps[-1]
