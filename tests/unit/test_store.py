"""Contract tests run against both stores, and the checkpoint/load round trip."""

import pytest

from broker.engine.engine import Engine
from broker.state.layout import Checkpoint, load_engine, load_payload, load_positions
from broker.state.payload import Payload
from broker.state.rocks import RocksStore
from broker.state.store import MemoryStore
from tests.unit.harness import Harness, delivered, queue
from tests.unit.test_engine_replay import snapshot


@pytest.fixture(params=["memory", "rocksdb"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else RocksStore(tmp_path / "db")
    yield s
    s.close()


def test_get_put_delete_and_prefix_scan(store):
    store.write({b"a\x00x": b"1", b"a\x00y": b"2", b"ab": b"3", b"b": b"4"}, [])
    assert [k for k, _ in store.scan(b"a\x00")] == [b"a\x00x", b"a\x00y"]
    store.write({b"c": b"5"}, [b"a\x00x"])
    assert store.get(b"a\x00x") is None
    assert store.get(b"c") == b"5"
    assert [k for k, _ in store.scan(b"")] == [b"a\x00y", b"ab", b"b", b"c"]


def test_checkpoint_then_load_restores_the_engine(store):
    cfg = (queue(max_cancels=3), queue("M", semantics="at-most-once"))
    h = Harness(*cfg)
    bms = h.publish(5)
    h.publish(2, queue="M")
    h.subscribe("w1", backlog=2)
    h.subscribe("w2", "M")
    first = delivered(h.effects)[0]
    h.ack(first[0], first[1])
    h.cancel("w1", delivered(h.effects)[1][1])
    cp = Checkpoint(transitions=list(h.journal), positions={("Q", "T", 0): 7}, journal_offset=3,
                    payloads={bm: Payload(b"k", b"{}", [("h", b"v")], 1) for bm in bms})
    cp.write(store, h.engine)
    fresh = Engine(cfg, 10_000)
    load_engine(store, fresh, h.now)
    assert snapshot(fresh) == snapshot(h.engine)
    assert load_positions(store) == {("Q", "T", 0): 7}
    assert load_payload(store, bms[-1]) == Payload(b"k", b"{}", [("h", b"v")], 1)
    assert load_payload(store, first[1]) is None  # acked: its payload is gone


def test_rocks_store_survives_reopen(tmp_path):
    s = RocksStore(tmp_path / "db")
    s.write({b"k": b"v"}, [])
    s.close()
    s = RocksStore(tmp_path / "db")
    assert s.get(b"k") == b"v"
    s.close()


def _memtable(store: RocksStore) -> int:
    return store._db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0


def _fill(store: RocksStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n, 1000):
        store.write({b"m%09d" % k: b"x" * 200 for k in range(i, i + 1000)}, [])


def test_an_idle_store_writes_a_full_memtable_out_and_its_memory_goes(tmp_path):
    import time

    store = RocksStore(tmp_path / "db", 32 << 20)
    _fill(store, 8000)  # about 2 MB of write buffer
    assert _memtable(store) > 1 << 20
    assert store.shed_memory() is True
    deadline = time.monotonic() + 30
    while _memtable(store) > 1 << 20 and time.monotonic() < deadline:  # written in RocksDB's
        time.sleep(0.05)  # background thread
    assert _memtable(store) < 1 << 20
    assert store.get(b"m000007999") == b"x" * 200  # (from the table file now)
    # at most every SHED_EVERY_S: a service idle between every few records makes no table
    # file of each; it is put off (the service asks again at a later idle turn)
    _fill(store, 8000, start=8000)
    assert store.shed_memory() is False
    assert _memtable(store) > 1 << 20
    store.close()


def test_an_idle_store_keeps_a_small_memtable(tmp_path):
    store = RocksStore(tmp_path / "db", 32 << 20)
    _fill(store, 1000)
    before = _memtable(store)
    assert store.shed_memory() is True  # nothing worth doing: done
    files = store._db.property_int_value("rocksdb.num-files-at-level0")
    assert files == 0 and _memtable(store) == before
    store.close()
