"""Journal entries: every change of queue state, as data.

The engine decides a change, turns it into a `Transition`, and applies it with
`QueueState.apply`. Recovery replays journaled transitions through the same `apply`, so the
live path and the replay path cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker.engine.states import Action
from broker.values import Bookmark


class Kind(StrEnum):
    ENQUEUED = "enqueued"
    LEASED = "leased"
    SENT = "sent"
    ACKED = "acked"
    RETURNED = "returned"
    REMOVED = "removed"
    RELEASED = "released"
    SUBSCRIBED = "subscribed"
    UNSUBSCRIBED = "unsubscribed"
    REMEMBERED = "remembered"  # an ack of a message not active yet, honoured on arrival
    CONFIGURED = "configured"  # a queue's recovery point: reason = as configured, timestamp_ms
    BROWSED = "browsed"  # a browser has been shown every message up to seq
    EXTENDED = "extended"  # a lease renewed by its holder: deadline_ms is the new deadline


# The message action each message-level kind performs.
ACTION_OF: dict[Kind, Action] = {
    Kind.ENQUEUED: Action.ENQUEUE,
    Kind.LEASED: Action.LEASE,
    Kind.SENT: Action.SEND,
    Kind.ACKED: Action.ACK,
    Kind.RETURNED: Action.RETURN,
    Kind.REMOVED: Action.REMOVE,
    Kind.RELEASED: Action.RELEASE,
}


class Reason(StrEnum):
    """Why a message was returned or removed (`kq-reason` on dead letters)."""

    LAPSED = "lapsed"
    CANCELLED = "cancelled"
    UNSUBSCRIBED = "unsubscribed"
    DISCONNECTED = "disconnected"
    MAX_DELIVERIES = "max-deliveries"
    MAX_CANCELS = "max-cancels"
    EXPIRED = "expired"
    EXPIRE_REQUESTED = "expire-requested"
    RESET = "reset"  # the queue's recovery point changed: it starts again from the new one
    TOO_LARGE = "too-large"  # bigger than the largest record kq may deliver
    BARRIER_SENT = "barrier-sent"  # a barrier leaves the queue once sent, without an ack
    REPLACED = "replaced"  # last-value queue: a newer message with the same key came
    OVERFLOW = "overflow"  # over max_messages / max_bytes with overflow_policy = reject
    OVERFLOW_RING = "overflow-ring"  # the oldest available, over a limit with ring


# Not frozen, though nothing changes one once made: one is built per transition, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs 2.5 times as much.
@dataclass(slots=True)
class Transition:
    kind: Kind
    queue: str
    at_ms: int
    bookmark: Bookmark | None = None
    sub_id: str | None = None
    client: str | None = None
    delivery_count: int = 0
    cancel_count: int = 0
    deadline_ms: int | None = None  # LEASED, SENT, EXTENDED: of the lease; ENQUEUED: expiry
    reason: str | None = None
    seq: int = 0  # ENQUEUED: arrival order within the queue
    timestamp_ms: int = 0  # ENQUEUED: the record's timestamp
    max_backlog: int = 0  # SUBSCRIBED: what the subscriber asked for
    filter: str | None = None  # SUBSCRIBED: the subscription's filter
    priority: float | None = None  # ENQUEUED: the value of the queue's priority expression
    barrier: bool = False  # ENQUEUED: the queue's barrier expression matched it
    browse: bool = False  # SUBSCRIBED: a browser (copies, no leases); seq: where it starts
    principal: str | None = None  # SUBSCRIBED: who subscribed, under [auth]
    not_before_ms: int | None = None  # ENQUEUED, RETURNED: held until then (engine.holds)
    size: int | None = None  # ENQUEUED, with max_bytes: key + value + headers
    sort_text: str | None = None  # ENQUEUED, sorted queue: a sort key that is a string
    group: str | None = None  # ENQUEUED, message groups: the value of the queue's group_key
