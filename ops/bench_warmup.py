"""The broker's warm-up before ops/bench.py measures anything.

A JVM runs new code interpreted, then compiles what is hot (C1, then C2 once a method has run
some thousands of times), and on a 2-core machine its compiler threads take most of a core for
tens of seconds. Kafka's hot paths depend on the traffic: relaying single records, serving a
share group and kq's batched deliveries and commands each make the broker compile code of its
own. Measured unwarmed, a phase paid for the compiling its kind of traffic caused (the C2
compiler threads used 30-85 us per message in kq's drain, as much as the broker's request
handlers), and its drain lost the core they took. A long-running broker has compiled all of it
long ago, so every measured kind runs unmeasured first, twice over, and then the compiler
threads are left to finish their queue. Twice: after one round the phase measured first (the
raw relay) still paid 3-9 us per message of compiling, as the kinds warmed after it had made
the JVM compile some of its paths again for their traffic; after two, 0.1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ops.bench_threads import cpu_by_thread

QUIET_CPU_S = 0.05  # compiler CPU in a second below which the JIT counts as done
QUIET_WAIT_S = 120.0  # give up waiting for that after this long
ROUNDS = 2  # times every kind is run


def kinds_measured(bs: str, n: int, phases: set[str], a: argparse.Namespace,
                   tmp: Path) -> list[tuple[str, Callable[[], object]]]:
    """An unmeasured run of n messages of every kind of traffic the run measures."""
    from ops.bench import run_kq, run_raw

    kinds: list[tuple[str, Callable[[], object]]] = []
    if "raw" in phases:
        kinds.append(("raw", lambda: run_raw(bs, n, a.subscribers, a.rate, tmp)))
    if "share" in phases:
        from ops.bench_share import run_share
        kinds.append(("share", lambda: run_share(bs, n, a.subscribers, a.rate, tmp)))
    if phases & {"kq", "rss"}:
        kinds.append(("kq", lambda: run_kq(bs, n, a.subscribers, a.rate, tmp, a.backlog)))
    return kinds


def warm_up(kinds: list[tuple[str, Callable[[], object]]], broker_pid: int | None) -> dict:
    """Run each kind of traffic ROUNDS times in turn, unmeasured, then wait for the broker's
    JIT compilers to fall quiet; what it cost, for the report."""
    began = time.monotonic()
    for name, run in kinds * ROUNDS:
        print(f"warming the broker up: {name}", file=sys.stderr, flush=True)
        run()
    compiled_s, waited_s = wait_compilers_quiet(broker_pid) if broker_pid else (0.0, 0.0)
    return {"kinds": [name for name, _ in kinds], "rounds": ROUNDS,
            "seconds": round(time.monotonic() - began, 1), "jit_wait_s": round(waited_s, 1),
            "jit_cpu_s_while_waiting": round(compiled_s, 1)}


def compiler_cpu_s(pid: int) -> float:
    """CPU seconds the JVM's JIT compiler threads have used so far (0 if it is gone)."""
    return cpu_by_thread(pid).get("jit", 0.0)


def wait_compilers_quiet(pid: int,
                         sleep: Callable[[float], None] = time.sleep) -> tuple[float, float]:
    """Wait until the compiler threads used under QUIET_CPU_S in a second (at most
    QUIET_WAIT_S): their CPU meanwhile and the seconds waited."""
    began = time.monotonic()
    first = last = compiler_cpu_s(pid)
    while time.monotonic() - began < QUIET_WAIT_S:
        sleep(1)
        now, before = compiler_cpu_s(pid), last
        last = now
        if now - before < QUIET_CPU_S:
            break
    return last - first, time.monotonic() - began
