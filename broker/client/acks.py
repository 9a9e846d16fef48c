"""Acks batched per queue: `msg.ack()` keeps one here, and they leave together as one command
per queue (packed: broker/client/core.py's `ack_command`) once half the subscription's
backlog is kept, so that the service refills that half while the other is worked on.

Runs once per message: compiled, its calls are native, and its lock is taken with `acquire`
and `release` rather than `with` (which looks up and calls __enter__ and __exit__ through
Python).
"""

from __future__ import annotations

import threading
from typing import Final

ACK_BATCH: Final = 500  # acks carried by one command at most


class _Kept:
    """One queue's acks kept: each bookmark with the delivery count of the delivery it
    answers; due once `due` are kept."""

    def __init__(self, due: int) -> None:
        self.due = due
        self.bookmarks: list[str] = []
        self.counts: list[int] = []


class AckBatches:
    """Thread-safe: a worker's handlers ack from several threads while one reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, _Kept] = {}
        self._due: dict[str, int] = {}  # per queue subscribed: half its smallest backlog

    def subscribed(self, queue: str, smallest_backlog: int) -> None:
        with self._lock:
            self._due[queue] = max(1, smallest_backlog // 2)

    def keep(self, queue: str, bookmark: str, delivery_count: int) -> bool:
        """Keep one ack; True when the queue's acks should go now (a full command, or half
        the backlog)."""
        self._lock.acquire()
        try:
            kept = self._kept.get(queue)
            if kept is None:
                kept = self._kept[queue] = _Kept(min(ACK_BATCH, self._due.get(queue, 1)))
            kept.bookmarks.append(bookmark)
            kept.counts.append(delivery_count)
            return len(kept.bookmarks) >= kept.due
        finally:
            self._lock.release()

    def pending(self) -> bool:
        """Whether any ack is kept (read without the lock: a heartbeat's hint only)."""
        return bool(self._kept)

    def take(self) -> list[tuple[str, list[str], list[int]]]:
        """Every ack kept, as (queue, bookmarks, delivery counts), at most ACK_BATCH each."""
        self._lock.acquire()
        try:
            kept, self._kept = self._kept, {}
        finally:
            self._lock.release()
        return [(queue, k.bookmarks[i:i + ACK_BATCH], k.counts[i:i + ACK_BATCH])
                for queue, k in kept.items() for i in range(0, len(k.bookmarks), ACK_BATCH)]
