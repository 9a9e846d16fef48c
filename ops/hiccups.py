"""Whether this machine stalls by itself: a bystander process times a fixed unit of pure-Python
work every 10 ms, and reports the stretches in which it ran several times slower than usual.

    python ops/hiccups.py [--seconds 20] [--json]

`ops/bench.py` runs it beside each paced run (`paced_hiccups`; it costs ~1% of a core): if
the machine slowed, the latencies' tail is the machine's as much as the system's. On a shared
virtual machine a unit's CPU time may grow ten-fold for tens of milliseconds at a time, with
no steal time reported: every process slows at once, and a pipeline of several processes
takes longest to catch up.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from dataclasses import dataclass

UNIT = 2_000  # loop turns of one unit: ~0.1 ms on a 2 GHz core
EVERY_S = 0.01
SLOW = 4.0  # a unit this many times its median is slowed
JOIN_S = 0.05  # slowed units closer than this make one stretch


@dataclass(frozen=True)
class Unit:
    at: float  # wall-clock seconds when it ended
    cpu_ms: float  # its thread's CPU time: grows too when the core itself is slowed


def work() -> float:
    """One unit; its CPU milliseconds."""
    began = time.thread_time()
    total = 0
    for i in range(UNIT):
        total += i
    return (time.thread_time() - began) * 1000


def sample(seconds: float) -> list[Unit]:
    """Units for `seconds` (0: with no end), or until a SIGTERM (how ops/bench.py stops it)."""
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    units = []
    end = time.time() + seconds if seconds else float("inf")
    while time.time() < end and not stopped:
        cpu_ms = work()
        units.append(Unit(time.time(), cpu_ms))
        time.sleep(EVERY_S)
    return units


def stretches(units: list[Unit]) -> list[tuple[float, float, float]]:
    """(start, end, worst factor) of each run of slowed units."""
    if not units:
        return []
    usual = statistics.median(u.cpu_ms for u in units)
    found: list[list[float]] = []
    for u in units:
        factor = u.cpu_ms / usual if usual else 0.0
        if factor < SLOW:
            continue
        if found and u.at - found[-1][1] <= JOIN_S:
            found[-1][1] = u.at
            found[-1][2] = max(found[-1][2], factor)
        else:
            found.append([u.at - u.cpu_ms / 1000, u.at, factor])
    return [(a, b, f) for a, b, f in found]


def summary(units: list[Unit]) -> dict[str, float]:
    runs = stretches(units)
    span = units[-1].at - units[0].at if len(units) > 1 else 0.0
    return {"units": len(units), "median_ms": statistics.median(u.cpu_ms for u in units)
            if units else float("nan"),
            "stretches": len(runs), "per_minute": len(runs) / span * 60 if span else 0.0,
            "slowed_ms": sum((b - a) * 1000 for a, b, _ in runs),
            "worst_factor": max((f for _, _, f in runs), default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="0: until SIGTERM")
    ap.add_argument("--json", action="store_true", help="the summary as JSON")
    ap.add_argument("--units", action="store_true", help=argparse.SUPPRESS)  # for ops/bench.py
    a = ap.parse_args()
    units = sample(a.seconds)
    if a.units:
        print("\n".join(f"{u.at:.4f} {u.cpu_ms:.4f}" for u in units))
        return
    result = summary(units)
    if a.json:
        print(json.dumps(result))
        return
    print(f"{result['units']} units of {result['median_ms']:.2f} ms CPU (median); "
          f"{result['stretches']} slowed stretches ({result['per_minute']:.0f} a minute), "
          f"{result['slowed_ms']:.0f} ms in all, at worst {result['worst_factor']:.0f}x slower")
    for a_, b, f in stretches(units):
        print(f"  {time.strftime('%H:%M:%S', time.localtime(a_))}.{int(a_ % 1 * 1000):03d} "
              f"{(b - a_) * 1000:5.0f} ms, {f:4.1f}x")


if __name__ == "__main__":
    main()
