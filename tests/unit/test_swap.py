"""A clean stop keeps the pager (broker.service.swap): the next start uses it as it is when
its store and its queues are still those, and rebuilds it otherwise; either way the queue it
loads is the stored one, in the same order."""

import json
import random

from broker.engine.engine import Engine
from broker.service.swap import keep_pager, use_kept_pager
from broker.state.layout import META_JOURNAL, journal_meta, load_engine, load_meta
from broker.state.pager import KEPT, LAYOUT, RocksPager
from tests.unit.harness import queue
from tests.unit.test_restore import NOW, picture, stored_queue

BUDGET = 32 << 20


def started(config, store, path, window=7):
    """An engine loaded as the service loads it at start: (engine, whether it used a kept
    pager)."""
    engine = Engine([config], pager=RocksPager(path, BUDGET, reuse=True), window=window)
    kept = use_kept_pager(engine, load_meta(store))
    load_engine(store, engine, NOW, kept)
    return engine, kept


def stopped(engine, store):
    keep_pager(engine, load_meta(store))
    engine.pager.close()


def reference(config, store):
    engine = Engine([config], window=10**9)
    load_engine(store, engine, NOW)
    return picture(engine)


def test_a_clean_stop_keeps_the_pager_and_the_next_start_loads_the_same_queue(tmp_path):
    store, _ = stored_queue(random.Random(1), 300)
    config = queue("Q", priority="/p")
    first, kept = started(config, store, tmp_path / "pager")
    assert not kept  # nothing kept yet: paged out as the store is read
    stopped(first, store)
    second, kept = started(config, store, tmp_path / "pager")
    q = second.queues["Q"]
    assert kept and 0 < len(q.available) <= 7 and q.paged > 0
    assert picture(second) == reference(config, store)


def test_after_a_crash_the_pager_is_rebuilt(tmp_path):
    store, _ = stored_queue(random.Random(2), 200)
    config = queue("Q")
    first, _ = started(config, store, tmp_path / "pager")
    stopped(first, store)
    second, kept = started(config, store, tmp_path / "pager")
    assert kept
    second.queues["Q"].refill()
    second.pager.close()  # no clean stop: the marker read at the start is gone for good
    third, kept = started(config, store, tmp_path / "pager")
    assert not kept
    assert picture(third) == reference(config, store)


def test_a_pager_kept_for_another_state_is_rebuilt(tmp_path):
    store, _ = stored_queue(random.Random(3), 200)
    plain, ranked = queue("Q"), queue("Q", priority="/p")
    first, _ = started(ranked, store, tmp_path / "pager")
    stopped(first, store)
    second, kept = started(plain, store, tmp_path / "pager")  # no longer ranked
    assert not kept and picture(second) == reference(plain, store)
    stopped(second, store)
    store.write({META_JOURNAL: journal_meta(41, 7, None)}, [])  # the store moved on
    third, kept = started(plain, store, tmp_path / "pager")
    assert not kept and picture(third) == reference(plain, store)


def test_a_queue_not_paged_out_as_stored_leaves_no_pager_to_keep(tmp_path):
    store, _ = stored_queue(random.Random(4), 100)
    config = queue("Q", expiration="1h")
    first, _ = started(config, store, tmp_path / "pager")
    stopped(first, store)
    second, kept = started(config, store, tmp_path / "pager")
    assert not kept and picture(second) == reference(config, store)


def test_a_pager_opened_without_reuse_starts_empty_whatever_a_stop_kept(tmp_path):
    store, _ = stored_queue(random.Random(5), 100)
    first, _ = started(queue("Q"), store, tmp_path / "pager")
    stopped(first, store)
    fresh = RocksPager(tmp_path / "pager", BUDGET)
    assert fresh.kept is None and fresh.count("Q") == 0 and fresh.first_order("Q") is None


def test_a_pager_kept_by_a_kq_with_another_key_layout_is_rebuilt(tmp_path):
    store, _ = stored_queue(random.Random(6), 100)
    config = queue("Q")
    first, _ = started(config, store, tmp_path / "pager")
    keep_pager(first, load_meta(store))
    marker = json.loads(bytes(first.pager._db.get(KEPT)))
    first.pager._db.put(KEPT, json.dumps({**marker, "layout": LAYOUT - 1}).encode())
    first.pager.close()
    second, kept = started(config, store, tmp_path / "pager")
    assert not kept and picture(second) == reference(config, store)
