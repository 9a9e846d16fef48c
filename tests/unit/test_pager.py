"""The pager contract (broker.engine.paging): the RocksDB pager the service uses answers
exactly as the memory one the engine tests use, over random work on priority orders."""

import random

import pytest

from broker.engine.paging import MemoryPager
from broker.engine.queue import Message
from broker.state.pager import RocksPager, order_key
from broker.values import Bookmark


def test_order_keys_sort_as_delivery_orders_do():
    orders = [(float("inf"), 5), (-9.0, 3), (-9.0, 1), (2.5, 7), (-0.5, 2), (0.0, 4),
              (float("inf"), 1), (-1e300, 9), (3, 8), (-3, 8)]
    assert sorted(orders, key=order_key) == sorted(orders)


def seen(msgs):
    return [(str(m.bookmark), m.seq, m.priority, m.timestamp_ms) for m in msgs]


@pytest.mark.parametrize("priorities", [[None, 1, 5, 9.5, -2], [None]],
                         ids=["ranked", "arrival-order"])
@pytest.mark.parametrize("seed", range(5))
def test_the_rocksdb_pager_answers_as_the_memory_one(tmp_path, seed, priorities):
    """Arrival order (no priority) is its own case: the RocksDB pager then takes the front
    of the queue as key ranges."""
    rng = random.Random(seed)
    rocks, memory = RocksPager(tmp_path / "pager", 32 << 20), MemoryPager()
    live: list[Message] = []
    for seq in range(400):
        op = rng.random()
        if op < 0.6 or not live:
            msg = Message(Bookmark(f"T.{seq % 3}", seq % 2, seq), seq, 1000 + seq)
            msg.priority = rng.choice(priorities)
            rocks.put("Q", msg)
            memory.put("Q", msg)
            live.append(msg)
        elif op < 0.75:
            bm = rng.choice(live).bookmark
            assert seen([rocks.take("Q", bm)]) == seen([memory.take("Q", bm)])
            live = [m for m in live if m.bookmark != bm]
        elif op < 0.85:
            n = rng.randrange(1, 5)
            taken = rocks.take_first("Q", n)
            assert seen(taken) == seen(memory.take_first("Q", n))
            live = [m for m in live if m.bookmark not in {t.bookmark for t in taken}]
            if rng.random() < 0.3:  # paged out again, as an eviction does
                for msg in taken:
                    rocks.put("Q", msg)
                    memory.put("Q", msg)
                live += taken
        elif op < 0.95:
            after = memory.after("Q", None, rng.randrange(1, 20))
            order = after[-1].order if after else None
            assert seen(rocks.after("Q", order, 6)) == seen(memory.after("Q", order, 6))
        else:
            after_seq = rng.randrange(-1, seq + 1)
            assert seen(rocks.by_seq("Q", after_seq)) == seen(memory.by_seq("Q", after_seq))
        assert rocks.count("Q") == memory.count("Q") == len(live)
        assert rocks.first_order("Q") == memory.first_order("Q")
    probe = live[0].bookmark if live else Bookmark("T.0", 0, 0)
    assert seen([m for m in [rocks.get("Q", probe)] if m]) == seen(
        [m for m in [memory.get("Q", probe)] if m])
    assert rocks.get("Q", Bookmark("nope", 0, 1)) is None
    assert rocks.count("other") == 0 and rocks.take_first("other", 3) == []


def test_a_pager_emptied_by_takes_holds_no_keys(tmp_path):
    """What a message writes is deleted when it is taken, whichever way: in arrival order it
    has no s key to delete, with a priority it has one (a key left behind would fill the
    disk of a queue that runs for months)."""
    rocks = RocksPager(tmp_path / "pager", 32 << 20)
    msgs = []
    for seq in range(60):
        msg = Message(Bookmark("T", 0, seq), seq, 1000 + seq)
        msg.priority = None if seq % 3 else seq % 7
        msgs.append(msg)
        rocks.put("Q", msg)
    assert rocks.take("Q", msgs[7].bookmark) is not None  # ranked
    assert rocks.take("Q", msgs[8].bookmark) is not None  # arrival order
    while rocks.take_first("Q", 9):
        pass
    rocks._flush()
    assert rocks.count("Q") == 0 and list(rocks._db.keys()) == []


def test_the_rocksdb_pager_starts_empty(tmp_path):
    first = RocksPager(tmp_path / "pager", 32 << 20)
    first.put("Q", Message(Bookmark("T", 0, 1), 1, 1))
    first.close()
    again = RocksPager(tmp_path / "pager", 32 << 20)
    assert again.count("Q") == 0 and again.take_first("Q", 5) == []


@pytest.mark.parametrize("seed", range(3))
def test_both_pagers_give_back_due_timers_alike_earliest_first(tmp_path, seed):
    rng = random.Random(seed)
    rocks, memory = RocksPager(tmp_path / "pager", 32 << 20), MemoryPager()
    now = 0
    for seq in range(500):
        if rng.random() < 0.7:
            at = now + rng.randrange(-50, 500) - 100  # (times before 0 too)
            for p in (rocks, memory):
                p.add_timer("Q", at, seq, Bookmark("T", 0, seq))
        else:
            now += rng.randrange(0, 100)
            limit = rng.randrange(1, 30)
            got = rocks.due_timers("Q", now, limit)
            assert got == memory.due_timers("Q", now, limit)
            assert got == sorted(got) and all(at <= now for at, _, _ in got)
    assert rocks.due_timers("Q", 10**12, 10**6) == memory.due_timers("Q", 10**12, 10**6)
    assert rocks.due_timers("other", 10**12, 5) == []


def test_a_tick_with_no_timer_due_does_not_read_the_pager(tmp_path):
    # every loop turn asks for due timers: an idle queue's answer comes from memory, with
    # no seek into RocksDB (a read first writes out the puts waiting in the pager's batch)
    rocks = RocksPager(tmp_path / "pager", 32 << 20)
    rocks.add_timer("Q", 1_000, 1, Bookmark("T", 0, 1))
    assert rocks.due_timers("Q", 10, 5) == []  # read once: the next is due at 1,000
    assert rocks.due_timers("other", 10, 5) == []  # read once: none at all
    rocks.put("Q", Message(Bookmark("T", 0, 9), 9, 9))  # a put waiting in the batch
    assert rocks.due_timers("Q", 999, 5) == [] and rocks.due_timers("other", 10**12, 5) == []
    assert rocks._pending_items == 1, "the pager was read"
    rocks.add_timer("Q", 400, 3, Bookmark("T", 0, 3))  # earlier than any known: read again
    assert rocks.due_timers("Q", 600, 5) == [(400, 3, Bookmark("T", 0, 3))]
    assert rocks._pending_items == 0
    assert rocks.due_timers("Q", 1_000, 5) == [(1_000, 1, Bookmark("T", 0, 1))]


def test_timers_a_clean_stop_kept_are_due_after_the_start(tmp_path):
    first = RocksPager(tmp_path / "pager", 32 << 20)
    first.add_timer("Q", 1_000, 1, Bookmark("T", 0, 1))
    first.keep({"queues": {}})
    first.close()
    again = RocksPager(tmp_path / "pager", 32 << 20, reuse=True)
    assert again.kept is not None
    again.add_timer("Q", 2_000, 2, Bookmark("T", 0, 2))  # a later one, before any tick
    assert again.due_timers("Q", 1_500, 5) == [(1_000, 1, Bookmark("T", 0, 1))]
