"""An instance whose shard runner stopped on another owner's marker serves the shard again if
the group, a session timeout later, still gives it the shard and no other live instance says
it serves it (no Kafka: the runner and the status board are faked)."""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import KafkaError, KafkaException

from broker.config import parse_config
from broker.errors import FencedError
from broker.service import instance as instance_module
from broker.service.instance import Instance, _Runner
from broker.service.status import InstanceStatus, StatusBoard


class Board:
    """The status board, as far as serving a fenced shard again asks it."""

    def __init__(self) -> None:
        self.serving: dict[int, str] = {}  # shard -> the other live instance that says so

    def serving_other_than(self, name: str, shard: int) -> str | None:
        return self.serving.get(shard)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _instance(monkeypatch) -> tuple[Instance, list[int], Clock]:
    clock = Clock()
    monkeypatch.setattr(instance_module.time, "monotonic", clock)
    inst = Instance(parse_config({"service": {"shards": 2, "session_timeout": "3s"}}), "-")
    inst.board = Board()  # type: ignore[assignment]
    started: list[int] = []
    monkeypatch.setattr(inst, "_start_runner", lambda shard: started.append(shard))
    return inst, started, clock


def _fenced_runner(inst: Instance, shard: int) -> None:
    class _Service:
        engine = type("E", (), {"queues": {}})()

    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    inst.runners[shard] = _Runner(_Service(), thread, FencedError("another took it"))  # type: ignore[arg-type]


def test_a_fenced_shard_the_group_still_gives_is_served_again_a_session_later(monkeypatch):
    inst, started, clock = _instance(monkeypatch)
    inst.owned = {0, 1}
    _fenced_runner(inst, 1)
    inst._check_runners()
    assert 1 not in inst.runners
    clock.now += 2.9
    inst._serve_again_if_still_owned()
    assert started == []  # the group may still take it away
    clock.now += 0.2
    inst._serve_again_if_still_owned()
    assert started == [1]


def test_a_fenced_shard_the_group_took_away_is_left_alone(monkeypatch):
    inst, started, clock = _instance(monkeypatch)
    inst.owned = {1}
    _fenced_runner(inst, 1)
    inst._check_runners()
    inst.owned.discard(1)  # the revoke came
    clock.now += 10
    inst._serve_again_if_still_owned()
    assert started == []


def test_a_fenced_shard_another_instance_serves_waits_for_the_group(monkeypatch, caplog):
    """A woken owner hears of its revoke seconds late: while the new owner says it serves
    the shard, serving it again would only fence the rightful owner with a late marker."""
    caplog.set_level(logging.INFO, logger="kq.instance")
    inst, started, clock = _instance(monkeypatch)
    inst.owned = {1}
    inst.board.serving[1] = "b"  # type: ignore[attr-defined]
    _fenced_runner(inst, 1)
    inst._check_runners()
    for _ in range(3):
        clock.now += 5
        inst._serve_again_if_still_owned()
    assert started == []
    assert caplog.text.count("instance b serves it: waiting for the group") == 1
    inst.owned.discard(1)  # the revoke comes at last
    inst._serve_again_if_still_owned()
    assert started == [] and not inst._fenced_at


def test_a_fenced_shard_is_served_again_once_a_late_markers_writer_lets_it_go(monkeypatch):
    """The marker came late from an instance evicted during its restore: it says it serves
    the shard only until it hears of its eviction; then the rightful owner serves it again."""
    inst, started, clock = _instance(monkeypatch)
    inst.owned = {1}
    inst.board.serving[1] = "c"  # type: ignore[attr-defined]
    _fenced_runner(inst, 1)
    inst._check_runners()
    clock.now += 5
    inst._serve_again_if_still_owned()
    assert started == []
    del inst.board.serving[1]  # type: ignore[attr-defined]  # c's next record owns nothing
    inst._serve_again_if_still_owned()
    assert started == [1]


def test_the_board_names_a_live_other_instance_serving_a_shard_and_no_stale_one():
    now = int(time.time() * 1000)
    board = StatusBoard.__new__(StatusBoard)  # its records, without Kafka
    board.timeout_ms, board.refresh = 6_000, lambda: None  # type: ignore[method-assign]
    board.latest = {
        "a": InstanceStatus("a", [0], [], at_ms=now),
        "b": InstanceStatus("b", [1], [], at_ms=now - 1_000),
        "c": InstanceStatus("c", [2], [], at_ms=now - 60_000),  # killed a minute ago
        "d": InstanceStatus("d", [3], [], at_ms=now, stopped=True),
    }
    assert board.serving_other_than("a", 1) == "b"
    assert board.serving_other_than("a", 0) is None  # itself
    assert board.serving_other_than("a", 2) is None
    assert board.serving_other_than("a", 3) is None


def test_a_status_kafka_refuses_at_once_is_dropped_with_a_warning_not_raised(caplog):
    """Stopping because the broker lost its data (kq's topics gone), the last status must
    not raise in its place: the reason the instance stops is what the operator must see."""
    class Refusing:
        def produce(self, *args, **kwargs):
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC))

    board = StatusBoard.__new__(StatusBoard)  # without Kafka
    board.topic, board.latest, board._producer = "kq.instances", {}, Refusing()
    status = InstanceStatus("a", [], [], stopped=True)
    with caplog.at_level(logging.WARNING, logger="kq.status"):
        board.publish(status)
    assert board.latest == {"a": status}
    assert "instance status not sent to kq.instances" in caplog.text


def _frozen_then_woken(session: str) -> Instance:
    """An instance whose group loop did not turn for 5 s, turning again now (an assignment
    it took in before the freeze is handled now)."""
    inst = Instance(parse_config({"service": {"session_timeout": session}}), "-")
    inst._last_turn = time.monotonic() - 5
    inst._turned()
    return inst


def test_just_after_a_freeze_ownership_is_answered_once_the_group_could_say_otherwise():
    """Soak seed 25: a shard given to a process just before it froze, and to another while
    it was frozen. Woken, it must not write a takeover marker before its first heartbeat
    could tell it that (the marker would fence the rightful owner)."""
    inst = _frozen_then_woken("1s")  # heartbeats every 0.2 s: it waits 0.4 s
    inst.owned.add(0)
    evicted = threading.Timer(0.1, inst.owned.discard, args=(0,))  # heard at a heartbeat
    evicted.start()
    started = time.monotonic()
    assert inst._owns(0) is False
    assert time.monotonic() - started >= 0.35
    evicted.join()


def test_a_shard_thread_woken_before_the_group_loop_waits_too():
    """Threads resume in any order: a shard thread may ask before the group loop has turned
    and noticed the freeze; the loop's last turn, long ago, tells it."""
    inst = Instance(parse_config({"service": {"session_timeout": "1s"}}), "-")
    inst._last_turn = time.monotonic() - 5  # frozen; the group loop not run since
    inst.owned.add(0)
    started = time.monotonic()
    assert inst._owns(0)
    assert time.monotonic() - started >= 0.35


def test_ownership_is_answered_at_once_when_the_group_loop_turned_on_time():
    inst = Instance(parse_config({"service": {"session_timeout": "1s"}}), "-")
    inst._turned()
    inst.owned.add(0)
    started = time.monotonic()
    assert inst._owns(0) and not inst._owns(1)
    assert time.monotonic() - started < 0.1


def test_a_process_stopping_does_not_wait_out_the_settle():
    inst = _frozen_then_woken("10s")  # it would wait 2 s
    inst.stop()
    started = time.monotonic()
    inst._owns(0)
    assert time.monotonic() - started < 0.5
