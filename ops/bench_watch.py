"""What watches a phase of ops/bench.py from beside it: py-spy on the service (--profile), and
a bystander that sees the machine itself slow down (ops/hiccups.py) during a paced run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ops.hiccups import Unit, summary  # noqa: E402


def profiler(pid: int, out: Path | None) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the service (with --profile): stop it with SIGINT to write `out`."""
    if out is None:
        return None
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--format", "raw",
                             "--rate", "200", "--idle", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait()


def bystander() -> subprocess.Popen[str]:
    """ops/hiccups.py, timing its units until `slowed` stops it (10 minutes at most). Started
    before the paced run: Python's start is not charged to it."""
    return subprocess.Popen([sys.executable, str(ROOT / "ops" / "hiccups.py"), "--seconds",
                             "600", "--units"], stdout=subprocess.PIPE, text=True)


def slowed(proc: subprocess.Popen[str], since: float) -> dict[str, float]:
    """How often and how long the machine ran slowed from `since` (time.time()) to now."""
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    units = [Unit(float(at), float(cpu_ms)) for at, cpu_ms in
             (line.split() for line in out.splitlines() if line.strip())]
    found = summary([u for u in units if u.at >= since])
    return {k: round(found[k], 1) for k in ("stretches", "slowed_ms", "worst_factor")}
