"""The service's loop lingers a moment after records came, so that what arrives meanwhile
is one batch (broker.service.inputs.LINGER_S); a batch held, or a quiet service, does not."""

from __future__ import annotations

import time
from typing import Any

from broker.engine.engine import Engine
from broker.service.inputs import Inputs
from broker.service.routing import Router

LINGER_S = 0.3  # stretched, so that "it did not wait" is told apart from a slow machine


class ArrivingConsumer:
    """A consumer whose records become readable at given monotonic times."""

    def __init__(self) -> None:
        self.due: list[tuple[float, str]] = []

    def arrive(self, after_s: float, value: str) -> None:
        self.due.append((time.monotonic() + after_s, value))

    def _ready(self) -> list[str]:
        now = time.monotonic()
        ready = [v for t, v in self.due if t <= now]
        self.due = [(t, v) for t, v in self.due if t > now]
        return ready

    def poll(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not (ready := self._ready()) and time.monotonic() < deadline:
            time.sleep(0.001)
        if not ready:
            return None
        self.due[:0] = [(0.0, v) for v in ready[1:]]
        return ready[0]

    def consume(self, n: int, timeout: float) -> list[Any]:
        ready = self._ready()
        self.due[:0] = [(0.0, v) for v in ready[n:]]
        return ready[:n]


def make_inputs() -> tuple[Inputs, ArrivingConsumer]:
    sources = ArrivingConsumer()
    inputs = Inputs(sources, ArrivingConsumer(), None, Router((), "kq"),  # type: ignore[arg-type]
                    Engine(()), ["kq.commands"], {})
    inputs.linger_s = LINGER_S
    return inputs, sources


def test_records_arriving_just_after_a_batch_are_taken_together() -> None:
    inputs, sources = make_inputs()
    sources.arrive(0, "a")
    assert inputs.poll(100) == ["a"]
    came = time.monotonic()
    sources.arrive(0.05, "b")
    sources.arrive(0.15, "c")
    assert inputs.poll(100) == ["b", "c"]  # one batch, not "b" alone as soon as it came
    assert time.monotonic() - came >= LINGER_S


def test_a_quiet_service_takes_a_record_at_once() -> None:
    inputs, sources = make_inputs()
    sources.arrive(0, "a")
    began = time.monotonic()
    assert inputs.poll(100) == ["a"]
    assert time.monotonic() - began < LINGER_S


def test_with_a_batch_held_what_is_there_is_taken_without_lingering() -> None:
    inputs, sources = make_inputs()
    sources.arrive(0, "a")
    assert inputs.poll(100) == ["a"]
    sources.arrive(0, "b")
    came = time.monotonic()
    assert inputs.poll(100, wait=False) == ["b"]  # (the held batch goes out after it)
    assert time.monotonic() - came < LINGER_S


class RecordingConsumer(ArrivingConsumer):
    """Notes how long each poll was allowed to wait."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def poll(self, timeout: float) -> Any:
        self.waits.append(timeout)
        return super().poll(timeout)


def test_with_nothing_there_only_the_sources_are_waited_on() -> None:
    """A consumer waits in whole milliseconds, so the service waits on one at a time, and a
    record arriving on the other waits out that turn: a source record's wait is its
    message's latency, an ack's only frees its lease a little later."""
    sources, commands = RecordingConsumer(), RecordingConsumer()
    inputs = Inputs(sources, commands, None, Router((), "kq"),  # type: ignore[arg-type]
                    Engine(()), ["kq.commands"], {})
    inputs._last_input = time.monotonic()  # busy: the short waits
    inputs.linger_s = 0
    assert inputs.poll(100) == []
    assert sources.waits[-1] >= 0.001  # (librdkafka rounds a wait down to whole ms)
    assert commands.waits == [0, 0]  # looked at before the sources' wait and after it
