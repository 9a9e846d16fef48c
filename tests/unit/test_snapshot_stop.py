"""A clean stop waits for its snapshot while the snapshot moves on, however long a big state
takes, and gives up soon after it stops moving (Kafka away): no Kafka, `_write` is faked."""

from __future__ import annotations

import threading
import time

import pytest

from broker.service import snapshots
from broker.service.snapshots import SnapshotWriter

STALL_S = 0.3


@pytest.fixture
def writer(monkeypatch, tmp_path) -> SnapshotWriter:
    monkeypatch.setattr(snapshots, "STALL_S", STALL_S)
    return SnapshotWriter(None, "", {}, "p.snapshots", 0, tmp_path,  # type: ignore[arg-type]
                          interval_s=3600, metrics=None)  # type: ignore[arg-type]


def _fake_write(writer: SnapshotWriter, steps: int, step_s: float, stall_after: int,
                done: threading.Event) -> None:
    def write() -> None:
        for i in range(steps):
            time.sleep(step_s)
            if i < stall_after:
                writer._progress_at = time.monotonic()  # a chunk built or acknowledged
        done.set()
    writer._write = write  # type: ignore[method-assign]


def test_a_snapshot_that_keeps_moving_is_waited_for_past_the_stall_time(writer):
    done = threading.Event()
    _fake_write(writer, steps=10, step_s=STALL_S / 3, stall_after=10, done=done)  # 3.3 stalls
    started = time.monotonic()
    writer.write_now()
    assert done.is_set() and not writer.busy
    assert time.monotonic() - started >= 3 * STALL_S


def test_a_snapshot_that_stops_moving_is_given_up_one_stall_after_its_last_step(writer,
                                                                              caplog):
    done = threading.Event()
    _fake_write(writer, steps=20, step_s=STALL_S / 3, stall_after=6, done=done)
    started = time.monotonic()
    writer.write_now()
    took = time.monotonic() - started
    assert not done.is_set() and writer.busy
    assert 6 * STALL_S / 3 + STALL_S <= took < 6 * STALL_S / 3 + 3 * STALL_S
    assert "stopping without it" in caplog.text


def test_the_stop_gives_up_at_its_limit_even_on_a_snapshot_still_moving(writer, monkeypatch):
    monkeypatch.setattr(snapshots, "STOP_LIMIT_S", 4 * STALL_S)
    done = threading.Event()
    _fake_write(writer, steps=20, step_s=STALL_S / 3, stall_after=20, done=done)
    started = time.monotonic()
    writer.write_now()
    assert writer.busy and not done.is_set()
    assert 4 * STALL_S <= time.monotonic() - started < 6 * STALL_S
