"""CPU accounting for ops/bench.py: per process and per machine (/proc), per message of a
phase, and by thread: where a process's CPU per message goes, from the thread names Linux
shows in /proc (HotSpot's, librdkafka's and RocksDB's own threads are named).

broker (a JVM): `jit` (the C1/C2 compiler threads: a broker still warming up), `requests`
(Kafka's request handlers), `network`, `gc`, `other`. kq serve or the relay (Python):
`python` (the threads running Python: kq's loops, and the Kafka calls made from them),
`librdkafka` (its own threads: sockets, batching), `rocksdb` (flushes and compactions).
"""

from __future__ import annotations

import os
import subprocess
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


def per_msg(cpu_s: dict[str, float], n: int) -> dict[str, float]:
    return {role: round(s / n * 1e6, 1) for role, s in cpu_s.items()}


PacedStart = tuple[float, float, float, float]


def paced_start(service_pid: int, broker_cpu_s: float) -> PacedStart:
    """The service's, the machine's and the broker's CPU seconds, and the seconds the
    hypervisor took, as the paced run starts."""
    return cpu_seconds(service_pid), machine_cpu_seconds(), broker_cpu_s, stolen_seconds()


def paced_cpu(before: PacedStart, service_cpu_s: float, broker_cpu_s: float,
              n: int) -> dict[str, float]:
    """CPU per message of a paced run of `n` (the service at a rate its workers keep up
    with, where the drain's figures spread each batch's costs over hundreds of messages),
    from its first publish to its last ack (now); `service_cpu_s`, `broker_cpu_s`: their
    CPU seconds now. The workers' (`subscribers`) is added once they have exited.
    `stolen`: the time the hypervisor reported running something else while this machine's
    processes wanted its cores (the slowdowns ops/hiccups.py sees may come with none)."""
    return per_msg({"service": service_cpu_s - before[0], "broker": broker_cpu_s - before[2],
                    "machine": machine_cpu_seconds() - before[1],
                    "stolen": stolen_seconds() - before[3]}, n)


def wait_cpu(proc: subprocess.Popen[bytes]) -> float:
    """Wait for a child and return the CPU seconds it used."""
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def _all_cores() -> list[str]:
    """The clock ticks of /proc/stat's `cpu` line: user, nice, system, idle, iowait, irq,
    softirq, steal, ..."""
    return Path("/proc/stat").read_text().splitlines()[0].split()[1:]


def machine_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used (all cores, idle and I/O wait
    excluded): with the broker, the relay or service, and the subscribers all here, what a
    message costs the whole machine."""
    fields = _all_cores()
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def stolen_seconds() -> float:
    """The /proc/stat `steal` time of all cores: while a virtual machine's core is taken by
    the hypervisor, every process on it stops (and Linux may still charge the time to the
    process that was running). 0 on a machine of its own."""
    fields = _all_cores()
    return int(fields[7]) / os.sysconf("SC_CLK_TCK") if len(fields) > 7 else 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (a figure noise on the machine hardly
    moves, unlike wall-clock rates)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
