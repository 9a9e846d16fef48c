"""A shard's service told to stop while its batch is stuck (Kafka slow to take it) keeps the
shard's RocksDB open: given the shard back meanwhile, the instance starts a new service for
it only once the old one has ended, never two at once on one directory. And the process's
own stop: every shard at once, within a deadline."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

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


class SlowStandby:
    """A standby whose copy takes until `release` to close (a restore under way)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.told = False

    @property
    def running(self) -> bool:
        return not self.release.is_set()

    def stop(self, wait_s: float = 60.0) -> None:
        self.told = True
        self.release.wait(wait_s)


def test_a_shard_assigned_while_its_standby_closes_its_copy_waits_for_it_outside_the_group(
        inst):
    # the assignment came inside the group member's poll, which waited 60 s for the standby:
    # the process's stop (SIGTERM) was not heard meanwhile (a test's stop timed out in CI)
    standby = SlowStandby()
    inst.standbys[0] = standby  # type: ignore[assignment]
    inst.owned.add(0)
    began = time.monotonic()
    inst._start_runner(0)
    assert time.monotonic() - began < 1 and standby.told
    assert not StuckService.made and 0 in inst.retiring  # not on a copy still open
    inst._check_runners()
    assert not StuckService.made
    standby.release.set()
    inst._check_runners()  # closed: the shard is served from it
    assert len(StuckService.made) == 1 and 0 in inst.runners and not inst.retiring
    StuckService.made[0].unstick.set()
    inst._stop_runner(0)


def test_a_stop_waits_for_a_standby_still_closing_its_copy(stopping):
    inst, _ = stopping
    standby = SlowStandby()
    inst.retiring[1] = standby  # type: ignore[assignment]
    threading.Timer(0.2, standby.release.set).start()
    inst._stop_all(time.monotonic() + 5)
    assert not standby.running and not inst.retiring


class Recorded:
    """The group member and the status board, as far as a stop uses them."""

    def __init__(self) -> None:
        self.group_closed = False
        self.published: list = []
        self.board_wait: float | None = None

    def close(self, wait_s: float | None = None) -> None:  # the group's, or the board's
        if wait_s is None:
            self.group_closed = True
        else:
            self.board_wait = wait_s

    def publish(self, status: object) -> None:
        self.published.append(status)


@pytest.fixture
def stopping(inst: Instance, monkeypatch: pytest.MonkeyPatch) -> tuple[Instance, Recorded]:
    kit = Recorded()
    inst._group = kit  # type: ignore[assignment]
    inst.board = kit  # type: ignore[assignment]
    monkeypatch.setattr(StuckService, "lag", lambda self: 0, raising=False)
    return inst, kit


def test_a_stop_finishes_every_shard_side_by_side_then_leaves_the_group(stopping):
    inst, kit = stopping
    for shard in (0, 1, 2):
        inst.owned.add(shard)
        inst._start_runner(shard)
    finishing = [threading.Timer(1.0, s.unstick.set) for s in StuckService.made]
    for t in finishing:
        t.start()  # each shard's batch takes a second more
    started = time.monotonic()
    inst._stop_all(time.monotonic() + 10)
    assert time.monotonic() - started < 2.2  # one after the other: 3 s at least
    assert StuckService.running == 0 and StuckService.most_at_once == 3
    assert kit.group_closed and [s.stopped for s in kit.published] == [True]
    assert kit.published[0].owned == []  # the last record owns nothing


def test_a_group_kafka_refuses_to_leave_does_not_stop_the_stop(stopping, caplog):
    # as after Kafka lost its data: the process stops for that reason, and a failure to
    # leave the group must neither take its place nor skip the last status
    inst, kit = stopping

    def refuse(wait_s: float | None = None) -> None:
        if wait_s is None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker gone"))
        kit.board_wait = wait_s

    kit.close = refuse  # type: ignore[method-assign]
    inst._stop_all(time.monotonic() + 5)
    assert [s.stopped for s in kit.published] == [True] and kit.board_wait is not None
    assert "leaving the group failed" in caplog.text


def test_a_group_member_whose_close_hangs_does_not_hold_the_stop_past_its_bound(
        stopping, caplog):
    # librdkafka's close can wait on a rebalance under way (an assignment arriving as it
    # closes): the stop ends within its bound all the same, its last status said
    inst, kit = stopping
    release = threading.Event()

    def hang(wait_s: float | None = None) -> None:
        if wait_s is None:
            release.wait(30)
        else:
            kit.board_wait = wait_s

    kit.close = hang  # type: ignore[method-assign]
    started = time.monotonic()
    inst._stop_all(time.monotonic() + 1.5)
    assert time.monotonic() - started < 2.5
    assert not inst.left_group  # `kq serve` then exits at once, saying so
    assert [s.stopped for s in kit.published] == [True]
    assert "leaving the group took over" in caplog.text
    release.set()


def test_a_shard_assigned_as_the_stop_leaves_the_group_is_not_served(stopping):
    # a service started then would write its takeover marker over the shard's new owner's
    inst, _ = stopping
    group = SimpleNamespace(incremental_assign=lambda tps: None, pause=lambda tps: None)
    inst.stop()
    inst._assigned(group, [TopicPartition("kq.commands", 0)])
    assert not inst.runners and not inst.owned and StuckService.made == []


def test_a_shard_that_cannot_finish_in_time_is_left_as_a_crash_leaves_it(stopping, caplog):
    inst, kit = stopping
    inst.owned.update({0, 1})
    inst._start_runner(0)
    inst._start_runner(1)
    StuckService.made[0].unstick.set()  # shard 0 finishes; shard 1's batch hangs
    started = time.monotonic()
    inst._stop_all(time.monotonic() + 0.3)
    assert time.monotonic() - started < 1.5
    # still a member: the others take shard 1 after the session timeout, once this process
    # is surely gone, never while its batch may still go out
    assert not kit.group_closed and kit.published == [] and kit.board_wait == 0
    assert "shard(s) 1 still writing a batch" in caplog.text
    assert not inst.owned  # a late commit check of shard 1's service finds it gone
    assert inst.unfinished == [1]  # `kq serve` then exits at once, saying so (exit 1)
    StuckService.made[1].unstick.set()


def test_a_stop_of_the_process_cuts_short_a_revoke_waiting_on_a_stuck_shard(
        stopping, monkeypatch):
    """The group's revoke callback waits for the shard's batch (up to a minute with Kafka
    slow); SIGTERM meanwhile must not wait that long too."""
    inst, kit = stopping
    monkeypatch.setattr(instance_module, "STOP_WAIT_S", 60)
    inst.owned.add(0)
    inst._start_runner(0)
    revoking = threading.Thread(target=inst._stop_runner, args=(0,))
    revoking.start()
    inst.stop()  # SIGTERM, while the callback waits
    revoking.join(2)
    assert not revoking.is_alive()
    started = time.monotonic()
    inst._stop_all(time.monotonic() + 0.3)
    assert time.monotonic() - started < 1.5 and inst.unfinished == [0]
    StuckService.made[0].unstick.set()

