"""What a subscriber holds: its `Subscription`, yielding `Message`s (SPEC section 7), made again
when the service drops it; and the unpacking of the service's delivery envelopes into them."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.errors import CommandError, KqError
from broker.formats import decode
from broker.packed import split_blob, unpack_array, unpack_payload
from broker.values import Duration

if TYPE_CHECKING:
    from broker.client import QueueClient

log = logging.getLogger("kq.client")


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


def subscribe_command(queue: str, filter: str | None, max_backlog: int | None, mode: str,
                      replay_period: str | None) -> dict[str, Any]:
    """The fields of a subscribe command for these arguments of `QueueClient.subscribe`
    (kept: sent again if the service drops the subscription); CommandError on a bad one."""
    if mode not in ("queue", "browse"):
        raise CommandError(f"unknown mode {mode!r}: use 'queue' or 'browse'")
    replay_ms = None
    if replay_period is not None:
        if mode != "browse":
            raise CommandError("replay_period applies to mode='browse' only")
        try:
            replay_ms = Duration.parse(replay_period).ms
        except ValueError as exc:
            raise CommandError(f"bad replay_period: {exc}") from None
    if max_backlog is not None and (isinstance(max_backlog, bool)
                                    or not isinstance(max_backlog, int)):
        raise CommandError(f"max_backlog must be an integer >= 0, got {max_backlog!r}")
    return {"queue": queue, "filter": filter, "max_backlog": max_backlog, "mode": mode,
            "replay_period_ms": replay_ms}


def lost_in_notice(body: dict[str, Any], subs: list[Subscription],
                   shard_of: Callable[[str], int]) -> tuple[list[Subscription], str]:
    """The subscriptions a notice from the service says it no longer holds, and why: those it
    dropped (by id), or all those made on a shard that heard a heartbeat and holds none of
    them. Nothing for a notice of a newer service this client does not know."""
    if body.get("notice") == "dropped":
        ids = set(body.get("sub_ids") or ())
        return [s for s in subs if s.sub_id in ids], str(body.get("reason") or "")
    if body.get("notice") == "no-subscriptions":
        shard = body.get("shard")
        return ([s for s in subs if s.confirmed and shard in (None, shard_of(s.queue))],
                "the service holds none of this client's")
    return [], ""


def decode_data(fmt: str, value: bytes | None, schema: str | None) -> Any:
    try:
        return decode(fmt, value, schema)
    except ValueError:
        return None


class Subscription:
    def __init__(self, client: QueueClient, queue: str, sub_id: str, backlog: int,
                 mode: str = "queue", asked: dict[str, Any] | None = None) -> None:
        self.client, self.queue, self.sub_id, self.backlog = client, queue, sub_id, backlog
        self.mode = mode  # "queue": leases; "browse": copies, the queue is left as it is
        self.schema: str | None = None  # the queue's Avro schema (format = "avro")
        # what the subscribe command asked for: sent again if the service drops this one
        self.asked = asked or {}
        self.confirmed = False  # the service answered the subscribe
        self.lost: str | None = None  # why the service dropped it (until subscribed again)
        self.failure: str | None = None  # why subscribing again was refused: raised
        self._buffer: deque[Message] = deque()
        self.closed = False

    def messages(self, timeout: float = 5.0) -> Iterator[Message]:
        """Yield messages as they arrive; stop after `timeout` seconds with nothing new.
        Raise CommandError when the service dropped this subscription and refused it again."""
        quiet_since = time.monotonic()
        while not self.closed:
            if self._buffer:
                # Acks go out once half the backlog is acked, not only when the buffer runs
                # dry: the service refills the first half while this one is worked on.
                if self.client._pending_count(self.queue) >= max(1, self.backlog // 2):
                    self.client._flush_acks()
                try:
                    msg = self._buffer.popleft()
                except IndexError:  # another thread emptied it meanwhile (a drop notice)
                    continue
                yield msg
                quiet_since = time.monotonic()
                continue
            left = timeout - (time.monotonic() - quiet_since)
            if left <= 0:
                return
            self.client._flush_acks()  # about to wait: send what was acked meanwhile
            self.client._pump(min(left, 0.1))
        if self.failure is not None:
            raise CommandError(f"subscription to {self.queue!r} was dropped by the service and "
                               f"could not be made again: {self.failure}")

    def dropped(self, reason: str) -> None:
        """The service ended this subscription on its own (it heard nothing from this client
        for its heartbeat timeout): the leases of the messages not handed out yet went back
        to the queue, so they are not handed out; the client subscribes again."""
        self.lost = reason
        self._buffer.clear()

    def refused(self, error: str) -> None:
        """Subscribing again was refused: messages() raises it."""
        self.failure, self.closed = error, True
        self.client._subs.pop(self.sub_id, None)

    def close(self) -> None:
        """End the subscription; leases it holds return to the queue at once."""
        if not self.closed:
            self.closed = True
            self.client._request("unsubscribe", sub_id=self.sub_id)
            self.client._subs.pop(self.sub_id, None)


def subscribe_again(client: QueueClient) -> None:
    """Subscribe again what the service dropped, with the same id and what it asked for. A
    refusal ends the subscription (its messages() raises it); no answer (no owner for the
    shard just now) is tried again at the next heartbeat."""
    for sub in [s for s in list(client._subs.values()) if s.lost and not s.closed]:
        try:
            client._subscribe(sub)
        except CommandError as exc:
            log.error("subscribing again to %s was refused: %s", sub.queue, exc)
            sub.refused(str(exc))
        except KqError as exc:
            log.warning("subscribing again to %s: %s; trying again", sub.queue, exc)
        else:
            log.warning("subscribed again to %s", sub.queue)
