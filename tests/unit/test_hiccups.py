"""ops/hiccups.py: slowed units found and joined into stretches."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.hiccups import Unit, stretches, summary, work  # noqa: E402


def units(cpu_ms: list[float], every: float = 0.01) -> list[Unit]:
    return [Unit(100.0 + i * every, c) for i, c in enumerate(cpu_ms)]


def test_a_steady_machine_has_no_stretches() -> None:
    found = summary(units([0.3] * 500))
    assert found["stretches"] == 0 and found["slowed_ms"] == 0 and found["worst_factor"] == 0


def test_slowed_units_close_together_are_one_stretch_and_far_apart_two() -> None:
    cpu = [0.3] * 300
    cpu[50] = cpu[52] = 3.0  # 20 ms apart: one stretch
    cpu[200] = 1.5  # 5x: another
    cpu[250] = 1.0  # 3.3x: not slowed enough
    runs = stretches(units(cpu))
    assert [round(f, 1) for _, _, f in runs] == [10.0, 5.0]
    start, end, _ = runs[0]
    assert end == pytest.approx(100.52) and start == pytest.approx(100.50 - 0.003)
    found = summary(units(cpu))
    assert found["stretches"] == 2
    assert found["per_minute"] == pytest.approx(2 / 2.99 * 60)
    assert found["slowed_ms"] == pytest.approx(23.0 + 1.5)


def test_a_unit_costs_cpu() -> None:
    assert work() > 0


def catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (15 - 1)))


def test_the_bench_stops_its_bystander_and_reads_what_it_timed() -> None:
    from ops.bench_watch import bystander, slowed

    began = time.time()
    proc = bystander()
    while not catches_sigterm(proc.pid):  # its handler in place: it has started timing
        time.sleep(0.01)
    time.sleep(0.2)
    found = slowed(proc, since=began)
    assert proc.returncode == 0  # it stopped on SIGTERM and printed its units
    assert set(found) == {"stretches", "slowed_ms", "worst_factor"}
    assert found["stretches"] >= 0 and found["slowed_ms"] >= 0


def test_only_units_since_the_paced_start_count() -> None:
    cpu = [0.3] * 300
    cpu[10] = 3.0  # before the start
    assert summary(units(cpu))["stretches"] == 1
    assert summary([u for u in units(cpu) if u.at >= 100.5])["stretches"] == 0
