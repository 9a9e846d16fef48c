"""CPU by thread for ops/bench.py: where a process's CPU per message goes, from the thread
names Linux shows in /proc (HotSpot's, librdkafka's and RocksDB's own threads are named).

broker (a JVM): `jit` (the C1/C2 compiler threads: a broker still warming up), `requests`
(Kafka's request handlers), `network`, `gc`, `other`. kq serve or the relay (Python):
`python` (the threads running Python: kq's loops, and the Kafka calls made from them),
`librdkafka` (its own threads: sockets, batching), `rocksdb` (flushes and compactions).
"""

from __future__ import annotations

import os
from pathlib import Path

_GROUPS = [  # (the start of a thread's name, its group), first match wins
    ("C1 CompilerThre", "jit"), ("C2 CompilerThre", "jit"),
    ("data-plane-kafk", "requests"), ("kafka-request-h", "requests"),
    ("data-plane-kafka-network", "network"), ("kafka-network-t", "network"),
    ("GC Thread", "gc"), ("G1 ", "gc"),
    ("rdk:", "librdkafka"), ("rocksdb:", "rocksdb"),
]


def group_of(name: str, python: bool) -> str:
    for start, group in _GROUPS:
        if name.startswith(start):
            return group
    return "python" if python else "other"


def cpu_by_thread(pid: int | None) -> dict[str, float]:
    """CPU seconds so far of each group of the process's live threads (empty when it is
    gone or unknown). Threads that ended took their seconds with them: compare readings
    over a span in which the process keeps its threads (a drain)."""
    if pid is None:
        return {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        python = "python" in (Path(f"/proc/{pid}/comm").read_text())
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = {}
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        group = group_of(name, python)
        seconds[group] = seconds.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return seconds


def threads_per_msg(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """µs per message of each group over the span, largest first."""
    spent = {g: after[g] - before.get(g, 0.0) for g in after}
    return {g: round(s / n * 1e6, 1) for g, s in sorted(spent.items(), key=lambda x: -x[1])
            if s > 0}
