"""Contract tests run against both stores, and the checkpoint/load round trip."""

import pytest

from broker.engine.engine import Engine
from broker.state.layout import Checkpoint, Payload, load_engine, load_payload, load_positions
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
