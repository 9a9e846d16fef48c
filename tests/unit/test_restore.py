"""A restart loads each queue from the store streaming: whatever the window, the queue it
rebuilds holds exactly what was stored (states, counts, order, recovery points), with only
a window of available messages in memory and the rest paged out."""

import random

import pytest

from broker import wire
from broker.engine.engine import Engine
from broker.engine.paging import MemoryPager
from broker.engine.queue import Message
from broker.engine.states import MessageState
from broker.service.queries import recovery_points
from broker.state.layout import encode_message, load_engine, message_key
from broker.state.pager import RocksPager
from broker.state.store import MemoryStore
from broker.values import Bookmark
from tests.unit.harness import queue

NOW = 1_700_000_000_000


def stored_queue(rng: random.Random, n: int) -> tuple[MemoryStore, list[Message]]:
    store, msgs = MemoryStore(), []
    for seq in range(n):
        msg = Message(Bookmark("T", seq % 3, 100 + seq), seq, NOW + rng.randrange(1000))
        msg.priority = rng.choice([None, 1.0, 5.0, 9.0])
        if rng.random() < 0.1:
            msg.state, msg.holder, msg.deadline_ms, msg.delivery_count = (
                MessageState.LEASED, "s1", NOW + 60_000, 1)
        msgs.append(msg)
        if rng.random() < 0.2:  # written by an earlier kq, in Avro
            value = wire.encode("stored_message", {
                "seq": msg.seq, "timestamp_ms": msg.timestamp_ms, "state": msg.state.value,
                "delivery_count": msg.delivery_count, "cancel_count": 0, "holder": msg.holder,
                "deadline_ms": msg.deadline_ms, "priority": msg.priority, "barrier": False})
        else:
            value = encode_message(msg)
        store.write({message_key("Q", msg.bookmark): value}, [])
    return store, msgs


def picture(engine: Engine) -> tuple:
    q = engine.queues["Q"]
    every = [(str(m.bookmark), m.seq, m.state.value, m.priority, m.delivery_count)
             for m in q.by_seq()]
    order = []
    while q.available or q.paged:  # the delivery order, by paging everything back in
        q.window = 10**9
        q.refill()
        order = [str(m.bookmark) for m in q.available.values()]
        break
    return (every, q.available_count(), q.depth(), q.stats.next_seq, q.oldest_timestamp(),
            recovery_points(q, {}), order)


@pytest.mark.parametrize("priority", [None, "/p"])
@pytest.mark.parametrize("window", [1, 7, 10_000])
def test_a_restored_queue_is_the_stored_one_with_only_a_window_in_memory(
        tmp_path, priority, window):
    store, _ = stored_queue(random.Random(window), 300)
    config = queue("Q", priority=priority) if priority else queue("Q")
    reference = Engine([config], window=10**9)
    load_engine(store, reference, NOW)
    for pager in (MemoryPager(), RocksPager(tmp_path / f"pager{window}", 32 << 20)):
        engine = Engine([config], pager=pager, window=window)
        load_engine(store, engine, NOW)
        q = engine.queues["Q"]
        assert len(q.available) <= window
        assert len(q.available) + q.paged == reference.queues["Q"].available_count()
        assert picture(engine) == picture(reference)


def test_expiration_queues_restore_the_same_way(tmp_path):
    store, _ = stored_queue(random.Random(3), 50)
    config = queue("Q", expiration="1h")
    reference = Engine([config], window=10**9)
    load_engine(store, reference, NOW)
    engine = Engine([config], window=4)
    load_engine(store, engine, NOW)
    assert engine.queues["Q"].paged > 0
    assert picture(engine) == picture(reference)


@pytest.mark.parametrize("priority", [None, "/p"])  # a priority queue with barriers is not paged
@pytest.mark.parametrize("window", [1, 10_000])
def test_a_restored_barrier_still_waits_for_the_messages_before_it(tmp_path, window, priority):
    store = MemoryStore()
    for seq in range(7):
        msg = Message(Bookmark("T", 0, seq), seq, NOW)
        msg.is_barrier = seq == 5
        store.write({message_key("Q", msg.bookmark): encode_message(msg)}, [])
    config = queue("Q", barrier_expression="/b = 1", priority=priority)
    for pager in (None, MemoryPager(), RocksPager(tmp_path / f"pager{window}", 32 << 20)):
        engine = Engine([config], pager=pager, window=window)
        load_engine(store, engine, NOW)
        q = engine.queues["Q"]
        barrier = q.first_barrier()
        assert barrier is not None and barrier.seq == 5
        assert not q.clear_before(barrier)  # five messages before it are not finished


@pytest.mark.parametrize("window", [1, 10_000])
def test_messages_with_their_own_expiry_still_expire_after_a_restart(tmp_path, window):
    from broker.engine import events as ev

    store = MemoryStore()
    for seq in range(5):
        msg = Message(Bookmark("T", 0, seq), seq, NOW)
        msg.expires_ms = NOW + 1_000 if seq % 2 else None  # kq-expiration on odd ones
        store.write({message_key("Q", msg.bookmark): encode_message(msg)}, [])
    for pager in (MemoryPager(), RocksPager(tmp_path / f"pager{window}", 32 << 20)):
        engine = Engine([queue("Q")], pager=pager, window=window)
        load_engine(store, engine, NOW)
        engine.handle(ev.Tick(), NOW + 1_000)
        q = engine.queues["Q"]
        assert [m.bookmark.offset for m in q.by_seq()] == [0, 2, 4]
        assert q.stats.removed["expired"] == 2


@pytest.mark.parametrize("window", [1, 10_000])
def test_held_messages_are_held_again_after_a_restart_until_their_moment(tmp_path, window):
    from broker.engine import events as ev

    store = MemoryStore()
    for seq in range(6):
        msg = Message(Bookmark("T", 0, seq), seq, NOW)
        msg.not_before_ms = NOW + 1_000 * seq if seq % 2 else None  # 1 s, 3 s, 5 s
        store.write({message_key("Q", msg.bookmark): encode_message(msg)}, [])
    for pager in (MemoryPager(), RocksPager(tmp_path / f"pager{window}", 32 << 20)):
        engine = Engine([queue("Q", hold_on_publish=True)], pager=pager, window=window)
        load_engine(store, engine, NOW + 1_000)  # the first one's moment has come
        q = engine.queues["Q"]
        assert sorted(bm.offset for bm in q.held) == [3, 5]
        assert (q.depth(), q.available_count()) == (6, 4)
        engine.handle(ev.Tick(), NOW + 4_999)
        assert sorted(bm.offset for bm in q.held) == [5]
