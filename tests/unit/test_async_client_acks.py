"""The async client's reading loop and the acks it keeps (broker/client/aio.py), without
Kafka: a fake clock, and waits that only move it."""

import asyncio
import threading
import time

import pytest

from broker.client.acks import ACK_LINGER_S
from broker.client.aio import AsyncMessage, AsyncQueueClient, AsyncSubscription
from broker.client.core import ClientCore
from broker.client.message import batch_of


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[tuple[float, int]] = []  # (how long, commands sent before it)


def client_and_subscription(clock: Clock, bookmarks: list[str]):
    client = AsyncQueueClient.__new__(AsyncQueueClient)
    client.core = ClientCore("w", "w", AsyncMessage, client)
    client._closed = threading.Event()
    sent: list = []

    async def send(records):
        sent.extend(records)

    class Wakeups:
        async def wait(self, timeout: float) -> None:
            clock.waits.append((timeout, len(sent)))
            clock.now += timeout

    client._send, client._wakeups = send, Wakeups()
    sub = AsyncSubscription(client, "Q", "s1")
    client.core.add(sub)
    client.core.subscribed(sub, {"backlog": 100})
    client.core._deliver("s1", "Q", "json", batch_of(
        [(b, 1, None, False, 0, None, b"{}", [], 0) for b in bookmarks]))
    return sub, sent


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "monotonic", lambda: c.now)
    return c


def test_acks_kept_wait_for_company_then_go_as_one_command(clock):
    sub, sent = client_and_subscription(clock, ["T/0/1", "T/0/2"])

    async def work():
        async for msg in sub.messages(timeout=1):
            await msg.ack()

    asyncio.run(work())
    assert clock.waits[0] == (pytest.approx(ACK_LINGER_S), 0)  # kept through the first wait
    assert clock.waits[1][1] == 1 and len(sent) == 1  # then both went, in one command


def test_acks_kept_go_when_messages_returns(clock):
    sub, sent = client_and_subscription(clock, ["T/0/1"])

    async def work():
        async for msg in sub.messages(timeout=0):
            await msg.ack()

    asyncio.run(work())
    assert len(sent) == 1
