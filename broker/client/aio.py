"""`AsyncQueueClient`: the subscriber client for asyncio (SPEC section 7), with the same
semantics as `QueueClient`: the same core, the same Kafka transport.

librdkafka's calls block, so the transport runs in threads: one reads the delivery topic into
the core and wakes the coroutines waiting for messages or answers; sends and flushes go
through `asyncio.to_thread`. Heartbeats are a task of the client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
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

log = logging.getLogger("kq.client")

READ_WAIT_S = 0.1  # the reader thread's longest wait for records (and to notice a close)


class AsyncMessage(Message):
    """A `Message` whose answers are coroutines: `await msg.ack()`, `await msg.extend(...)`."""

    async def ack(self, wait: bool = False) -> None:  # type: ignore[override]
        if self.settles:
            await self._client._ack(self, wait)
            self.answered = True  # (not when the ack raised: a closed client, a lost lease)

    async def cancel(self, delay: str | float | None = None) -> None:  # type: ignore[override]
        if self.settles:  # (a barrier or a browsed copy needs no answer)
            await self._client._cancel(self, delay)  # (a bad delay raises: not answered)
            self.answered = True

    async def expire(self) -> None:  # type: ignore[override]
        if self.settles:  # (a barrier or a browsed copy needs no answer)
            await self._client._expire(self)
            self.answered = True

    async def extend(self, period: str | float) -> float:  # type: ignore[override]
        deadline: float = await self._client._extend(self, period)
        return deadline


class _Wakeups:
    """Coroutines waiting for the reader thread to bring something."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiting: set[asyncio.Future[None]] = set()

    async def wait(self, timeout: float) -> None:
        future = self.loop.create_future()
        self._waiting.add(future)
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            self._waiting.discard(future)

    def poke(self) -> None:
        """From any thread: wake every waiter."""
        self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        for future in self._waiting:
            if not future.done():
                future.set_result(None)


