"""The soak's fencing check (ops/soak_check.py): what it calls a failure in a journal where a
woken owner wrote after its successor's takeover marker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from broker import wire

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))

from soak_check import Report, committed_transitions  # noqa: E402


class _Record:
    def __init__(self, offset: int, part: dict[str, Any]) -> None:
        self._offset, self._value = offset, wire.encode("journal", part)

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


def _journal(*entries: tuple[str, str | int]) -> list[_Record]:
    """("marker", nonce) or (writer, batch): one-part batches and markers in journal order."""
    out = []
    for offset, (who, what) in enumerate(entries):
        marker = what if who == "marker" else None
        out.append(_Record(offset, {
            "batch": -1 if marker else what, "part": 0, "parts": 1, "written_ms": 0,
            "marker": marker, "writer": None if marker else who, "inputs": [],
            "transitions": []}))
    return out


def _run(journal: list[_Record], exactly_once: bool = False) -> Report:
    report = Report()
    committed_transitions("unused", "kq.journal", 1, report, {0: journal}, exactly_once)
    return report


def test_the_batches_a_woken_owner_had_on_their_way_after_its_successors_marker_are_counted():
    """(Two: a batch's journal goes out while the one before it is on its way.)"""
    report = _run(_journal(("marker", "old"), ("old", 1), ("marker", "new"), ("old", 2),
                           ("old", 3), ("new", 1)))
    assert report.problems == []
    assert report.inert_batches == 2


def test_a_third_batch_after_the_successors_marker_is_a_fencing_failure():
    report = _run(_journal(("marker", "old"), ("marker", "new"), ("old", 2), ("old", 3),
                           ("old", 4)))
    assert report.inert_batches == 3
    assert report.problems == ["shard 0: journal offset 4 written by old after new took over "
                               "(3 batches after it)"]


def test_with_exactly_once_any_batch_after_the_successors_marker_is_a_failure():
    report = _run(_journal(("marker", "old"), ("marker", "new"), ("old", 2)), exactly_once=True)
    assert report.problems == ["shard 0: journal offset 2 written by old after new took over"]
