"""An instance whose shard runner stopped on another owner's marker serves the shard again if
the group, a session timeout later, still gives it the shard (no Kafka: the runner is faked)."""

from __future__ import annotations

import threading

from broker.config import parse_config
from broker.errors import FencedError
from broker.service import instance as instance_module
from broker.service.instance import Instance, _Runner


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _instance(monkeypatch) -> tuple[Instance, list[int], Clock]:
    clock = Clock()
    monkeypatch.setattr(instance_module.time, "monotonic", clock)
    inst = Instance(parse_config({"service": {"shards": 2, "session_timeout": "3s"}}), "-")
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
