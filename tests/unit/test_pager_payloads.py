"""A deep queue's payloads ride in the pager's rows: a message paged out while its payload is
in hand (an arrival's) is delivered from memory after it is paged back in, not read back
from the store; any other (a restored one, a redelivery, one whose payload an idle release
dropped) reads it from the store. Either way each delivery carries its own message's
payload. Through the service's path without Kafka (`ops/bench_cpu.py`'s harness)."""

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker import wire
from broker.client.core import ClientCore
from broker.client.message import unpack_deliveries
from broker.engine import events as ev
from broker.engine.queue import Message
from broker.service.commit import Committer
from broker.state.held import ENTRY, HeldPayloads
from broker.state.layout import encode_message
from broker.state.pager import LAYOUT, RocksPager
from broker.values import Bookmark

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))

import bench_cpu  # noqa: E402


class _Capture(bench_cpu._Kafka):
    """The instant producer, keeping what was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, **kw: Any) -> None:
        self.sent.append((topic, value))
        super().produce(topic, value, key, **kw)


class _CountedReads:
    """The service's store, counting the payloads read from it (a compiled store's methods
    cannot be replaced)."""

    def __init__(self, store: Any) -> None:
        self.store, self.payload_reads = store, 0

    def get(self, key: bytes) -> bytes | None:
        self.payload_reads += key.startswith(b"p")
        return self.store.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _value(offset: int) -> bytes:
    return b'{"n": %d}' % offset


def _deep_service(tmp_path: Path, messages: int, window: int) -> tuple[Any, _Capture]:
    svc, _ = bench_cpu._service(tmp_path)
    kafka = _Capture()
    svc._committer = Committer(kafka, svc._store, svc.engine, "kq.journal",  # type: ignore
                               next_batch=0)
    svc.engine.queues["Q"].window = window
    batch = bench_cpu._batch(svc)
    for offset in range(messages):
        batch.cp.positions[("Q", "T", 0)] = offset + 1
        svc._source_record(bench_cpu._record("T", _value(offset), offset),
                           Bookmark("T", 0, offset), ["Q"], int(time.time() * 1000), batch)
    svc._commit(batch, messages)
    svc._committer.flush_held()
    return svc, kafka


def _deliveries(kafka: _Capture) -> list[tuple[str, int, bytes]]:
    """(bookmark, delivery count, value) of every message delivered so far, in order."""
    out = []
    for topic, value in kafka.sent:
        if topic.startswith("kq.deliver."):
            env = wire.decode("envelope", value)
            if env["kind"] == "messages":
                out += [(d[0], d[1], d[6]) for d in unpack_deliveries(env["batch"])]
    kafka.sent.clear()
    return out


def _send(svc: Any, outgoing: list[Any]) -> None:
    """Commands in one batch, its deliveries sent."""
    batch, now = bench_cpu._batch(svc), int(time.time() * 1000)
    for out in outgoing:
        svc._command(bench_cpu._record("kq.commands", out.value), None, now, batch)
    svc._run(ev.Tick(), now, batch)
    svc._commit(batch, len(outgoing))
    svc._committer.flush_held()


@pytest.mark.parametrize("idle_release", [False, True], ids=["from-rows", "after-idle"])
def test_each_delivery_of_a_deep_queue_carries_its_own_payload(tmp_path, idle_release):
    svc, kafka = _deep_service(tmp_path, 300, window=20)
    svc._store = store = _CountedReads(svc._store)
    worker = ClientCore("w", "")
    _send(svc, worker.command("subscribe", sub_id="s", queue="Q", max_backlog=10,
                              mode="queue"))
    got: dict[str, bytes] = {}
    cancelled = False
    while len(got) < 300:
        delivered = _deliveries(kafka)
        assert delivered, f"nothing delivered after {len(got)}"
        for bm, _, value in delivered:
            assert value == _value(Bookmark.parse(bm).offset), bm
            got[bm] = value
        if idle_release and len(got) > 150:
            svc._pager.shed_memory()  # what was paged back in is read from the store
        if not cancelled and len(got) > 100:  # the first comes again, from the store
            _send(svc, worker.command("cancel", queue="Q", bookmarks=[delivered[0][0]],
                                      delivery_counts=[delivered[0][1]]))
            cancelled = True
            del got[delivered[0][0]]
            delivered = delivered[1:]
        _send(svc, worker.ack_command("Q", [bm for bm, _, _ in delivered],
                                      [n for _, n, _ in delivered]))
    assert sorted(Bookmark.parse(bm).offset for bm in got) == list(range(300))
    # read from the store: the first window's (never paged out) and the redelivery; the
    # rest came with their rows (unless an idle release dropped those paged back in)
    assert store.payload_reads < (200 if idle_release else 40), store.payload_reads


def _message(offset: int) -> Message:
    return Message(Bookmark("T", 0, offset), offset, 1000 + offset)


def test_the_pager_hands_a_rows_payload_over_once_and_keeps_none_for_stored_records(tmp_path):
    pager = RocksPager(tmp_path / "pager", 32 << 20)
    pager.payload_source = lambda bm: b"P%d" % bm.offset if bm.offset % 2 else None
    pager.put_many("Q", [_message(i) for i in range(6)])
    stored = _message(7)  # restored from the store: its payload is there, not in hand
    pager.put_raw_many("Q", [(stored.order, stored.seq, str(stored.bookmark),
                              encode_message(stored))])
    taken = pager.take_first("Q", 3)
    assert [m.seq for m in taken] == [0, 1, 2]
    assert [pager.payload(m.bookmark) for m in taken] == [None, b"P1", None]
    assert pager.payload(taken[1].bookmark) is None  # handed over once
    assert pager.take("Q", Bookmark("T", 0, 3)) is not None
    assert pager.payload(Bookmark("T", 0, 3)) == b"P3"
    assert pager.take("Q", Bookmark("T", 0, 5)) is not None
    pager.shed_memory()  # an idle release forgets what was paged back in
    assert pager.payload(Bookmark("T", 0, 5)) is None
    assert [m.seq for m in pager.take_first("Q", 9)] == [4, 7]
    assert pager.payload(stored.bookmark) is None


def test_a_message_paged_out_again_keeps_its_payload_in_its_row(tmp_path):
    pager = RocksPager(tmp_path / "pager", 32 << 20)
    pager.payload_source = lambda bm: b"P%d" % bm.offset
    pager.put("Q", _message(1))
    (msg,) = pager.take_first("Q", 1)
    pager.payload_source = lambda bm: None  # no longer in hand
    pager.put("Q", msg)  # the window shrank again
    (again,) = pager.take_first("Q", 1)
    assert pager.payload(again.bookmark) == b"P1"


def test_payloads_held_are_bounded_by_bytes_the_older_half_dropped_first():
    held = HeldPayloads(budget=1000)  # each entry below counts 100 + ENTRY = 200 bytes
    for i in range(28):
        held.hold(Bookmark("T", 0, i), b"x" * (200 - ENTRY))
    kept = [i for i in range(28) if held.take(Bookmark("T", 0, i)) is not None]
    assert kept == [20, 21, 22, 23, 24, 25, 26, 27]  # the older half whole, the newer so far


def test_payloads_in_rows_outlast_a_clean_stop(tmp_path):
    """(A pager kept by a kq whose rows had no payloads is rebuilt: test_swap's layout test.)"""
    pager = RocksPager(tmp_path / "pager", 32 << 20)
    pager.payload_source = lambda bm: b"P%d" % bm.offset
    pager.put_many("Q", [_message(i) for i in range(3)])
    pager.keep({"offset": 7, "batch": 1, "queues": {"Q": {"ranked": False}}, "layout": LAYOUT})
    pager.close()
    again = RocksPager(tmp_path / "pager", 32 << 20, reuse=True)
    assert again.kept is not None and again.kept["layout"] == 3
    assert [again.payload(m.bookmark) for m in again.take_first("Q", 3)] == [b"P0", b"P1", b"P2"]
