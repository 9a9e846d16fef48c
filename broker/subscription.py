"""What a subscriber holds: its `Subscription`, yielding `Message`s (SPEC section 7), and the
unpacking of the service's delivery envelopes into them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.errors import CommandError
from broker.formats import decode
from broker.packed import split_blob, unpack_array, unpack_payload
from broker.values import Duration

if TYPE_CHECKING:
    from broker.client import QueueClient


@dataclass
class Message:
    queue: str
    bookmark: str
    data: Any
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    delivery_count: int
    lease_deadline: float | None  # epoch seconds; None for at-most-once (no lease)
    is_barrier: bool
    timestamp: float
    _client: QueueClient = field(repr=False)
    browsed: bool = False  # a copy shown to a browser: nothing is leased, nothing to ack

    def ack(self) -> None:
        if not (self.is_barrier or self.browsed):  # barriers and copies need no ack
            self._client._ack_later(self.queue, self.bookmark)

    def cancel(self, delay: str | None = None) -> None:
        """Return the message to the queue; with `delay` (e.g. "30s") it is available again
        only after that, instead of after the queue's redelivery delay."""
        if self.browsed:
            return
        try:
            delay_ms = Duration.parse(delay).ms if delay is not None else None
        except ValueError as exc:
            raise CommandError(f"bad delay: {exc}") from None
        self._client._send("cancel", queue=self.queue, bookmarks=[self.bookmark],
                           delay_ms=delay_ms)

    def expire(self) -> None:
        if not self.browsed:
            self._client._send("expire", queue=self.queue, bookmarks=[self.bookmark])


def unpack_deliveries(batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The deliveries of a `messages` envelope's packed columns (broker/service/envelopes.py)."""
    payloads = split_blob(batch["payloads"], unpack_array("i", batch["payload_sizes"]))
    for bookmark, dc, deadline, seq, barrier, payload in zip(
            batch["bookmarks"].split("\n"), unpack_array("i", batch["delivery_counts"]),
            unpack_array("q", batch["lease_deadlines"]), unpack_array("q", batch["seqs"]),
            batch["barriers"], payloads, strict=True):
        key, value, headers, ts = unpack_payload(payload)
        yield {"bookmark": bookmark, "delivery_count": dc, "lease_deadline_ms": deadline or None,
               "is_barrier": bool(barrier), "seq": seq, "key": key, "value": value,
               "headers": headers, "timestamp_ms": ts}


def decode_data(fmt: str, value: bytes | None, schema: str | None) -> Any:
    try:
        return decode(fmt, value, schema)
    except ValueError:
        return None


class Subscription:
    def __init__(self, client: QueueClient, queue: str, sub_id: str, backlog: int,
                 mode: str = "queue") -> None:
        self.client, self.queue, self.sub_id, self.backlog = client, queue, sub_id, backlog
        self.mode = mode  # "queue": leases; "browse": copies, the queue is left as it is
        self.schema: str | None = None  # the queue's Avro schema (format = "avro")
        self._buffer: deque[Message] = deque()
        self.closed = False

    def messages(self, timeout: float = 5.0) -> Iterator[Message]:
        """Yield messages as they arrive; stop after `timeout` seconds with nothing new."""
        quiet_since = time.monotonic()
        while not self.closed:
            if self._buffer:
                # Acks go out once half the backlog is acked, not only when the buffer runs
                # dry: the service refills the first half while this one is worked on.
                if self.client._pending_count(self.queue) >= max(1, self.backlog // 2):
                    self.client._flush_acks()
                yield self._buffer.popleft()
                quiet_since = time.monotonic()
                continue
            left = timeout - (time.monotonic() - quiet_since)
            if left <= 0:
                return
            self.client._flush_acks()  # about to wait: send what was acked meanwhile
            self.client._pump(min(left, 0.1))

    def close(self) -> None:
        """End the subscription; leases it holds return to the queue at once."""
        if not self.closed:
            self.closed = True
            self.client._request("unsubscribe", sub_id=self.sub_id)
            self.client._subs.pop(self.sub_id, None)
