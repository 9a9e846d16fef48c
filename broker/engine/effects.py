"""What the engine asks the I/O shell to do: output effects, all frozen data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.engine.message import Message
from broker.engine.transitions import Transition
from broker.values import Bookmark


@dataclass(frozen=True, slots=True)
class Journal:
    """Record a state change; it must be durable before any delivery that follows it.

    `message` is the message the change left behind, as `QueueState.apply` returned it (None
    for subscription kinds): the state write encodes it without looking the message up again
    (a paged-out one would cost the pager two reads)."""

    transition: Transition
    message: Message | None = None

    # Written out, as the hot ones are (see Transition): three are built per message.
    def __init__(self, transition: Transition, message: Message | None = None) -> None:
        object.__setattr__(self, "transition", transition)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True, slots=True)
class Deliver:
    client: str
    sub_id: str
    queue: str
    bookmark: Bookmark
    delivery_count: int
    lease_deadline_ms: int | None
    is_barrier: bool = False
    seq: int = -1  # the message's arrival in the queue: tells a re-enqueued bookmark apart

    # written out, one built per delivery: see Journal
    def __init__(self, client: str, sub_id: str, queue: str, bookmark: Bookmark,
                 delivery_count: int, lease_deadline_ms: int | None, is_barrier: bool = False,
                 seq: int = -1) -> None:
        object.__setattr__(self, "client", client)
        object.__setattr__(self, "sub_id", sub_id)
        object.__setattr__(self, "queue", queue)
        object.__setattr__(self, "bookmark", bookmark)
        object.__setattr__(self, "delivery_count", delivery_count)
        object.__setattr__(self, "lease_deadline_ms", lease_deadline_ms)
        object.__setattr__(self, "is_barrier", is_barrier)
        object.__setattr__(self, "seq", seq)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    queue: str
    bookmark: Bookmark
    topic: str
    reason: str
    delivery_count: int
    cancel_count: int


@dataclass(frozen=True, slots=True)
class Reply:
    """A command succeeded; `body` goes back to the client (with `request_id` NOTICE: news
    about its subscriptions it did not ask for)."""

    client: str
    request_id: str
    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CommandRejected:
    client: str
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class Defer:
    """TargetQueueDepth: the queue is full; do not consume this record for it yet."""

    queue: str
    bookmark: Bookmark


@dataclass(frozen=True, slots=True)
class Resume:
    """TargetQueueDepth: the queue has room again; read on from where it stopped."""

    queue: str


@dataclass(frozen=True, slots=True)
class Flow:
    """overflow_policy = flow-control: the record to write to PREFIX.flow (SPEC 5)."""

    queue: str
    state: str  # "pause" | "resume"
    depth: int
    bytes: int
    at_ms: int


Effect = Journal | Deliver | DeadLetter | Reply | CommandRejected | Defer | Resume | Flow
