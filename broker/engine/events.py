"""What can happen to the engine: input events, all frozen data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.expr import Doc
from broker.values import Bookmark


@dataclass(frozen=True, slots=True)
class MessageArrived:
    queue: str
    bookmark: Bookmark
    timestamp_ms: int
    size: int = 0  # bytes of key, value and headers
    doc: Doc | None = None  # what expressions see of it (None: nothing, all NULL)
    # its headers, even when `doc` is None (kq-expiration, kq-priority); None: doc's
    headers: Mapping[str, bytes | None] | None = None


@dataclass(frozen=True, slots=True)
class Subscribed:
    client: str
    sub_id: str
    queue: str
    max_backlog: int = 1
    request_id: str = ""
    filter: str | None = None
    principal: str | None = None  # who asks, for entitlements (default: client)
    browse: bool = False  # a browser: sees a copy of every message, leases nothing
    replay_ms: int | None = None  # browse: start with messages from this long ago (None: all)


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    client: str
    sub_id: str
    request_id: str = ""
    principal: str | None = None  # who asks (default: client)


@dataclass(frozen=True, slots=True)
class ClientClosed:
    """The client said goodbye: every subscription it holds ends now."""

    client: str
    principal: str | None = None  # who asks (default: client)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    client: str
    principal: str | None = None  # who asks (default: client)


@dataclass(frozen=True, slots=True)
class Acked:
    client: str
    queue: str
    bookmarks: tuple[Bookmark, ...]
    request_id: str = ""
    principal: str | None = None  # who asks, for entitlements (default: client)
    # the delivery each ack answers, one per bookmark (0, or none given: whichever is current)
    delivery_counts: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Cancelled:
    client: str
    queue: str
    bookmark: Bookmark
    request_id: str = ""
    principal: str | None = None  # who asks, for entitlements (default: client)
    delay_ms: int | None = None  # available again after this (None: the queue's delay)
    delivery_count: int = 0  # the delivery it answers (0: whichever is current)


@dataclass(frozen=True, slots=True)
class ExpireRequested:
    client: str
    queue: str
    bookmark: Bookmark
    request_id: str = ""
    principal: str | None = None  # who asks, for entitlements (default: client)
    delivery_count: int = 0  # the delivery it answers (0: whichever is current)


@dataclass(frozen=True, slots=True)
class Extended:
    """Renew a lease: its deadline becomes now + `period_ms` (Kafka share groups: RENEW)."""

    client: str
    queue: str
    bookmark: Bookmark
    delivery_count: int
    period_ms: int
    request_id: str = ""
    principal: str | None = None  # who asks, for entitlements (default: client)


@dataclass(frozen=True, slots=True)
class AckWhere:
    """Acknowledge every active message of the queue the expression matches."""

    client: str
    queue: str
    expression: str
    request_id: str = ""
    principal: str | None = None  # who asks, for entitlements (default: client)


@dataclass(frozen=True, slots=True)
class Configured:
    """At start-up: the queue's configured recovery point, resolved to a start time."""

    queue: str
    recovery_point: str
    start_ms: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: lapse leases, expire messages, drop silent clients."""


Event = (
    MessageArrived
    | Subscribed
    | Unsubscribed
    | ClientClosed
    | Heartbeat
    | Acked
    | Cancelled
    | ExpireRequested
    | Extended
    | AckWhere
    | Configured
    | Tick
)
