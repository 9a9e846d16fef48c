"""`QueueClient`: the subscriber client for threads (SPEC section 7), the Kafka transport of
a `ClientCore`.

Commands go to PREFIX.commands; messages and replies come back on PREFIX.deliver.<name>.
Subscribing, batch acks, `extend` and `ack(wait=True)` wait for the service's answer and raise
`CommandError` (`LeaseLost` for a lease that is gone) when it refuses; `msg.ack()`,
`msg.cancel()` and `msg.expire()` are sent without waiting, and any refusal the service sends
back is kept in `client.errors` and given to `on_refused`. `msg.ack()` is batched: the acks
made while handling messages go out together when half the subscription's backlog is acked,
when the subscriber has waited for messages with acks kept for ACK_LINGER_S (20 ms), when
`messages()` returns, at the next heartbeat, on `flush()` or `close()`, or every ACK_BATCH
acks.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from broker.client.arguments import (
    bookmark_list,
    duration_ms,
    seconds,
    subscribe_command,
    waits,
)
from broker.client.core import (
    OWN_TOPIC_NEEDED,
    ClientCore,
    Outgoing,
    SubscriptionState,
    refusal_error,
)
from broker.client.message import Message
from broker.client.transport import Transport, client_name, closed_while_waiting, principal_of
from broker.errors import CommandError, KqError
from broker.shards import join_answers

log = logging.getLogger("kq.client")


class QueueClient:
    """A connection to the kq service: subscribe to queues, ack, query. A context manager;
    `close()` (or leaving the `with`) returns every lease held at once.

    `name` must be unique among running clients, two in one process included (the delivery
    topic is PREFIX.deliver.<name>; one is made up when not given). `on_refused(error)` is
    called with each refusal of a command sent without waiting (a late ack), besides keeping
    it in `errors`."""

    def __init__(self, bootstrap_servers: str, name: str | None = None, topic_prefix: str = "kq",
                 kafka_config: dict[str, Any] | None = None, principal: str | None = None,
                 request_timeout: str | float = 10.0, heartbeat_interval: str | float = 1.0,
                 on_refused: Callable[[str], None] | None = None) -> None:
        request_timeout, heartbeat_interval = waits(request_timeout, heartbeat_interval)
        self.name = client_name(name)
        self.principal = principal_of(self.name, principal, kafka_config)
        self.core = ClientCore(self.name, self.principal, Message, self, on_refused)
        self.request_timeout = request_timeout
        self._io = Transport(bootstrap_servers, self.name, topic_prefix, self.principal,
                             kafka_config)
        self.core.shards = self._io.shard_count()
        self._closed = threading.Event()
        self._beating = threading.Lock()  # no heartbeat goes out after the close command
        self._heartbeat_s = heartbeat_interval
        self._again: threading.Thread | None = None  # subscribing again what was dropped
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="kq-heartbeat")
        self._heartbeat.start()

    @property
    def errors(self) -> list[str]:
        """Refusals of commands sent without waiting (late acks, cancels of lapsed leases)."""
        return self.core.errors

    # -- public API ------------------------------------------------------------------------
    def subscribe(self, queue: str, filter: str | None = None, max_backlog: int | None = None,
                  mode: str = "queue", replay_period: str | None = None) -> Subscription:
        """Subscribe to a queue. mode="queue" leases messages (at most `max_backlog` at a
        time, default 1); mode="browse" is shown a copy of every message in the queue and of
        each new one, in arrival order, leasing nothing (with `replay_period`, e.g. "60s",
        only those published within that period before now). Raises CommandError when the
        service refuses (unknown queue, bad filter, not entitled)."""
        self.core.check_open()
        if self.core.shards == 1:
            self.core.shards = self._io.shard_count()  # the service may have made more
        asked = subscribe_command(queue, filter, max_backlog, mode, replay_period)
        sub = Subscription(self, queue, uuid.uuid4().hex, mode, asked)
        self.core.add(sub)
        try:
            self._subscribe(sub)
        except KqError as exc:
            self._send(self.core.abandon(sub, exc, self._io.service_seen))
            raise
        return sub

    def _subscribe(self, sub: SubscriptionState) -> None:
        """Send `sub`'s subscribe command and take the answer (raise on a refusal)."""
        body = self._request("subscribe", sub_id=sub.sub_id, **sub.asked)
        self.core.subscribed(sub, body)
        if self.core.heartbeat_s is not None:
            self._heartbeat_s = min(self._heartbeat_s, self.core.heartbeat_s)

    def ack(self, queue: str, bookmarks: Iterable[str]) -> None:
        """Acknowledge many messages at once, by bookmark (whichever delivery each is in; a
        single bookmark may be given alone); raise CommandError naming any refused."""
        self._request("ack", queue=queue, bookmarks=bookmark_list(bookmarks))

    def ack_where(self, queue: str, expression: str) -> int:
        """Ack every active message of `queue` that `expression` matches (available ones,
        and leased ones this client holds, or any with `leasing = "permissive"`); return
        how many."""
        return int(self._request("ack_where", queue=queue, filter=expression)["acked"])

    def flush(self) -> None:
        """Send every batched ack now, and wait until Kafka has them."""
        self._io.send(self.core.take_acks())
        self._io.producer.flush(self.request_timeout)

    def query(self, **args: Any) -> dict[str, Any]:
        """Ask the service about its state (what the CLI uses). A query about one queue goes
        to its shard; one about all of them to every shard at once, the answers' lists joined
        (a snapshot's parts come as `shards`, one per shard). Shards that do not answer in
        time (no owner just now) are listed in `unanswered_shards`; when none answers, or a
        snapshot misses one, it raises."""
        shards = self.core.shards
        if args.get("queue") or shards == 1:
            return self._request("query", query=json.dumps(args))
        answers = self._ask_shards("query", range(shards), query=json.dumps(args))
        missing = [k for k in range(shards) if k not in answers]
        if not answers or (missing and args.get("what") == "snapshot"):
            raise KqError(f"no answer from shard(s) {', '.join(map(str, missing))} of the kq "
                          f"service within {self.request_timeout}s (is each shard owned? see "
                          "`kq instances`)")
        if args.get("what") == "snapshot":
            return {"shards": [answers[k] for k in sorted(answers)]}
        return join_answers(answers, missing)

    def shard_of(self, queue: str) -> int:
        return self.core.shard_of(queue)

    def close(self) -> None:
        """Leave: every subscription ends and its leases return to the queues at once."""
        with self._beating:
            if self._closed.is_set():
                return
            self._closed.set()
        try:
            out = self.core.take_acks()
            for shard in self.core.shards_used():
                out += self.core.command("close", shard=shard)
            self.core.closed = True  # (after the last commands: none may follow them)
            self._io.send(out)
            self._io.producer.flush(5)
        finally:
            for sub in list(self.core.subs.values()):
                self.core.remove(sub)
            self._io.close_consumer()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- what a Message calls --------------------------------------------------------------
    def _ack(self, msg: Message, wait: bool) -> None:
        if wait:
            self._settle_waiting("ack", msg)
        elif self.core.ack(msg):
            self._send_acks()

    def _send_acks(self) -> None:
        """Send the acks batched (a message's ack kept by the core made a batch due)."""
        self._io.send(self.core.take_acks())

    def _cancel(self, msg: Message, delay: str | float | None) -> None:
        delay_ms = None if delay is None else duration_ms(delay, "delay")
        self._send(self.core.settle("cancel", msg, delay_ms=delay_ms))

    def _expire(self, msg: Message) -> None:
        self._send(self.core.settle("expire", msg))

    def _extend(self, msg: Message, period: str | float) -> float:
        period_ms = duration_ms(period, "period", positive=True)
        body = self._settle_waiting("extend", msg, period_ms=period_ms)
        msg.lease_deadline = body["deadline_ms"] / 1000
        return msg.lease_deadline

    def _settle_waiting(self, kind: str, msg: Message, **fields: Any) -> dict[str, Any]:
        try:
            return self._request(kind, queue=msg.queue, bookmarks=[msg.bookmark],
                                 delivery_counts=[msg.delivery_count], **fields)
        except CommandError as exc:
            raise refusal_error(str(exc), settle=True) from None

    # -- plumbing --------------------------------------------------------------------------
    def _send(self, records: list[Outgoing]) -> None:
        self._io.send(records)

    def _pump(self, timeout: float) -> None:
        self._io.read(self.core, timeout)

    def _request(self, kind: str, **fields: Any) -> dict[str, Any]:
        rid, records = self.core.request(kind, **fields)
        try:
            self._io.check_service()
            deadline = time.monotonic() + self.request_timeout  # the flush within it too
            self._send(records)
            self._io.producer.flush(self.request_timeout)
            while (answer := self.core.answer(rid)) is None:
                self._check_not_closed(kind)
                if time.monotonic() > deadline:
                    raise self._io.no_answer(kind, self.request_timeout)
                self._pump(0.05)
        finally:
            self.core.forget(rid)
        error, body = answer
        if error is not None and OWN_TOPIC_NEEDED in error and self._io.use_own_command_topic():
            return self._request(kind, **fields)
        if error is not None:
            raise CommandError(error)
        return body

    def _ask_shards(self, kind: str, shards: Iterable[int], **fields: Any) -> dict[int, Any]:
        """One request to each shard, sent together and awaited together: the answers of
        those that answered within the request timeout."""
        self.core.check_open()
        self._io.check_service()
        asked = {}
        for k in shards:
            rid, records = self.core.request(kind, shard=k, **fields)
            asked[rid] = k
            self._send(records)
        answers: dict[str, tuple[str | None, dict[str, Any]]] = {}
        try:
            deadline = time.monotonic() + self.request_timeout
            self._io.producer.flush(self.request_timeout)
            while len(answers) < len(asked) and time.monotonic() < deadline:
                self._check_not_closed(kind)
                self._pump(0.05)
                for rid in asked:
                    if rid not in answers and (got := self.core.answer(rid)) is not None:
                        answers[rid] = got
        finally:
            for rid in asked:
                self.core.forget(rid)
        errors = [error for error, _ in answers.values() if error is not None]
        if any(OWN_TOPIC_NEEDED in e for e in errors) and self._io.use_own_command_topic():
            return self._ask_shards(kind, asked.values(), **fields)
        if errors:
            raise CommandError(errors[0])
        return {asked[rid]: body for rid, (_, body) in answers.items()}

    def _check_not_closed(self, kind: str) -> None:
        """Another thread closed the client while this one waited for an answer: no answer
        will be read."""
        if self._closed.is_set():
            raise closed_while_waiting(self.name, kind)

    def _beat(self) -> None:
        while not self._closed.wait(self._heartbeat_s):
            # (acks kept with no subscription open go too: refused, they are reported)
            if self.core.subs or self.core.acks.pending():
                try:
                    with self._beating:
                        if self._closed.is_set():
                            return
                        out = self.core.take_acks()
                        for shard in self.core.shards_used():
                            out += self.core.command("heartbeat", shard=shard)
                        self._send(out)
                    self._io.read_if_idle(self.core)
                    self._start_subscribing_again()
                except Exception as exc:  # never let the heartbeat thread die silently
                    log.warning("heartbeat failed: %s", exc)

    def _start_subscribing_again(self) -> None:
        """In a thread of its own: waiting for a shard without an owner must not hold up
        the heartbeats of the others."""
        if (self._again is None or not self._again.is_alive()) and self.core.lost():
            self._again = threading.Thread(target=self._subscribe_again, daemon=True,
                                           name="kq-subscribe-again")
            self._again.start()

    def _subscribe_again(self) -> None:
        """Subscribe again what the service dropped, with the same id and what it asked
        for. A refusal ends the subscription (its messages() raises it); no answer (no owner
        for the shard just now) is tried again at the next heartbeat. Ends quietly when the
        client is closed meanwhile (its consumer with it)."""
        for sub in self.core.lost():
            if self._closed.is_set():
                return
            try:
                self._subscribe(sub)
            except CommandError as exc:
                log.error("subscribing again to %s was refused: %s", sub.queue, exc)
                sub.refused(str(exc))
                self.core.subs.pop(sub.sub_id, None)
            except KqError as exc:
                if self._closed.is_set():
                    return
                log.warning("subscribing again to %s: %s; trying again", sub.queue, exc)
            except RuntimeError:  # confluent-kafka's "Consumer closed"
                if self._closed.is_set():
                    return
                raise
            else:
                log.warning("subscribed again to %s", sub.queue)


