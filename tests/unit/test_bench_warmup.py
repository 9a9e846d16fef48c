"""ops/bench_warmup.py: the benchmark warms the broker up with each kind of traffic, then
waits for its JIT compiler threads to finish (found by name: tests/unit/test_bench_threads.py)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops import bench_warmup  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


def test_a_process_without_compiler_threads_is_quiet_at_once() -> None:
    # a process of its own: this one's threads may include another test's, just ended
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert bench_warmup.compiler_cpu_s(other.pid) == 0.0
        compiled, waited = bench_warmup.wait_compilers_quiet(other.pid)
    finally:
        other.kill()
        other.wait()
    assert compiled == 0.0
    assert waited < 3


def _compiling(monkeypatch: pytest.MonkeyPatch, readings: list[float]) -> list[float]:
    """The compiler threads' CPU seconds at each look (one a second, not waited here)."""
    left = list(readings)
    monkeypatch.setattr(bench_warmup, "compiler_cpu_s", lambda pid: left.pop(0))
    return left


def test_the_wait_lasts_while_the_compilers_work(monkeypatch: pytest.MonkeyPatch) -> None:
    left = _compiling(monkeypatch, [10.0, 10.9, 11.5, 11.8, 11.83, 99.0])
    compiled, _ = bench_warmup.wait_compilers_quiet(1, sleep=lambda s: None)
    assert compiled == pytest.approx(1.83)  # stopped at the first quiet second
    assert left == [99.0]


def test_the_wait_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_warmup, "QUIET_WAIT_S", 0.05)
    busy = itertools.count()  # a second of CPU at every look: never quiet
    monkeypatch.setattr(bench_warmup, "compiler_cpu_s", lambda pid: float(next(busy)))
    started = time.monotonic()
    bench_warmup.wait_compilers_quiet(1, sleep=lambda s: None)
    assert time.monotonic() - started < 1


def test_warm_up_runs_every_kind_twice_in_turn_and_says_so() -> None:
    ran: list[str] = []
    report = bench_warmup.warm_up([("raw", lambda: ran.append("raw")),
                                   ("kq", lambda: ran.append("kq"))], broker_pid=None)
    assert ran == ["raw", "kq", "raw", "kq"]
    assert report["kinds"] == ["raw", "kq"] and report["rounds"] == 2
    assert report["jit_wait_s"] == 0.0
