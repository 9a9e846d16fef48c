"""The subscriber client (SPEC section 7).

Commands go to PREFIX.commands; messages and replies come back on PREFIX.deliver.<name>.
Subscribing and batch acks wait for the service's answer and raise `CommandError` when it
refuses; `msg.ack()`, `msg.cancel()` and `msg.expire()` are sent without waiting, and any
refusal the service sends back is kept in `client.errors`. `msg.ack()` is batched: the acks
made while handling messages go out together when half the subscription's backlog is acked,
when the subscriber next waits for messages, at the next heartbeat, on `flush()` or
`close()`, or every ACK_BATCH acks.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from confluent_kafka import TopicPartition

from broker import wire
from broker.errors import CommandError, KqError
from broker.kafka import clients
from broker.publisher import Publisher  # noqa: F401 - part of this module's API (SPEC 5)
from broker.shards import join_answers, shard_by_name
from broker.subscription import (
    Message,
    Subscription,
    decode_data,
    lost_in_notice,
    subscribe_again,
    subscribe_command,
    unpack_deliveries,
)
from broker.values import CLIENT_NAME, NOTICE, Bookmark

__all__ = ["QueueClient", "Subscription", "Message", "CommandError"]

log = logging.getLogger("kq.client")

ACK_BATCH = 200
OWN_TOPIC_NEEDED = "own command topic"  # in the service's refusal of a shared-topic command
RECEIVED_KEPT = 10_000  # deliveries remembered to drop a copy sent again after a crash


class QueueClient:
    def __init__(self, bootstrap_servers: str, name: str | None = None, topic_prefix: str = "kq",
                 kafka_config: dict[str, Any] | None = None, principal: str | None = None,
                 request_timeout: float = 10.0, heartbeat_interval: float = 1.0) -> None:
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if not CLIENT_NAME.match(self.name):
            raise ValueError(f"bad client name {self.name!r}: use 1-200 of A-Z a-z 0-9 . _ -")
        # entitlements: as given, else the SASL user the Kafka connection logs in as, else
        # the client's name
        self.principal = principal or str((kafka_config or {}).get("sasl.username") or self.name)
        self.request_timeout = request_timeout
        self.errors: list[str] = []  # refusals of commands sent without waiting
        self._prefix = topic_prefix
        extra = dict(kafka_config or {})
        clients.check_reachable(bootstrap_servers, extra)
        self._deliver_topic = f"{topic_prefix}.deliver.{self.name}"
        self._admin = clients.admin(bootstrap_servers, extra)
        clients.ensure_topics(self._admin, [self._deliver_topic])
        # A queue's commands go to its shard's partition: by its name's hash until the
        # service says otherwise (a queue with a `shard` key: broker.shards)
        self._shards = 1
        self._queue_shards: dict[str, int] = {}
        self._count_shards()
        # Commands start on the shared topic; a service with [auth] refuses them there, and
        # the client moves to its principal's own topic (see _use_own_command_topic).
        self._commands_topic = f"{topic_prefix}.commands"
        self._own_commands_topic = f"{topic_prefix}.commands.{self.principal}"
        # No idempotent producer: its start-up handshake costs ~0.5 s on some brokers, and one
        # request in flight keeps commands in order just as well. Never creates the command
        # topic by writing to it: the service makes it, one partition per shard.
        self._producer = clients.producer(bootstrap_servers, extra, **{
            "linger.ms": 1, "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1, "allow.auto.create.topics": False})
        self._consumer = clients.consumer(bootstrap_servers, extra)
        start = clients.end_offset(self._consumer, self._deliver_topic, 0)
        self._consumer.assign([TopicPartition(self._deliver_topic, 0, start)])
        self._lock = threading.RLock()
        self._subs: dict[str, Subscription] = {}
        self._received: OrderedDict[tuple[str, str, int, int], None] = OrderedDict()
        self._replies: dict[str, tuple[str | None, dict[str, Any]]] = {}
        self._chunks: dict[str, dict[int, dict[str, Any]]] = {}  # replies arriving in chunks
        self._waiting: set[str] = set()
        self._closed = threading.Event()
        self._heartbeat_s = heartbeat_interval
        # msg.ack() is batched: one command per queue carries every ack made between two
        # waits for messages (or ACK_BATCH of them), the way AMPS clients batch acks.
        self._pending_acks: dict[str, list[str]] = {}
        self._again: threading.Thread | None = None  # subscribing again what was dropped
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="kq-heartbeat")
        self._heartbeat.start()

    # -- public API ------------------------------------------------------------------------
    def subscribe(self, queue: str, filter: str | None = None, max_backlog: int | None = None,
                  mode: str = "queue", replay_period: str | None = None) -> Subscription:
        """Subscribe to a queue. mode="queue" leases messages (at most `max_backlog` at a
        time, default 1); mode="browse" is shown a copy of every message in the queue and of
        each new one, in arrival order, leasing nothing (with `replay_period`, e.g. "60s",
        only those published within that period before now)."""
        if self._shards == 1:
            self._count_shards()  # the service may have made more since this client began
        asked = subscribe_command(queue, filter, max_backlog, mode, replay_period)
        sub_id = uuid.uuid4().hex
        sub = Subscription(self, queue, sub_id, 0, mode, asked)
        self._subs[sub_id] = sub  # registered first: deliveries may beat the reply
        try:
            self._subscribe(sub)
        except KqError:
            self._subs.pop(sub_id, None)
            raise
        return sub

    def _subscribe(self, sub: Subscription) -> None:
        """Send `sub`'s subscribe command and take the answer (raise on a refusal)."""
        body = self._request("subscribe", sub_id=sub.sub_id, **sub.asked)
        sub.backlog = int(body.get("backlog", 0))
        if isinstance(body.get("shard"), int):
            self._queue_shards[sub.queue] = body["shard"]
        if body.get("heartbeat_ms"):
            self._heartbeat_s = min(self._heartbeat_s, body["heartbeat_ms"] / 4000)
        sub.confirmed, sub.lost = True, None

    def ack(self, queue: str, bookmarks: Iterable[str | Bookmark]) -> None:
        """Acknowledge many messages at once; raise CommandError naming any refused."""
        self._request("ack", queue=queue, bookmarks=[str(b) for b in bookmarks])

    def ack_where(self, queue: str, expression: str) -> int:
        """Ack every active message of `queue` that `expression` matches (available ones,
        and leased ones this client holds, or any with `leasing = "permissive"`); return
        how many."""
        return int(self._request("ack_where", queue=queue, filter=expression)["acked"])

    def flush(self) -> None:
        """Send every batched ack now, and wait until Kafka has them."""
        self._flush_acks()
        self._producer.flush(self.request_timeout)

    def query(self, **args: Any) -> dict[str, Any]:
        """Ask the service about its state (what the CLI uses). A query about one queue goes
        to its shard; one about all of them to every shard at once, the answers' lists joined
        (a snapshot's parts come as `shards`, one per shard). Shards that do not answer in
        time (no owner just now) are listed in `unanswered_shards`; when none answers, or a
        snapshot misses one, it raises."""
        if args.get("queue") or self._shards == 1:
            return self._request("query", query=json.dumps(args))
        answers = self._ask_shards("query", range(self._shards), query=json.dumps(args))
        missing = [k for k in range(self._shards) if k not in answers]
        if not answers or (missing and args.get("what") == "snapshot"):
            raise KqError(f"no answer from shard(s) {', '.join(map(str, missing))} of the kq "
                          f"service within {self.request_timeout}s (is each shard owned? see "
                          "`kq instances`)")
        if args.get("what") == "snapshot":
            return {"shards": [answers[k] for k in sorted(answers)]}
        return join_answers(answers, missing)

    def _ask_shards(self, kind: str, shards: Iterable[int], **fields: Any) -> dict[int, Any]:
        """One request to each shard, sent together and awaited together: the answers of
        those that answered within the request timeout."""
        rids = {uuid.uuid4().hex: k for k in shards}
        self._waiting.update(rids)
        try:
            for rid, k in rids.items():
                self._send(kind, request_id=rid, shard=k, **fields)
            self._producer.flush(self.request_timeout)
            deadline = time.monotonic() + self.request_timeout
            while (any(rid not in self._replies for rid in rids)
                   and time.monotonic() < deadline):
                self._pump(0.05)
        finally:
            self._waiting.difference_update(rids)
        replies = {rid: self._replies.pop(rid) for rid in rids if rid in self._replies}
        errors = [error for error, _ in replies.values() if error is not None]
        if any(OWN_TOPIC_NEEDED in e for e in errors) and self._use_own_command_topic():
            return self._ask_shards(kind, rids.values(), **fields)
        if errors:
            raise CommandError(errors[0])
        return {rids[rid]: body for rid, (_, body) in replies.items()}

    def close(self) -> None:
        """Leave: every subscription ends and its leases return to the queues at once."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._flush_acks()
            for shard in self._shards_used():
                self._send("close", shard=shard)
            self._producer.flush(5)
        finally:
            self._consumer.close()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------
    def _count_shards(self) -> None:
        """The shard count: the command topic's partitions (the service makes the topic, with
        one partition per shard)."""
        # not there yet (no service has run): one until it is; each subscribe counts again
        self._shards = clients.topic_partitions(self._admin).get(f"{self._prefix}.commands", 1)

    def shard_of(self, queue: str) -> int:
        return self._queue_shards.get(queue, shard_by_name(queue, self._shards))

    def _shards_used(self) -> set[int]:
        """The shards of the queues this client subscribes to (client-wide commands go to
        each of them)."""
        return {self.shard_of(sub.queue) for sub in list(self._subs.values())}

    def _send(self, kind: str, request_id: str = "", shard: int | None = None,
              **fields: Any) -> None:
        if kind != "ack" and self._pending_acks:
            self._flush_acks()  # batched acks go first: a close must not overtake them
        record: dict[str, Any] = {"type": kind, "client": self.name, "request_id": request_id,
                  "queue": None, "sub_id": None, "max_backlog": None, "filter": None,
                  "mode": None, "bookmarks": [], "query": None, "principal": self.principal,
                  "replay_period_ms": None, "delay_ms": None,
                  "sent_ms": int(time.time() * 1000)}
        record.update(fields)
        if shard is None:
            sub = self._subs.get(record["sub_id"] or "")
            queue = record["queue"] or (sub.queue if sub is not None else "")
            shard = self.shard_of(queue)
        self._producer.produce(self._commands_topic, wire.encode("command", record),
                               partition=shard)
        self._producer.poll(0)

    def _ack_later(self, queue: str, bookmark: str) -> None:
        with self._lock:
            pending = self._pending_acks.setdefault(queue, [])
            pending.append(bookmark)
            full = len(pending) >= ACK_BATCH
        if full:
            self._flush_acks()

    def _pending_count(self, queue: str) -> int:
        return len(self._pending_acks.get(queue, ()))

    def _flush_acks(self) -> None:
        with self._lock:
            batches, self._pending_acks = self._pending_acks, {}
        for queue, bookmarks in batches.items():
            self._send("ack", queue=queue, bookmarks=bookmarks)

    def _request(self, kind: str, **fields: Any) -> dict[str, Any]:
        rid = uuid.uuid4().hex
        self._waiting.add(rid)
        try:
            self._send(kind, request_id=rid, **fields)
            self._producer.flush(self.request_timeout)
            deadline = time.monotonic() + self.request_timeout
            while rid not in self._replies:
                if time.monotonic() > deadline:
                    raise KqError(f"no answer from the kq service to {kind} within "
                                  f"{self.request_timeout}s (is `kq serve` running with topic "
                                  f"prefix {self._prefix!r}?)")
                self._pump(0.05)
        finally:
            self._waiting.discard(rid)
        error, body = self._replies.pop(rid)
        if error is not None and OWN_TOPIC_NEEDED in error and self._use_own_command_topic():
            return self._request(kind, **fields)
        if error is not None:
            raise CommandError(error)
        return body

    def _use_own_command_topic(self) -> bool:
        """A service with [auth] keeps a command topic per principal (which Kafka ACLs can
        reserve for it) and believes the topic, not the record: once it says so, use ours if
        it exists. True when this switched to it."""
        own = self._own_commands_topic
        if self._commands_topic == own or own not in clients.topic_partitions(self._admin):
            return False
        self._commands_topic = own
        return True

    def _pump(self, timeout: float) -> None:
        """Read what the service sent and route it to subscriptions and waiting requests."""
        with self._lock:
            records = clients.take(self._consumer, 500, timeout)
        for rec in records:
            if rec.error():
                continue
            try:
                env = wire.decode("envelope", rec.value())
            except ValueError as exc:
                log.warning("ignored an unreadable record on %s: %s", self._deliver_topic, exc)
                continue
            if env["kind"] == "messages":
                for d in unpack_deliveries(env["batch"]):
                    self._route_message(env["sub_id"], env["queue"], env["format"], d)
                continue
            if env["kind"] == "message":  # one message per record, as older services send
                env["headers"] = [(h["key"], h["value"]) for h in env["headers"]]
                self._route_message(env["sub_id"], env["queue"], env["format"], env)
                continue
            rid = env["request_id"]
            if rid == NOTICE and env["kind"] == "reply":
                self._take_notice(json.loads(env["body"] or "{}"))
            elif rid in self._waiting:
                self._take_reply(rid, env["error"], json.loads(env["body"] or "{}"))
            elif env["kind"] == "error" and not rid:
                log.warning("the service refused a command: %s", env["error"])
                self.errors.append(env["error"])

    def _take_notice(self, body: dict[str, Any]) -> None:
        """News from the service about this client's subscriptions: it dropped some (it heard
        no heartbeat in time), or a shard heard a heartbeat and holds none of them (the news
        of a drop was lost to a crash). Those are subscribed again by the heartbeat thread."""
        lost, reason = lost_in_notice(body, list(self._subs.values()), self.shard_of)
        for sub in lost:
            if not sub.closed and sub.lost is None:
                log.warning("the kq service dropped subscription %s to %s (%s): subscribing "
                            "again", sub.sub_id, sub.queue, reason)
                sub.dropped(reason)

    def _take_reply(self, rid: str, error: str | None, body: dict[str, Any]) -> None:
        """Keep a reply; a large one comes in chunks ({"chunk": i, "chunks": n, "rows": [...]}
        with the other fields in chunk 0), kept once all are in, rows in order."""
        sub = self._subs.get(body.get("sub_id") or "")
        if sub is not None and body.get("mode") in ("queue", "browse"):
            # what the service made of it (a nondestructive queue only browses) and the
            # queue's Avro schema: known before the messages that follow the reply
            sub.mode = body["mode"]
            sub.schema = body.get("schema")
        chunks = body.get("chunks")
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

    def _route_message(self, sub_id: str, queue: str, fmt: str, d: dict[str, Any]) -> None:
        sub = self._subs.get(sub_id)
        if sub is None:  # a delivery for a subscription of an earlier life of this name
            return
        # After a crash the service sends its last leases again, not knowing whether they
        # went out: a copy of one already received (same message, same delivery count) is
        # dropped. The queue's arrival number tells a bookmark enqueued again apart.
        key = (sub_id, d["bookmark"], d["seq"], d["delivery_count"])
        if key in self._received:
            return
        self._received[key] = None
        if len(self._received) > RECEIVED_KEPT:
            self._received.popitem(last=False)
        deadline = d["lease_deadline_ms"]
        sub._buffer.append(Message(
            queue=queue, bookmark=d["bookmark"], data=decode_data(fmt, d["value"], sub.schema),
            value=d["value"], key=d["key"], headers=d["headers"],
            delivery_count=d["delivery_count"],
            lease_deadline=None if deadline is None else deadline / 1000,
            is_barrier=d["is_barrier"], timestamp=d["timestamp_ms"] / 1000, _client=self,
            browsed=sub.mode == "browse",
        ))

    def _beat(self) -> None:
        while not self._closed.wait(self._heartbeat_s):
            if self._subs:
                try:
                    self._flush_acks()
                    for shard in self._shards_used():
                        self._send("heartbeat", shard=shard)
                    self._start_subscribing_again()
                except Exception as exc:  # never let the heartbeat thread die silently
                    log.warning("heartbeat failed: %s", exc)

    def _start_subscribing_again(self) -> None:
        """In a thread of its own: waiting for a shard without an owner must not hold up
        the heartbeats of the others."""
        if ((self._again is None or not self._again.is_alive())
                and any(s.lost and not s.closed for s in list(self._subs.values()))):
            self._again = threading.Thread(target=subscribe_again, args=(self,), daemon=True,
                                           name="kq-subscribe-again")
            self._again.start()
