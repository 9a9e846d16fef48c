"""A shard's service told to stop while its batch is stuck (Kafka slow to take it) keeps the
shard's RocksDB open: given the shard back meanwhile, the instance starts a new service for
it only once the old one has ended, never two at once on one directory."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from broker.config import parse_config
from broker.service import instance as instance_module
from broker.service.instance import Instance


class StuckService:
    """Ignores stop() until `unstick` is set, as a service in a batch Kafka does not take."""

    running = 0
    most_at_once = 0
    made: list[StuckService] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.unstick = threading.Event()
        self.stopped = threading.Event()
        self.ready = threading.Event()
        self.engine = SimpleNamespace(queues={})
        StuckService.made.append(self)

    def run(self) -> None:
        StuckService.running += 1
        StuckService.most_at_once = max(StuckService.most_at_once, StuckService.running)
        self.ready.set()
        self.unstick.wait(10)
        self.stopped.wait(10)
        StuckService.running -= 1

    def stop(self) -> None:
        self.stopped.set()


@pytest.fixture
def inst(monkeypatch: pytest.MonkeyPatch) -> Instance:
    monkeypatch.setattr(instance_module, "Service", StuckService)
    monkeypatch.setattr(instance_module, "STOP_WAIT_S", 0.05)
    StuckService.made, StuckService.running, StuckService.most_at_once = [], 0, 0
    return Instance(parse_config({"queue": [{"name": "Q"}]}), "unused:9092")


def test_a_shard_given_back_while_its_old_service_is_stuck_starts_once_that_one_ends(inst):
    inst.owned.add(0)
    inst._start_runner(0)
    inst._stop_runner(0)  # revoked: the service does not end within the wait
    assert 0 in inst.leaving and 0 not in inst.runners
    inst._start_runner(0)  # assigned again at once
    assert len(StuckService.made) == 1  # not a second service on the same RocksDB
    inst._check_runners()
    assert len(StuckService.made) == 1
    old = StuckService.made[0]
    old.unstick.set()
    inst.leaving[0].thread.join(5)
    inst._check_runners()  # the old one ended: the shard is served again
    assert len(StuckService.made) == 2 and 0 in inst.runners and not inst.leaving
    new = StuckService.made[1]
    new.unstick.set()
    inst._stop_runner(0)
    assert StuckService.most_at_once == 1


def test_a_stuck_service_of_a_shard_not_given_back_is_just_let_go(inst):
    inst.owned.add(0)
    inst._start_runner(0)
    inst.owned.discard(0)
    inst._stop_runner(0)
    StuckService.made[0].unstick.set()
    inst.leaving[0].thread.join(5)
    inst._check_runners()
    assert not inst.leaving and not inst.runners and len(StuckService.made) == 1
