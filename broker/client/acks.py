"""Acks batched: `msg.ack()` keeps the message here, and the acks kept leave together as one
command per queue (packed: broker/client/core.py's `ack_command`) once as many are kept as
half the backlog of the queue acked (its smallest subscription's), so that the service refills
that half while the other is worked on.

Keeping runs once per message, from any of a worker's threads, so it takes no lock: it is one
`list.append`, which Python makes atomic, of the message itself (which carries its queue,
bookmark and delivery count: nothing is built). Taking is rarer and takes a lock, so that two
takers never send one ack twice: it cuts the first n messages kept off the list, and messages
appended meanwhile land after them. (A lock taken per ack cost a worker more than everything
else it does to keep one: two method calls through Python, compiled or not.)
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from broker.client.message import Message

ACK_BATCH: Final = 500  # acks carried by one command at most


class AckBatches:
    """Thread-safe: a worker's handlers ack from several threads while one reads."""

    def __init__(self) -> None:
        self._kept: list[Message] = []  # in the order acked
        self._taking = threading.Lock()
        # per queue subscribed: half its smallest backlog, at most ACK_BATCH (1: not subscribed)
        self._due: dict[str, int] = {}

    def subscribed(self, queue: str, smallest_backlog: int) -> None:
        self._due[queue] = min(ACK_BATCH, max(1, smallest_backlog // 2))

    def keep(self, msg: Message) -> bool:
        """Keep one ack; True when the acks kept should go now."""
        kept = self._kept
        kept.append(msg)
        return len(kept) >= self._due.get(msg.queue, 1)

    def pending(self) -> bool:
        """Whether any ack is kept."""
        return bool(self._kept)

    def take(self) -> list[tuple[str, list[str], list[int]]]:
        """Every ack kept, as (queue, bookmarks, delivery counts) in the order acked, at most
        ACK_BATCH each."""
        with self._taking:
            n = len(self._kept)
            taken = self._kept[:n]
            del self._kept[:n]
        by_queue: dict[str, tuple[list[str], list[int]]] = {}
        for msg in taken:
            columns = by_queue.get(msg.queue)
            if columns is None:
                columns = by_queue[msg.queue] = ([], [])
            columns[0].append(msg.bookmark)
            columns[1].append(msg.delivery_count)
        return [(queue, bookmarks[i:i + ACK_BATCH], counts[i:i + ACK_BATCH])
                for queue, (bookmarks, counts) in by_queue.items()
                for i in range(0, len(bookmarks), ACK_BATCH)]
