"""Two live processes under one instance name find each other from their status records;
the later started stops. A run that ended or is stopping is not taken for one. On one host,
a record's pid tells a crashed run from a live one at once."""

import os
import socket
import subprocess
import sys
import time

import pytest

from broker.config import parse_config
from broker.errors import ConfigError
from broker.service.instance import Instance
from broker.service.status import InstanceStatus, Namesakes, kq_serve_runs

TIMEOUT = 6_000


def status(incarnation: str, started_ms: int, at_ms: int, name: str = "a",
           stopped: bool = False) -> InstanceStatus:
    return InstanceStatus(name, [], [], {}, at_ms, stopped, incarnation, started_ms)


def each_watching_the_other(a: InstanceStatus, b: InstanceStatus) -> tuple[Namesakes, Namesakes]:
    """Two live runs of one name, each having read two status records of the other."""
    seen_by_a, seen_by_b = Namesakes(a, TIMEOUT), Namesakes(b, TIMEOUT)
    for at in (5_000, 7_000):
        seen_by_a.seen(status(b.incarnation, b.started_ms, at))
        seen_by_b.seen(status(a.incarnation, a.started_ms, at))
    return seen_by_a, seen_by_b


def test_the_later_started_finds_the_earlier_and_not_the_other_way_round():
    seen_by_early, seen_by_late = each_watching_the_other(status("x", 1_000, 0),
                                                          status("y", 2_000, 0))
    assert seen_by_late.earlier(8_000).incarnation == "x"
    assert seen_by_early.earlier(8_000) is None


def test_a_tie_in_start_time_is_broken_the_same_way_on_both_sides():
    seen_by_a, seen_by_b = each_watching_the_other(status("aaa", 1_000, 0),
                                                   status("bbb", 1_000, 0))
    assert seen_by_a.earlier(8_000) is None
    assert seen_by_b.earlier(8_000) is not None


def test_an_earlier_run_stopping_as_this_one_starts_is_not_a_namesake():
    me = Namesakes(status("new", 2_000, 0), TIMEOUT)
    me.seen(status("old", 1_000, 2_100))  # its last status, written as this one started
    assert me.earlier(2_500) is None
    me.seen(status("old", 1_000, 2_900, stopped=True))
    assert me.earlier(4_000) is None


def test_a_namesake_gone_quiet_past_the_timeout_no_longer_counts():
    me = Namesakes(status("new", 2_000, 0), TIMEOUT)
    for at in (3_000, 5_000):
        me.seen(status("old", 1_000, at))
    assert me.earlier(6_000) is not None
    assert me.earlier(5_000 + TIMEOUT + 1) is None


def test_other_names_and_its_own_records_are_not_namesakes():
    me = Namesakes(status("mine", 2_000, 0), TIMEOUT)
    for at in (3_000, 5_000):
        me.seen(status("other", 1_000, at, name="b"))
        me.seen(status("mine", 2_000, at))
    assert me.earlier(6_000) is None


def test_a_pid_of_this_host_counts_as_a_running_kq_serve_only_while_it_runs_one():
    sleeper = subprocess.Popen(["sleep", "30"])
    # Popen returns once exec has begun, a moment before the kernel sets up the new command
    # line: the child says when it runs, so the test reads a line that is there.
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)", "serve"],
        stdout=subprocess.PIPE)
    try:
        assert server.stdout.readline() == b"up\n"
        assert kq_serve_runs(server.pid)  # its command line has `serve`
        assert not kq_serve_runs(sleeper.pid)  # a pid reused by something else
        assert not kq_serve_runs(os.getpid())  # a restarted container's kq: a new run
    finally:
        for p in (sleeper, server):
            p.kill()
            p.wait()
    server.stdout.close()
    assert not kq_serve_runs(server.pid)  # ended: the record was of a crash


class ScriptedBoard:
    """The status board as a starting instance reads it: `prior` read at start, then one
    record of `arriving` per look."""

    def __init__(self, me: InstanceStatus, prior: InstanceStatus,
                 arriving: list[InstanceStatus]) -> None:
        self.latest = {prior.instance: prior}
        self.timeout_ms = TIMEOUT
        self.arriving = arriving
        self.namesakes = Namesakes(me, TIMEOUT)

    def refresh(self) -> None:
        if self.arriving:
            s = self.arriving.pop(0)
            self.latest[s.instance] = s
            self.namesakes.seen(s)

    def earlier_namesake(self) -> InstanceStatus | None:
        return self.namesakes.earlier(int(time.time() * 1000))


def starting(prior_host: str, prior_pid: int, arriving_stopped: list[bool]) -> Instance:
    inst = Instance(parse_config({"queue": [{"name": "Q"}], "service": {"instance": "a"}}),
                    "unused:9092")
    now = int(time.time() * 1000)

    def record(stopped: bool = False) -> InstanceStatus:
        return InstanceStatus("a", [0], [], {}, int(time.time() * 1000), stopped, "other",
                              now - 60_000, prior_host, prior_pid)

    inst.board = ScriptedBoard(inst._status(), record(),  # type: ignore[assignment]
                               [record(stopped) for stopped in arriving_stopped])
    return inst


def test_a_live_namesake_stops_a_starting_process_before_it_joins_the_group():
    inst = starting("elsewhere", 4242, [False, False])
    with pytest.raises(ConfigError, match="already runs as instance 'a'.*pid 4242"):
        inst._check_name_before_joining()


def test_a_namesake_that_was_stopping_lets_a_starting_process_go_on():
    inst = starting("elsewhere", 4242, [True])
    started = time.monotonic()
    inst._check_name_before_joining()
    assert time.monotonic() - started < 3  # not the whole 7 s


def test_a_namesake_of_this_host_whose_pid_is_gone_is_a_crash_and_is_not_waited_for():
    gone = subprocess.Popen(["true"])
    gone.wait()
    inst = starting(socket.gethostname(), gone.pid, [])
    started = time.monotonic()
    inst._check_name_before_joining()
    assert time.monotonic() - started < 3  # not the whole 7 s
