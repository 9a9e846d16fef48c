"""The collector around a restore: paused while it runs, back afterwards, whatever happens."""

import gc

import pytest

from broker.service.memory import collector_paused


def test_a_restore_runs_without_collections_and_they_resume_after_it():
    seen = []
    restore = collector_paused(lambda: seen.append(gc.isenabled()) or "restored")
    assert restore() == "restored"
    assert seen == [False]
    assert gc.isenabled()


def test_collections_resume_after_a_failed_restore():
    def fails() -> None:
        raise RuntimeError("the journal is gone")

    with pytest.raises(RuntimeError):
        collector_paused(fails)()
    assert gc.isenabled()


def test_two_shards_restoring_at_once_keep_it_paused_until_both_are_done():
    inner_done = []

    def second() -> None:
        inner_done.append(gc.isenabled())

    def first() -> bool:
        collector_paused(second)()  # the other shard finishes first
        return gc.isenabled()

    assert collector_paused(first)() is False
    assert inner_done == [False]
    assert gc.isenabled()