class Subscription(SubscriptionState):
    """The messages of one queue for one `QueueClient`; a context manager (closing returns
    its leases at once)."""

    def __init__(self, client: QueueClient, queue: str, sub_id: str, mode: str = "queue",
                 asked: dict[str, Any] | None = None) -> None:
        super().__init__(queue, sub_id, mode, asked or {})
        self.client = client

    def messages(self, timeout: str | float | None = 5.0) -> Iterator[Message]:
        """Yield messages as they arrive; stop after `timeout` seconds with nothing new
        (None: wait until the subscription or the client is closed). Raise CommandError when
        the service dropped this subscription and refused it again."""
        client, core, buffer = self.client, self.client.core, self.buffer
        timeout = seconds(timeout, "timeout")
        quiet_since = time.monotonic()
        while not self.closed and not client._closed.is_set():
            if buffer:
                # what came is handed out; the clock is read once it all has been
                while buffer and not self.closed:
                    try:
                        msg = buffer.popleft()
                    except IndexError:  # another thread emptied it meanwhile (a drop notice)
                        break
                    yield msg
                quiet_since = time.monotonic()
                continue
            left = 0.1 if timeout is None else timeout - (time.monotonic() - quiet_since)
            if left <= 0:
                client._send(core.take_acks())  # back to the caller: what it acked goes
                return
            due, wait = core.acks.due(min(left, 0.1))  # about to wait: acks kept may go
            if due:
                client._send(core.take_acks())
            client._pump(wait)
        if self.failure is not None:
            raise CommandError(f"subscription to {self.queue!r} was dropped by the service and "
                               f"could not be made again: {self.failure}")

    def close(self) -> None:
        """End the subscription; leases it holds return to the queue at once."""
        if not self.closed:
            self.closed = True
            try:
                self.client._request("unsubscribe", sub_id=self.sub_id)
            finally:
                self.client.core.remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
