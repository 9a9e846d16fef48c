"""A restore the group no longer needs (its shard was given away meanwhile) stops at once,
instead of reading the journal to its marker while the instance's group callback waits for
it (no Kafka: the journal consumer is faked)."""

from __future__ import annotations

import time

import pytest

from broker.engine.engine import Engine
from broker.service import recovery
from broker.state.store import MemoryStore


class SilentJournal:
    """A journal consumer whose records never come (a slow broker, a long journal)."""

    def __init__(self) -> None:
        self.polls = 0
        self.assigned: list = []

    def assign(self, partitions: list) -> None:
        self.assigned = partitions

    def unassign(self) -> None:
        self.assigned = []

    def poll(self, timeout: float) -> None:
        self.polls += 1
        return None


def test_a_restore_stops_as_soon_as_it_is_told_and_leaves_the_journal(monkeypatch):
    monkeypatch.setattr(recovery, "take", lambda c, n, timeout: c.poll(timeout) or [])
    journal = SilentJournal()
    started = time.monotonic()
    rec = recovery.recover(MemoryStore(), Engine([]), journal, "p.journal",  # type: ignore[arg-type]
                           write_marker=lambda nonce: 1000, now=0, fetcher=None,  # type: ignore[arg-type]
                           stopping=lambda: journal.polls >= 3)
    assert rec is None
    assert journal.polls == 3 and journal.assigned == []
    assert time.monotonic() - started < recovery.JOURNAL_STALL_TIMEOUT_S / 10


def test_a_restore_not_told_to_stop_waits_for_its_marker(monkeypatch):
    """The other side of the rule: a silent journal is a stall, reported as one."""
    monkeypatch.setattr(recovery, "take", lambda c, n, timeout: c.poll(timeout) or [])
    monkeypatch.setattr(recovery, "JOURNAL_STALL_TIMEOUT_S", 0.05)
    journal = SilentJournal()
    with pytest.raises(recovery.StateError, match="up to offset 1000"):
        recovery.recover(MemoryStore(), Engine([]), journal, "p.journal",  # type: ignore[arg-type]
                         write_marker=lambda nonce: 1000, now=0, fetcher=None)  # type: ignore[arg-type]
