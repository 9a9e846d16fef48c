"""Acks batched: `msg.ack()` keeps the message here, and the acks kept leave together as one
command per queue (packed: broker/client/core.py's `ack_command`) once as many are kept as
half the backlog of the queue acked (its smallest subscription's), so that the service refills
that half while the other is worked on. A subscriber about to wait for messages sends what
it kept once the oldest ack kept is ACK_LINGER_S old: at a steady rate each delivery would
otherwise bring back a command of a few acks (a Kafka request of the worker's, a record for
the service to read), and a short wait lets the acks of several deliveries go as one.

Keeping runs once per message, from any of a worker's threads, so it takes no lock: it is one
`list.append`, which Python makes atomic, of the message itself (which carries its queue,
bookmark and delivery count: nothing is built). Taking is rarer and takes a lock, so that two
takers never send one ack twice: it cuts the first n messages kept off the list, and messages
appended meanwhile land after them. (A lock taken per ack cost a worker more than everything
else it does to keep one: two method calls through Python, compiled or not.)
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from broker.client.message import Message

ACK_BATCH: Final = 500  # acks carried by one command at most
# How long an ack may be kept while the subscriber waits for messages: short against any lease
# and a heartbeat; at 5,000 msgs/s over 4 workers it cuts their ack commands by about four.
ACK_LINGER_S: Final = 0.02


class AckBatches:
    """Thread-safe: a worker's handlers ack from several threads while one reads."""

    def __init__(self) -> None:
        self._kept: list[Message] = []  # in the order acked
        self._taking = threading.Lock()
        # per queue subscribed: half its smallest backlog, at most ACK_BATCH (1: not subscribed)
        self._due: dict[str, int] = {}
        self._kept_since = 0.0  # when the oldest ack kept was kept (monotonic seconds)

    def subscribed(self, queue: str, smallest_backlog: int) -> None:
        self._due[queue] = min(ACK_BATCH, max(1, smallest_backlog // 2))

    def keep(self, msg: Message) -> bool:
        """Keep one ack; True when the acks kept should go now."""
        kept = self._kept
        if not kept:  # (a race with a take only makes the acks go sooner)
            self._kept_since = time.monotonic()
        kept.append(msg)
        return len(kept) >= self._due.get(msg.queue, 1)

    def pending(self) -> bool:
        """Whether any ack is kept."""
        return bool(self._kept)

    def due(self, wait: float) -> tuple[bool, float]:
        """About to wait up to `wait` seconds for messages: whether the acks kept should go
        now (the oldest is ACK_LINGER_S old), and how long to wait at most so that those not
        yet due go in time."""
        if not self._kept:
            return False, wait
        left = ACK_LINGER_S - (time.monotonic() - self._kept_since)
        return left <= 0, wait if left <= 0 else min(wait, left)

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
