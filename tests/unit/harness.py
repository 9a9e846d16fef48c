"""A driver for the engine with a hand-moved clock: no Kafka, milliseconds per test."""

from __future__ import annotations

from typing import Any

from broker.config import QueueConfig
from broker.engine import events as ev
from broker.engine.effects import CommandRejected, DeadLetter, Deliver, Effect, Journal, Reply
from broker.engine.engine import Engine
from broker.engine.transitions import Transition
from broker.values import Bookmark


def queue(name: str = "Q", **kw: Any) -> QueueConfig:
    return QueueConfig(name=name, **kw)


class Harness:
    def __init__(self, *queues: QueueConfig, heartbeat_ms: int = 10_000) -> None:
        self.engine = Engine(queues or (queue(),), heartbeat_ms)
        self.now = 1_000_000
        self.offset = 0
        self.effects: list[Effect] = []
        self.journal: list[Transition] = []

    def handle(self, event: ev.Event) -> list[Effect]:
        out = self.engine.handle(event, self.now)
        self.effects.extend(out)
        self.journal.extend(e.transition for e in out if isinstance(e, Journal))
        return out

    def publish(self, n: int = 1, queue: str = "Q", topic: str = "T") -> list[Bookmark]:
        bms = []
        for _ in range(n):
            bm = Bookmark(topic, 0, self.offset)
            self.offset += 1
            self.handle(ev.MessageArrived(queue, bm, self.now))
            bms.append(bm)
        return bms

    def subscribe(self, client: str, queue: str = "Q", backlog: int = 1,
                  sub_id: str | None = None) -> list[Effect]:
        return self.handle(ev.Subscribed(client, sub_id or f"{client}-{queue}", queue, backlog,
                                         "r1"))

    def ack(self, client: str, *bms: Bookmark, queue: str = "Q") -> list[Effect]:
        return self.handle(ev.Acked(client, queue, tuple(bms), "ack"))

    def cancel(self, client: str, bm: Bookmark, queue: str = "Q") -> list[Effect]:
        return self.handle(ev.Cancelled(client, queue, bm, "c"))

    def advance(self, ms: int) -> list[Effect]:
        self.now += ms
        return self.handle(ev.Tick())


def delivered(effects: list[Effect]) -> list[tuple[str, Bookmark, int]]:
    return [(e.client, e.bookmark, e.delivery_count) for e in effects if isinstance(e, Deliver)]


def rejected(effects: list[Effect]) -> list[str]:
    return [e.message for e in effects if isinstance(e, CommandRejected)]


def replies(effects: list[Effect]) -> list[Reply]:
    return [e for e in effects if isinstance(e, Reply)]


def dead_letters(effects: list[Effect]) -> list[tuple[Bookmark, str]]:
    return [(e.bookmark, e.reason) for e in effects if isinstance(e, DeadLetter)]