class AsyncQueueClient:
    """`QueueClient` for asyncio. Make it with `await AsyncQueueClient.connect(...)` or
    `async with AsyncQueueClient(...) as client` (which connects)."""

    def __init__(self, bootstrap_servers: str, name: str | None = None, topic_prefix: str = "kq",
                 kafka_config: dict[str, Any] | None = None, principal: str | None = None,
                 request_timeout: str | float = 10.0, heartbeat_interval: str | float = 1.0,
                 on_refused: Callable[[str], None] | None = None) -> None:
        request_timeout, heartbeat_interval = waits(request_timeout, heartbeat_interval)
        self.name = client_name(name)
        self.principal = principal_of(self.name, principal, kafka_config)
        self.core = ClientCore(self.name, self.principal, AsyncMessage, self, on_refused)
        self.request_timeout = request_timeout
        self._args = bootstrap_servers, topic_prefix, kafka_config
        self._heartbeat_s = heartbeat_interval
        self._io: Transport | None = None
        self._closed = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reader: threading.Thread | None = None

    @classmethod
    async def connect(cls, bootstrap_servers: str, **kw: Any) -> AsyncQueueClient:
        """A connected client (the arguments are those of the constructor)."""
        client = cls(bootstrap_servers, **kw)
        await client.start()
        return client

    async def start(self) -> None:
        """Connect (reach Kafka, make the delivery topic) and start reading."""
        bootstrap, prefix, kafka = self._args
        self._io = await asyncio.to_thread(Transport, bootstrap, self.name, prefix,
                                           self.principal, kafka)
        self.core.shards = await asyncio.to_thread(self._io.shard_count)
        self._wakeups = _Wakeups(asyncio.get_running_loop())
        self._reader = threading.Thread(target=self._read, daemon=True, name="kq-reader")
        self._reader.start()
        self._tasks.append(asyncio.create_task(self._beat()))

    @property
    def errors(self) -> list[str]:
        return self.core.errors

    async def __aenter__(self) -> AsyncQueueClient:
        if self._io is None:
            await self.start()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- public API ------------------------------------------------------------------------
    async def subscribe(self, queue: str, filter: str | None = None,
                        max_backlog: int | None = None, mode: str = "queue",
                        replay_period: str | None = None) -> AsyncSubscription:
        """As `QueueClient.subscribe`."""
        self.core.check_open()
        if self.core.shards == 1:
            self.core.shards = await asyncio.to_thread(self._transport().shard_count)
        asked = subscribe_command(queue, filter, max_backlog, mode, replay_period)
        sub = AsyncSubscription(self, queue, uuid.uuid4().hex, mode, asked)
        self.core.add(sub)
        try:
            await self._subscribe(sub)
        except KqError as exc:
            await self._send(self.core.abandon(sub, exc, self._transport().service_seen))
            raise
        return sub

    async def ack(self, queue: str, bookmarks: list[str]) -> None:
        """Acknowledge many messages at once, by bookmark; raise CommandError naming any
        refused."""
        await self._request("ack", queue=queue, bookmarks=bookmark_list(bookmarks))

    async def ack_where(self, queue: str, expression: str) -> int:
        """Ack every active message of `queue` that `expression` matches; how many."""
        return int((await self._request("ack_where", queue=queue, filter=expression))["acked"])

    async def flush(self) -> None:
        """Send every batched ack now, and wait until Kafka has them."""
        io = self._transport()
        await asyncio.to_thread(io.send, self.core.take_acks())
        await asyncio.to_thread(io.producer.flush, self.request_timeout)

    async def close(self) -> None:
        """Leave: every subscription ends and its leases return to the queues at once."""
        if self._closed.is_set() or self._io is None:
            return
        self._closed.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        out = self.core.take_acks()
        for shard in self.core.shards_used():
            out += self.core.command("close", shard=shard)
        self.core.closed = True  # (after the last commands: none may follow them)
        io = self._io
        try:
            await asyncio.to_thread(io.send, out)
            await asyncio.to_thread(io.producer.flush, 5)
        finally:
            for sub in list(self.core.subs.values()):
                self.core.remove(sub)
            if self._reader is not None:
                await asyncio.to_thread(self._reader.join)
            io.close_consumer()

    # -- what an AsyncMessage calls --------------------------------------------------------
    async def _ack(self, msg: Message, wait: bool) -> None:
        if wait:
            await self._settle_waiting("ack", msg)
        elif self.core.ack(msg):
            await self._send(self.core.take_acks())

    async def _cancel(self, msg: Message, delay: str | float | None) -> None:
        delay_ms = None if delay is None else duration_ms(delay, "delay")
        await self._send(self.core.settle("cancel", msg, delay_ms=delay_ms))

    async def _expire(self, msg: Message) -> None:
        await self._send(self.core.settle("expire", msg))

    async def _extend(self, msg: Message, period: str | float) -> float:
        body = await self._settle_waiting("extend", msg,
                                          period_ms=duration_ms(period, "period", positive=True))
        msg.lease_deadline = body["deadline_ms"] / 1000
        return msg.lease_deadline

    async def _settle_waiting(self, kind: str, msg: Message, **fields: Any) -> dict[str, Any]:
        try:
            return await self._request(kind, queue=msg.queue, bookmarks=[msg.bookmark],
                                       delivery_counts=[msg.delivery_count], **fields)
        except CommandError as exc:
            raise refusal_error(str(exc), settle=True) from None

    # -- plumbing --------------------------------------------------------------------------
    def _transport(self) -> Transport:
        if self._io is None:
            raise KqError("the AsyncQueueClient is not connected: use `async with` or "
                          "`await AsyncQueueClient.connect(...)`")
        return self._io

    async def _send(self, records: list[Outgoing]) -> None:
        if records:
            await asyncio.to_thread(self._transport().send, records)

    def _read(self) -> None:
        """The reader thread: the delivery topic into the core, waking the coroutines."""
        io = self._transport()
        while not self._closed.is_set():
            try:
                if io.read(self.core, READ_WAIT_S):
                    self._wakeups.poke()
            except Exception as exc:  # noqa: BLE001 - keep reading; a closed loop ends it
                if self._closed.is_set():
                    return
                log.warning("reading the delivery topic failed: %s", exc)
                time.sleep(READ_WAIT_S)

    async def _subscribe(self, sub: SubscriptionState) -> None:
        body = await self._request("subscribe", sub_id=sub.sub_id, **sub.asked)
        self.core.subscribed(sub, body)
        if self.core.heartbeat_s is not None:
            self._heartbeat_s = min(self._heartbeat_s, self.core.heartbeat_s)

    async def _request(self, kind: str, **fields: Any) -> dict[str, Any]:
        io = self._transport()
        rid, records = self.core.request(kind, **fields)
        try:
            if not io.service_seen:
                await asyncio.to_thread(io.check_service)
            await self._send(records)
            await asyncio.to_thread(io.producer.flush, self.request_timeout)
            deadline = time.monotonic() + self.request_timeout
            while (answer := self.core.answer(rid)) is None:
                if self._closed.is_set():  # by another task: no answer will be read
                    raise closed_while_waiting(self.name, kind)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise io.no_answer(kind, self.request_timeout)
                await self._wakeups.wait(min(left, READ_WAIT_S))
        finally:
            self.core.forget(rid)
        error, body = answer
        if error is not None and OWN_TOPIC_NEEDED in error and io.use_own_command_topic():
            return await self._request(kind, **fields)
        if error is not None:
            raise CommandError(error)
        return body

    async def _beat(self) -> None:
        while not self._closed.is_set():
            await asyncio.sleep(self._heartbeat_s)
            if not self.core.subs and not self.core.acks.pending():
                continue  # (acks kept with no subscription open go too: refused, reported)
            try:
                out = self.core.take_acks()
                for shard in self.core.shards_used():
                    out += self.core.command("heartbeat", shard=shard)
                await self._send(out)
                for sub in self.core.lost():
                    await self._subscribe_again(sub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - never let the heartbeats stop silently
                log.warning("heartbeat failed: %s", exc)

    async def _subscribe_again(self, sub: SubscriptionState) -> None:
        try:
            await self._subscribe(sub)
        except CommandError as exc:
            log.error("subscribing again to %s was refused: %s", sub.queue, exc)
            sub.refused(str(exc))
            self.core.subs.pop(sub.sub_id, None)
        except KqError as exc:
            log.warning("subscribing again to %s: %s; trying again", sub.queue, exc)
        else:
            log.warning("subscribed again to %s", sub.queue)


class AsyncSubscription(SubscriptionState):
    """The messages of one queue for one `AsyncQueueClient`; `async with` closes it."""

    def __init__(self, client: AsyncQueueClient, queue: str, sub_id: str, mode: str = "queue",
                 asked: dict[str, Any] | None = None) -> None:
        super().__init__(queue, sub_id, mode, asked or {})
        self.client = client

    async def messages(self, timeout: str | float | None = 5.0
                       ) -> AsyncIterator[AsyncMessage]:
        """As `Subscription.messages`: `async for msg in sub.messages(...)`."""
        client, core, buffer = self.client, self.client.core, self.buffer
        timeout = seconds(timeout, "timeout")
        quiet_since = time.monotonic()
        while not self.closed and not client._closed.is_set():
            if buffer:
                while buffer and not self.closed:
                    try:
                        msg = buffer.popleft()
                    except IndexError:
                        break
                    yield msg  # type: ignore[misc]
                quiet_since = time.monotonic()
                continue
            left = READ_WAIT_S if timeout is None else timeout - (time.monotonic() - quiet_since)
            if left <= 0:
                await client._send(core.take_acks())  # back to the caller: what it acked goes
                return
            due, wait = core.acks.due(min(left, READ_WAIT_S))
            if due:
                await client._send(core.take_acks())
            await client._wakeups.wait(wait)
        if self.failure is not None:
            raise CommandError(f"subscription to {self.queue!r} was dropped by the service and "
                               f"could not be made again: {self.failure}")

    async def close(self) -> None:
        """End the subscription; leases it holds return to the queue at once."""
        if not self.closed:
            self.closed = True
            try:
                await self.client._request("unsubscribe", sub_id=self.sub_id)
            finally:
                self.client.core.remove(self)

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
