"""The client's protocol with the service, without I/O (the way h11 keeps HTTP apart from
sockets): the sync client, the async client and `kq worker` each drive one `ClientCore` with
their own Kafka transport.

The core turns calls into command records (`Outgoing`: the partition of PREFIX.commands and
the encoded bytes) and takes in the records of PREFIX.deliver.<name> (`receive`): deliveries go
to their subscription's buffer (copies sent again after a service crash dropped), replies to
the request waiting for them, refusals of commands nobody waits for to `errors` and
`on_refused`, news of dropped subscriptions to the subscriptions. It batches acks: `ack`
keeps one, `take_acks` gives the commands that carry them. Every ack, cancel, expire and
extend names the delivery it answers (its delivery count), so the service never applies one
to a later delivery of the same message.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

from mypy_extensions import mypyc_attr

from broker import wire
from broker.client.acks import AckBatches
from broker.client.message import Message, batch_of, read_columns
from broker.errors import CommandError, KqError
from broker.packed import pack_array, unpack_delivered
from broker.shards import shard_by_name
from broker.values import CLIENT_NAME, NOTICE

log = logging.getLogger("kq.client")

OWN_TOPIC_NEEDED: Final = "own command topic"  # in the service's refusal of a shared-topic command
# Deliveries a subscription remembers to drop a copy sent again after a crash (at least, at
# most twice as many): a crash's copies are what its last three journaled batches sent
# (broker.service.recovery), a backlog of leases or 500 browsed (BROWSE_BATCH) per batch at
# most, and a dict that small stays in the CPU's cache.
RECEIVED_PER_BACKLOG: Final = 4
RECEIVED_KEPT: Final = 2_000


class LeaseLost(CommandError):
    """The lease a call answers is no longer this subscription's: it lapsed, was cancelled,
    or the message was delivered again (to this worker or another)."""


@dataclass(frozen=True)
class Outgoing:
    """A command record to produce: to PREFIX.commands (or the principal's own topic),
    partition `shard`."""

    shard: int
    value: bytes


@mypyc_attr(allow_interpreted_subclasses=True)  # the sync and async Subscriptions
class SubscriptionState:
    """What the core knows of one subscription; the sync and async `Subscription`s add the
    waiting."""

    def __init__(self, queue: str, sub_id: str, mode: str, asked: dict[str, Any]) -> None:
        self.queue, self.sub_id, self.mode = queue, sub_id, mode
        self.backlog = 0
        self.schema: str | None = None  # the queue's Avro schema (format = "avro")
        self.asked = asked  # the subscribe command's fields: sent again if it is dropped
        self.confirmed = False  # the service answered the subscribe
        self.lost: str | None = None  # why the service dropped it (until subscribed again)
        self.failure: str | None = None  # why subscribing again was refused
        self.closed = False
        self.buffer: deque[Message] = deque()
        # seq (or bookmark) -> delivery count, received lately, oldest first (_deliver)
        self.received: dict[object, int] = {}
        self.received_kept = RECEIVED_KEPT  # (sized by the backlog once subscribed)

    def arrived(self) -> None:
        """Messages were added to the buffer (the async subscription wakes its reader)."""

    def dropped(self, reason: str) -> None:
        """The service ended this subscription on its own (it heard nothing from this client
        for its heartbeat timeout): the leases of messages not handed out yet went back to
        the queue, so they are not handed out; the client subscribes again."""
        self.lost = reason
        self.buffer.clear()

    def refused(self, error: str) -> None:
        """Subscribing again was refused: reading messages raises it."""
        self.failure, self.closed = error, True
        self.arrived()


class ClientCore:
    """One client's state of the conversation with the service. Thread-safe: a worker's
    handlers ack from several threads while one reads."""

    def __init__(self, name: str, principal: str, message: type[Message] = Message,
                 owner: Any = None, on_refused: Callable[[str], None] | None = None) -> None:
        if not CLIENT_NAME.match(name):
            raise ValueError(f"bad client name {name!r}: use 1-200 of A-Z a-z 0-9 . _ -")
        self.name, self.principal = name, principal
        self.instance = uuid.uuid4().hex  # this process's, sent with its commands
        self.message, self.owner = message, owner  # what deliveries become, bound to whom
        self.on_refused = on_refused
        self.errors: list[str] = []  # refusals of commands sent without waiting
        self.shards = 1
        self.queue_shards: dict[str, int] = {}  # queues whose shard the service told
        self.subs: dict[str, SubscriptionState] = {}
        self.heartbeat_s: float | None = None  # asked for by the service's replies
        self._lock = threading.Lock()
        self._replies: dict[str, tuple[str | None, dict[str, Any]]] = {}
        self._chunks: dict[str, dict[int, dict[str, Any]]] = {}
        self._waiting: set[str] = set()
        self.acks = AckBatches()
        self.closed = False  # set by the client's close: nothing more may be sent

    # -- commands --------------------------------------------------------------------------
    def shard_of(self, queue: str) -> int:
        return self.queue_shards.get(queue, shard_by_name(queue, self.shards))

    def shards_used(self) -> set[int]:
        """The shards of the queues subscribed to (client-wide commands go to each)."""
        return {self.shard_of(sub.queue) for sub in list(self.subs.values())}

    def command(self, kind: str, request_id: str = "", shard: int | None = None,
                **fields: Any) -> list[Outgoing]:
        """The records of one command; batched acks go first (a close, a cancel or an
        unsubscribe must not overtake them)."""
        self.check_open()
        out = self.take_acks() if kind != "ack" else []
        record: dict[str, Any] = {
            "type": kind, "client": self.name, "request_id": request_id, "queue": None,
            "sub_id": None, "max_backlog": None, "filter": None, "mode": None, "bookmarks": [],
            "query": None, "principal": self.principal, "replay_period_ms": None,
            "delay_ms": None, "delivery_counts": [], "period_ms": None,
            "packed_bookmarks": "", "packed_counts": None, "sent_ms": int(time.time() * 1000),
            "instance": self.instance}
        record.update(fields)
        if shard is None:
            sub = self.subs.get(record["sub_id"] or "")
            queue = record["queue"] or (sub.queue if sub is not None else "")
            shard = self.shard_of(queue)
        out.append(Outgoing(shard, wire.encode("command", record)))
        return out

    def request(self, kind: str, shard: int | None = None,
                **fields: Any) -> tuple[str, list[Outgoing]]:
        """A command whose answer is awaited: its request id and records."""
        rid = uuid.uuid4().hex
        with self._lock:
            self._waiting.add(rid)
        return rid, self.command(kind, request_id=rid, shard=shard, **fields)

    def answer(self, rid: str) -> tuple[str | None, dict[str, Any]] | None:
        """The (error, body) that answered request `rid`, once it came (taken once)."""
        with self._lock:
            found = self._replies.pop(rid, None)
            if found is not None:
                self._waiting.discard(rid)
            return found

    def forget(self, rid: str) -> None:
        """Stop waiting for `rid` (timed out): a late answer is dropped."""
        with self._lock:
            self._waiting.discard(rid)
            self._replies.pop(rid, None)

    def ack(self, msg: Message) -> bool:
        """Keep an ack for the next batch; True when the acks kept should go now."""
        if self.closed:
            self.check_open()
        return self.acks.keep(msg)

    def check_open(self) -> None:
        """Raise if the client was closed: its leases went back at the close, and an ack
        kept or a command made now would go nowhere (or out of a closed consumer)."""
        if self.closed:
            raise KqError(f"client {self.name} is closed: its leases went back to the "
                          "queues at the close")

    def take_acks(self) -> list[Outgoing]:
        """The commands carrying every ack kept."""
        out = []
        for queue, bookmarks, counts in self.acks.take():
            out += self.ack_command(queue, bookmarks, counts)
        return out

    def ack_command(self, queue: str, bookmarks: list[str], counts: list[int]) -> list[Outgoing]:
        """One command acking these deliveries (bookmarks, and the delivery count each
        answers), packed into one string and one buffer, not arrays: Avro reads and writes an
        array item by item."""
        return self.command("ack", queue=queue, packed_bookmarks="\n".join(bookmarks),
                            packed_counts=pack_array("i", counts))

    def settle(self, kind: str, msg: Message, request_id: str = "",
               **fields: Any) -> list[Outgoing]:
        """A cancel, expire, extend or lone ack of one delivery."""
        return self.command(kind, request_id=request_id, queue=msg.queue,
                            bookmarks=[msg.bookmark], delivery_counts=[msg.delivery_count],
                            **fields)

    # -- subscriptions ---------------------------------------------------------------------
    def add(self, sub: SubscriptionState) -> None:
        self.subs[sub.sub_id] = sub  # first: deliveries may beat the subscribe's reply

    def subscribed(self, sub: SubscriptionState, body: dict[str, Any]) -> None:
        """The service's answer to `sub`'s subscribe."""
        sub.backlog = int(body.get("backlog", 0))
        sub.received_kept = max(RECEIVED_KEPT, RECEIVED_PER_BACKLOG * sub.backlog)
        backlogs = [s.backlog for s in self.subs.values() if s.queue == sub.queue]
        self.acks.subscribed(sub.queue, min(backlogs, default=0))
        if isinstance(body.get("shard"), int):
            self.queue_shards[sub.queue] = body["shard"]
        if body.get("heartbeat_ms"):
            beat = body["heartbeat_ms"] / 4000
            self.heartbeat_s = beat if self.heartbeat_s is None else min(self.heartbeat_s, beat)
        sub.confirmed, sub.lost = True, None

    def abandon(self, sub: SubscriptionState, failure: Exception,
                service_seen: bool) -> list[Outgoing]:
        """Forget a subscription whose subscribe failed with `failure`. One the service
        refused (CommandError), or that no service could see (`service_seen`: one has run
        with the prefix), does not exist there; one it did not answer in time it may still
        make, and lease to until the leases lapse (deliveries to a subscription not known
        here are dropped): the records of an unsubscribe, which follows the subscribe on its
        partition, undo it."""
        self.subs.pop(sub.sub_id, None)
        if isinstance(failure, CommandError) or not service_seen or self.closed:
            return []  # (a close sent its own commands)
        return self.command("unsubscribe", shard=self.shard_of(sub.queue), sub_id=sub.sub_id)

    def remove(self, sub: SubscriptionState) -> None:
        sub.closed = True
        self.subs.pop(sub.sub_id, None)
        sub.arrived()

    def lost(self) -> list[SubscriptionState]:
        """Subscriptions the service dropped, to subscribe again."""
        return [s for s in list(self.subs.values()) if s.lost and not s.closed]

    # -- what the service sends ------------------------------------------------------------
    def receive(self, value: bytes | None) -> None:
        """Take one record of this client's delivery topic."""
        try:
            env = wire.decode("envelope", value or b"")
        except ValueError as exc:
            log.warning("ignored an unreadable record on the delivery topic: %s", exc)
            return
        try:
            if env["kind"] == "messages":
                self._deliver(env["sub_id"], env["queue"], env["format"], env["batch"])
                return
            if env["kind"] == "message":  # one message per record, as older services send
                headers = [(h["key"], h["value"]) for h in env["headers"]]
                self._deliver(env["sub_id"], env["queue"], env["format"], batch_of([(
                    env["bookmark"], env["delivery_count"], env["lease_deadline_ms"],
                    env["is_barrier"], env["seq"], env["key"], env["value"], headers,
                    env["timestamp_ms"])]))
                return
        except (ValueError, IndexError) as exc:  # columns or payloads that do not add up
            log.warning("ignored an unreadable record on the delivery topic: %s", exc)
            return
        rid = env["request_id"]
        if rid == NOTICE and env["kind"] == "reply":
            self._notice(json.loads(env["body"] or "{}"))
        elif rid in self._waiting:
            self._reply(rid, env["error"], json.loads(env["body"] or "{}"))
        elif env["kind"] == "error" and not rid:
            self.refused(env["error"])

    def refused(self, error: str) -> None:
        """A command sent without waiting was refused (a late ack, a cancel of a lapsed
        lease): kept in `errors` and given to `on_refused`."""
        log.warning("the service refused a command: %s", error)
        self._report(error)

    def _report(self, error: str) -> None:
        self.errors.append(error)
        if self.on_refused is not None:
            try:
                self.on_refused(error)
            except Exception:  # noqa: BLE001 - the caller's callback must not stop reading
                log.exception("on_refused raised")

    def _notice(self, body: dict[str, Any]) -> None:
        """News about this client's subscriptions: the service dropped some (it heard no
        heartbeat in time), or a shard heard a heartbeat and holds none of them (the news
        of a drop was lost to a crash). Those are subscribed again by the transport."""
        if body.get("notice") == "name-in-use":
            self._name_in_use()
            return
        if body.get("notice") == "dropped":
            ids = set(body.get("sub_ids") or ())
            subs, reason = [s for s in self.subs.values() if s.sub_id in ids], body.get("reason")
        elif body.get("notice") == "no-subscriptions":
            shard = body.get("shard")
            subs = [s for s in self.subs.values()
                    if s.confirmed and shard in (None, self.shard_of(s.queue))]
            reason = "the service holds none of this client's"
        else:  # a notice of a newer service
            return
        for sub in subs:
            if not sub.closed and sub.lost is None:
                log.warning("the kq service dropped subscription %s to %s (%s): subscribing "
                            "again", sub.sub_id, sub.queue, reason)
                sub.dropped(str(reason or ""))

    def _name_in_use(self) -> None:
        """Another live process uses this client's name (both are told): kept in `errors`
        and given to `on_refused`, as a refusal is."""
        error = (f"another live process uses the client name {self.name!r}: a close by "
                 "either ends the other's subscriptions, and a dead one's leases wait for "
                 "their lease period; give each process a name of its own")
        log.error("%s", error)
        self._report(error)

    def _reply(self, rid: str, error: str | None, body: dict[str, Any]) -> None:
        """Keep a reply; a large one comes in chunks ({"chunk": i, "chunks": n, "rows": [...]}
        with the other fields in chunk 0), kept once all are in, rows in order."""
        sub = self.subs.get(body.get("sub_id") or "")
        if sub is not None and body.get("mode") in ("queue", "browse"):
            # what the service made of it (a nondestructive queue only browses) and the
            # queue's Avro schema: known before the messages that follow the reply
            sub.mode = body["mode"]
            sub.schema = body.get("schema")
        chunks = body.get("chunks")
        with self._lock:
            if error is not None or not chunks:
                self._replies[rid] = (error, body)
                return
            parts = self._chunks.setdefault(rid, {})
            parts[body["chunk"]] = body
            if len(parts) == chunks:
                del self._chunks[rid]
                whole = {k: v for k, v in parts[0].items() if k not in ("chunk", "chunks")}
                whole["rows"] = [row for i in range(chunks) for row in parts[i]["rows"]]
                self._replies[rid] = (None, whole)

    def _deliver(self, sub_id: str, queue: str, fmt: str, batch: dict[str, Any]) -> None:
        """Hand one envelope's deliveries (its batch's columns) to their subscription."""
        sub = self.subs.get(sub_id)
        if sub is None:  # a delivery for a subscription of an earlier life of this name
            return
        bookmarks, counts, deadlines, seqs, barriers, sizes, blob = read_columns(batch)
        make, owner, browsed, schema = self.message, self.owner, sub.mode == "browse", sub.schema
        # the sync client's messages: built by a direct call when compiled, and their acks
        # batched here without a call through the client (the async ones' are coroutines)
        native = make is Message
        received, fresh = sub.received, []
        start = 0  # where the next payload starts in the blob: each follows the one before
        with self._lock:
            for i, bookmark in enumerate(bookmarks):
                at = start
                start += sizes[i]
                # After a crash the service sends its last leases again: a copy of one
                # received (same message, same delivery count) is dropped, and so is one
                # older than one received (its lease is gone). Kept by the queue's arrival
                # number, which tells a bookmark enqueued again apart (an int's hash is in
                # the dict, a string's read from it: a cache miss per probe); by bookmark
                # when 0 (a first message, or one journaled before) or -1 (an old service).
                count, seq = counts[i], seqs[i]
                seen: object = seq if seq > 0 else bookmark
                before = received.get(seen)
                if before is not None:
                    if count <= before:
                        continue
                    del received[seen]  # delivered again: now among the latest
                received[seen] = count
                key, value, headers, ts = unpack_delivered(blob, at)
                deadline = deadlines[i] / 1000 if deadlines[i] else None
                # by position, in Message's order: keywords cost a dict per message (2.7
                # times as long to build one, compiled)
                if native:
                    fresh.append(Message(queue, bookmark, value, key, headers, count, deadline,
                                         barriers[i] != 0, ts / 1000, owner, browsed, False,
                                         fmt, schema, None, False, self))
                else:
                    fresh.append(make(queue, bookmark, value, key, headers, count, deadline,
                                      barriers[i] != 0, ts / 1000, owner, browsed, False, fmt,
                                      schema))
            kept = sub.received_kept
            if len(received) > 2 * kept:  # forget the oldest, many at once
                sub.received = dict(islice(received.items(), len(received) - kept, None))
        if fresh:
            sub.buffer.extend(fresh)
            sub.arrived()


def refusal_error(error: str, settle: bool) -> CommandError:
    """The exception for a refusal: `LeaseLost` for an answer to a delivery whose lease is
    gone (`settle`: the command was an ack, cancel, expire or extend of one delivery)."""
    if settle and ("lease lost" in error or "not in queue" in error
                   or "not leased to" in error or "leased to another" in error):
        return LeaseLost(error)
    return CommandError(error)
