"""The fence without broker transactions: when an owner looks at its journal partition for a
new owner's takeover marker, and that finding one stops it before it writes."""

from __future__ import annotations

from typing import Any

import pytest

from broker import wire
from broker.errors import FencedError
from broker.service import fence as fence_module
from broker.service.fence import Fence

SESSION_S = 10.0


class Journal:
    """The shard's journal partition as the fence sees it: offsets holding markers."""

    def __init__(self) -> None:
        self.markers: list[str] = []
        self.looks = 0

    def end_offset(self, _consumer: Any, _topic: str, _partition: int) -> int:
        self.looks += 1
        return len(self.markers)

    def records(self, _consumer: Any, _topic: str, _partition: int, start: int, end: int):
        for offset in range(start, end):
            yield _Record(offset, self.markers[offset])


class _Record:
    def __init__(self, offset: int, marker: str) -> None:
        self._offset, self._marker = offset, marker

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return wire.encode("journal", {
            "batch": -1, "part": 0, "parts": 0, "written_ms": 0, "marker": self._marker,
            "writer": None, "inputs": [], "transitions": []})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def setup(monkeypatch):
    journal, clock = Journal(), Clock()
    monkeypatch.setattr(fence_module, "end_offset", journal.end_offset)
    monkeypatch.setattr(fence_module, "records", journal.records)
    journal.markers.append("ours")
    f = Fence(lambda: None, "kq.journal", 0, SESSION_S, clock=clock, sleep=clock.sleep)
    f.writer = "ours"
    return f, journal, clock


def _busy(f: Fence, clock: Clock, seconds: float, last_offset: int = 0) -> None:
    """The loop turning and committing every 10 ms (no other writer in between)."""
    for _ in range(int(seconds * 100)):
        clock.now += 0.01
        f.alive()
        f.before_commit(last_offset)
        f.after_journal(last_offset, last_offset + 1)


def test_a_busy_owner_does_not_look_at_the_journal(setup):
    f, journal, clock = setup
    _busy(f, clock, 30)
    assert journal.looks == 0


def test_after_a_quiet_spell_the_owner_looks_once_and_stops_on_a_new_owners_marker(setup):
    f, journal, clock = setup
    f.alive()
    clock.now += SESSION_S  # idle: the loop turns, nothing to commit
    f.before_commit(0)
    assert journal.looks == 1
    clock.now += SESSION_S
    journal.markers.append("theirs")
    with pytest.raises(FencedError, match="another instance took it over"):
        f.before_commit(0)


def test_a_woken_frozen_owner_looks_before_every_commit_for_three_session_timeouts(setup):
    f, journal, clock = setup
    _busy(f, clock, 1)
    clock.now += SESSION_S  # frozen: the loop did not turn
    _busy(f, clock, 2)
    assert journal.looks == 200  # the new owner may write its marker any moment now
    journal.markers.append("theirs")  # ... as it does
    with pytest.raises(FencedError, match="journal offset 1"):
        _busy(f, clock, 0.01)


def test_a_freeze_inside_a_turn_is_seen_at_the_commit_it_delayed(setup):
    """Frozen while waiting for the batch before's journal: its acknowledgement on waking
    proves the last write ours a moment ago, and the next turn comes after this commit."""
    f, journal, clock = setup
    _busy(f, clock, 1)
    f.alive()  # a turn begins
    clock.now += SESSION_S  # frozen in it
    f.after_journal(0, 1)  # the batch before's journal, acknowledged on waking
    journal.markers.append("theirs")  # the new owner's marker, written meanwhile
    with pytest.raises(FencedError, match="journal offset 1"):
        f.before_commit(0)


def test_a_freeze_is_warned_of_once(setup, caplog):
    f, _, clock = setup
    f.alive()
    clock.now += SESSION_S
    f.before_commit(0)  # seen here, inside the turn ...
    f.alive()  # ... not again at the next turn
    assert sum("did not turn" in r.message for r in caplog.records) == 1


def test_the_watch_after_a_freeze_ends(setup):
    f, journal, clock = setup
    f.alive()
    clock.now += SESSION_S
    _busy(f, clock, 3 * SESSION_S + 0.1)
    looks = journal.looks
    _busy(f, clock, 5)
    assert journal.looks == looks


def test_an_owner_the_group_no_longer_gives_the_shard_stops_before_writing(setup):
    _, journal, clock = setup
    owned = [True]
    f = Fence(lambda: None, "kq.journal", 0, SESSION_S, still_owner=lambda: owned[0],
              clock=clock, sleep=clock.sleep)
    f.before_commit(0)
    owned[0] = False
    with pytest.raises(FencedError, match="the group gave it to another instance"):
        f.before_commit(0)


def test_a_shard_given_away_during_its_restore_writes_no_takeover_marker(setup):
    _, journal, clock = setup
    owned = [True]
    f = Fence(lambda: None, "kq.journal", 0, SESSION_S, still_owner=lambda: owned[0],
              clock=clock, sleep=clock.sleep)
    f.before_marker()  # still ours: the marker may be written
    owned[0] = False  # the session expired while the local state was loading
    with pytest.raises(FencedError, match="before its takeover marker was written"):
        f.before_marker()


def test_a_woken_owner_waits_for_the_group_before_its_next_commit(setup):
    """Its eviction reaches it at its first heartbeat after waking; a look at the journal
    alone would miss a new owner whose marker lands right after the look."""
    _, journal, clock = setup
    owned, slept = [True], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        owned[0] = False  # meanwhile the group said: evicted

    f = Fence(lambda: None, "kq.journal", 0, SESSION_S, still_owner=lambda: owned[0],
              clock=clock, sleep=sleep)
    f.writer = "ours"
    _busy(f, clock, 1)
    assert slept == []  # a running owner never waits
    clock.now += SESSION_S  # frozen
    f.alive()
    with pytest.raises(FencedError, match="the group gave it to another instance"):
        f.before_commit(0)
    assert slept == [pytest.approx(2.0)]  # two heartbeat intervals of a 10 s session
    assert journal.looks == 0  # it stopped before writing, without needing the journal
