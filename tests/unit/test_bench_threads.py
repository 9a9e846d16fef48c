"""ops/bench_threads.py: a process's CPU by thread group, from /proc's thread names (a
thread of this process is renamed to play a JVM compiler thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops import bench_threads  # noqa: E402
from ops.bench_threads import (  # noqa: E402
    cpu_by_thread,
    cpu_seconds,
    group_of,
    paced_cpu,
    paced_start,
    stolen_seconds,
    threads_per_msg,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


@pytest.mark.parametrize(("name", "python", "group"), [
    ("C2 CompilerThre", False, "jit"), ("C1 CompilerThre", False, "jit"),
    ("data-plane-kafk", False, "requests"), ("GC Thread#0", False, "gc"),
    ("G1 Refine#0", False, "gc"), ("VM Thread", False, "other"),
    ("rdk:broker1", True, "librdkafka"), ("rdk:main", True, "librdkafka"),
    ("rocksdb:low", True, "rocksdb"), ("python", True, "python")])
def test_threads_are_grouped_by_name(name: str, python: bool, group: str) -> None:
    assert group_of(name, python) == group


def test_a_threads_cpu_is_counted_in_its_group() -> None:
    burnt, done = threading.Event(), threading.Event()

    def compiler() -> None:
        comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm")
        comm.write_text("C2 CompilerThre")
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            sum(range(1000))
        burnt.set()
        done.wait(10)
        # its own name again: a thread lingers in /proc a moment after join() returns, and
        # must not look like a compiler to the next test
        comm.write_text("python")

    before = cpu_by_thread(os.getpid())
    worker = threading.Thread(target=compiler)
    worker.start()
    try:
        assert burnt.wait(30)
        after = cpu_by_thread(os.getpid())
    finally:
        done.set()
        worker.join()
    assert after["jit"] - before.get("jit", 0.0) >= 0.2
    assert "python" in after  # this test's own thread
    per_msg = threads_per_msg(before, after, 1000)
    assert per_msg["jit"] >= 200  # µs per message, 0.2 s over 1,000 messages


def test_a_gone_or_unknown_process_has_no_threads() -> None:
    assert cpu_by_thread(None) == {}
    assert cpu_by_thread(2**22 + 12345) == {}


BURNER = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("burnt", flush=True)
sys.stdin.readline()
"""


def test_a_paced_run_counts_the_service_cpu_from_its_start() -> None:
    service = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert service.stdin is not None and service.stdout is not None
    try:
        assert service.stdout.readline() == "ready\n"  # its start-up is behind it
        before = paced_start(service.pid, broker_cpu_s=5.0)
        service.stdin.write("go\n")
        service.stdin.flush()
        assert service.stdout.readline() == "burnt\n"
        figures = paced_cpu(before, cpu_seconds(service.pid), 5.1, 1000)
    finally:
        service.kill()
        service.wait()
    # 0.3 s over 1,000 messages, counted in ticks of 10 ms
    assert 280 <= figures["service"] < 1000
    assert figures["machine"] >= figures["service"] - 20  # every process, this one too
    assert figures["broker"] == 100.0  # 0.1 s more of the broker's, as given
    assert "stolen" in figures


def test_stolen_time_is_the_steal_column_and_not_the_machine_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = {"now": ["100", "0", "50", "900", "0", "0", "0", "7", "0", "0"]}
    monkeypatch.setattr(bench_threads, "_all_cores", lambda: ticks["now"])
    before = paced_start(os.getpid(), broker_cpu_s=0.0)
    ticks["now"] = ["200", "0", "50", "900", "0", "0", "0", "57", "0", "0"]
    figures = paced_cpu(before, cpu_seconds(os.getpid()), 0.0, 1000)
    tick = os.sysconf("SC_CLK_TCK")
    assert figures["stolen"] == round(50 / tick / 1000 * 1e6, 1)  # 50 ticks more of steal
    assert figures["machine"] == round(100 / tick / 1000 * 1e6, 1)  # steal not counted in it
    monkeypatch.setattr(bench_threads, "_all_cores", lambda: ["1"] * 7)  # no steal column
    assert stolen_seconds() == 0.0
