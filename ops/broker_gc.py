"""The broker's garbage-collection pauses during a paced run of ops/bench.py.

Apache Kafka runs on the JVM, whose collector stops the broker now and then: on a 2-core
machine G1's young collections take 10-40 ms every second or few under the bench's load, and
every record in flight meanwhile waits, whichever system it belongs to. `kq broker --apache`
logs each pause (`-Xlog:gc`, a file in its data directory); the bench reads that log through
the broker's command line, so the pauses of a paced run can be told from each system's own
tail. A broker started otherwise, or not on this machine, has no log the bench can find.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Final

LOG_FLAG: Final = re.compile(r"^-Xlog:gc[^:]*:file=([^:]+)")
# a pause as `-Xlog:gc` with the timemillis decorator writes it, when it ended:
#   [1796322101401ms] GC(37) Pause Young (Normal) (G1 Evacuation Pause) 307M->197M(512M) 24.054ms
PAUSE: Final = re.compile(r"^\[(\d+)ms\] GC\(\d+\) Pause .* (\d+(?:\.\d+)?)ms$")


def gc_log_of(pid: int | None) -> Path | None:
    """The GC log a JVM writes, as its command line names it (None: no such log)."""
    if pid is None:
        return None
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\x00")
    except OSError:
        return None
    for arg in args:
        found = LOG_FLAG.match(arg.decode(errors="replace"))
        if found:
            return Path(found.group(1))
    return None


def pauses_between(lines: list[str], since_ms: float, until_ms: float) -> list[float]:
    """The pauses (ms) that ended from `since_ms` to `until_ms` (epoch ms)."""
    out = []
    for line in lines:
        found = PAUSE.match(line.strip())
        if found and since_ms <= int(found.group(1)) <= until_ms:
            out.append(float(found.group(2)))
    return out


def broker_gc(pid: int | None, since: float) -> dict[str, float] | None:
    """The broker's pauses from `since` (time.time()) to now: how many, their total and the
    longest, in ms; None when its JVM keeps no GC log the bench can read."""
    log = gc_log_of(pid)
    if log is None:
        return None
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = pauses_between(lines, since * 1000, time.time() * 1000)
    return {"pauses": len(found), "paused_ms": round(sum(found), 1),
            "longest_ms": round(max(found, default=0.0), 1)}
