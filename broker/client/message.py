"""A delivered message (SPEC section 7), and the unpacking of the service's delivery
envelopes into them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from broker.formats import decode
from broker.packed import Headers, split_blob, unpack_array, unpack_payload


@mypyc_attr(allow_interpreted_subclasses=True)  # the async client's AsyncMessage
@dataclass
class Message:
    """One delivery of a message to a subscription.

    `data` is the payload decoded by the queue's format (a dict for JSON objects and Avro;
    None when it does not parse), decoded when first read; `value` the raw bytes.
    `delivery_count` says which delivery this is: `ack()`, `cancel()`, `expire()` and
    `extend()` answer this delivery only, and are refused once its lease is gone (the message
    may be delivered again meanwhile)."""

    queue: str
    bookmark: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    delivery_count: int
    lease_deadline: float | None  # epoch seconds; None for at-most-once (no lease)
    is_barrier: bool
    timestamp: float  # the record's timestamp, epoch seconds
    _client: Any = field(repr=False)
    browsed: bool = False  # a copy shown to a browser: nothing is leased, nothing to ack
    answered: bool = field(default=False, repr=False)  # acked, cancelled or expired here
    _format: str = field(default="json", repr=False)  # the queue's: how `data` reads `value`
    _schema: str | None = field(default=None, repr=False)  # the queue's Avro schema, if any
    _data: Any = field(default=None, repr=False)
    _decoded: bool = field(default=False, repr=False)

    @property
    def data(self) -> Any:
        # decoded on first use: a worker that reads only `value` pays nothing for it
        if not self._decoded:
            self._data, self._decoded = decode_data(self._format, self.value, self._schema), True
        return self._data

    @property
    def settles(self) -> bool:
        """Whether acking means anything (barriers and browsed copies need no answer)."""
        return not (self.is_barrier or self.browsed)

    def ack(self, wait: bool = False) -> None:
        """Acknowledge: the message is done. Batched with other acks unless `wait`; with
        `wait`, sent now and confirmed, raising `LeaseLost` if the lease is gone. A refused
        batched ack is reported in `client.errors` and to `on_refused`."""
        if self.settles:
            self.answered = True
            self._client._ack(self, wait)

    def cancel(self, delay: str | float | None = None) -> None:
        """Give the message back to the queue; with `delay` ("30s", or seconds) it is
        available again only after that, instead of after the queue's redelivery delay."""
        if not self.browsed:
            self.answered = True
            self._client._cancel(self, delay)

    def expire(self) -> None:
        """Remove the message from the queue (dead-lettered with reason expire-requested)."""
        if not self.browsed:
            self.answered = True
            self._client._expire(self)

    def extend(self, period: str | float) -> float:
        """Renew the lease: its deadline becomes now + `period` ("30s", or seconds), also
        past the queue's `lease_period`. Returns the new deadline (epoch seconds); raises
        `LeaseLost` when the lease is no longer this subscription's."""
        deadline: float = self._client._extend(self, period)
        return deadline


# One delivery as `unpack_deliveries` yields it: a plain tuple, one made per message (cheaper
# to build and to read than a dict): (bookmark, delivery_count, lease_deadline_ms or None,
# is_barrier, seq, key, value, headers, timestamp_ms)
Delivery = tuple[str, int, int | None, bool, int, bytes | None, bytes | None, Headers, int]


def unpack_deliveries(batch: dict[str, Any]) -> Iterator[Delivery]:
    """The deliveries of a `messages` envelope's packed columns (broker/service/envelopes.py)."""
    payloads = split_blob(batch["payloads"], unpack_array("i", batch["payload_sizes"]))
    for bookmark, dc, deadline, seq, barrier, payload in zip(
            batch["bookmarks"].split("\n"), unpack_array("i", batch["delivery_counts"]),
            unpack_array("q", batch["lease_deadlines"]), unpack_array("q", batch["seqs"]),
            batch["barriers"], payloads, strict=True):
        key, value, headers, ts = unpack_payload(payload)
        yield bookmark, dc, deadline or None, bool(barrier), seq, key, value, headers, ts


def decode_data(fmt: str, value: bytes | None, schema: str | None) -> Any:
    try:
        return decode(fmt, value, schema)
    except ValueError:
        return None
