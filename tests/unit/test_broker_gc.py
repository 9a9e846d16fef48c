"""ops/broker_gc.py: the broker's GC pauses of a paced run, read from the log its JVM keeps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.broker_gc import broker_gc, gc_log_of, pauses_between  # noqa: E402

LOG = """\
[1000ms] GC(1) Pause Young (Normal) (G1 Evacuation Pause) 307M->197M(512M) 24.054ms
[1500ms] GC(2) Concurrent Mark Cycle
[2000ms] GC(3) Pause Remark 220M->210M(512M) 3.100ms
[2600ms] GC(4) Pause Young (Normal) (G1 Evacuation Pause) 245M->197M(512M) 16.047ms
[3000ms] GC(5) Concurrent Mark Cycle 120.300ms
"""


def test_only_the_pauses_that_ended_within_the_window_count() -> None:
    lines = LOG.splitlines()
    assert pauses_between(lines, 0, 10_000) == [24.054, 3.1, 16.047]  # not the concurrent work
    assert pauses_between(lines, 1500, 2600) == [3.1, 16.047]


def started(*args: str) -> subprocess.Popen[str]:
    """A process running `args` (after its exec: until then /proc shows the parent's)."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def test_the_log_is_found_on_the_jvms_command_line(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(LOG)
    proc = started("-Xmx64m", f"-Xlog:gc:file={log}:timemillis")
    try:
        assert gc_log_of(proc.pid) == log
        assert broker_gc(proc.pid, since=0) == {"pauses": 3, "paused_ms": 43.2,
                                                "longest_ms": 24.1}
    finally:
        proc.kill()
        proc.communicate()  # (reaped, its pipe closed)


def test_a_broker_without_a_gc_log_reports_none() -> None:
    proc = started()
    try:
        assert gc_log_of(proc.pid) is None and broker_gc(proc.pid, since=0) is None
        assert broker_gc(None, since=0) is None  # (a broker not on this machine)
    finally:
        proc.kill()
        proc.communicate()  # (reaped, its pipe closed)
