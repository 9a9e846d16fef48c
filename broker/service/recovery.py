"""Start-up: load RocksDB, then replay the journal tail it has not seen (commit step 4 gap)."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from broker import wire
from broker.engine.engine import Engine
from broker.engine.transitions import Kind, Transition
from broker.errors import StateError
from broker.kafka.clients import take
from broker.kafka.fetch import fetch_records
from broker.kafka.records import headers_of
from broker.service.commit import UNSENT_BATCHES
from broker.service.journal import BatchAssembler, Part, transitions_in
from broker.service.memory import collector_paused
from broker.service.snapshots import restore
from broker.service.swap import use_kept_pager
from broker.state.layout import (
    Checkpoint,
    Payload,
    ReaderKey,
    load_engine,
    load_meta,
    load_payload,
    load_positions,
)
from broker.state.snapshot import Seen
from broker.state.store import Store

log = logging.getLogger("kq.recovery")

JOURNAL_STALL_TIMEOUT_S = 30.0  # give up when the journal yields nothing for this long
# transitions replayed between two writes of the state they changed (tests make it small)
REPLAY_CHUNK = int(os.environ.get("KQ_TEST_REPLAY_CHUNK") or 50_000)


@dataclass
class Recovered:
    positions: dict[ReaderKey, int]
    next_batch: int
    replayed_batches: int
    # Leases of the last UNSENT_BATCHES journaled batches: their deliveries may not have gone out
    # before the crash (commit steps 2-3 are pipelined), so the service sends them again
    # (the client drops a copy it already has).
    unsent: list[Transition] = field(default_factory=list)
    # the shard's snapshots as the restore saw them (None: it used the local state)
    seen: Seen | None = None


@collector_paused
def recover(store: Store, engine: Engine, consumer: Consumer, journal_topic: str,
            write_marker, now: int, fetcher: Consumer,  # noqa: ANN001
            partition: int = 0, stopping: Callable[[], bool] = lambda: False,
            snapshot_topic: str | None = None,
            snapshot_reader: Consumer | None = None) -> Recovered | None:
    """Bring `engine` and `store` to the last committed batch of the journal.

    `consumer` reads the journal; `fetcher`, another consumer, reads back the records of
    messages the store has no payload for (while the journal is still being read).
    None when `stopping()` turned true first (the group took the shard away during a long
    restore): what was replayed so far is in the store as after a crash mid-restore, and
    the instance is not held up until the end of a restore it no longer needs.
    Without usable local state, the newest snapshot on `snapshot_topic` is loaded first
    (broker.service.snapshots.restore, with `snapshot_reader`, a consumer made for it), and
    only the journal after it is replayed.
    """
    started = time.monotonic()
    meta = load_meta(store)
    seen = None
    if snapshot_topic is not None:
        meta, seen = restore(store, snapshot_reader or consumer, snapshot_topic, partition,
                             journal_topic, meta)
    load_engine(store, engine, now, use_kept_pager(engine, meta))
    positions = load_positions(store)
    marker_offset = write_marker(uuid.uuid4().hex)
    if marker_offset <= meta["offset"]:
        raise StateError(
            f"the journal topic {journal_topic} ends at offset {marker_offset} but the local "
            f"state has seen offset {meta['offset']}: Kafka lost data (was the embedded broker "
            "restarted?). Delete the service's data_dir to start afresh from Kafka."
        )
    tail = JournalTail(store, engine, fetcher, meta)
    consumer.assign([TopicPartition(journal_topic, partition, meta["offset"] + 1)])
    if meta["offset"] < 0 and marker_offset > 0:
        log.warning("no local state: rebuilding every queue from the journal (%d records)",
                    marker_offset)
    deadline = time.monotonic() + JOURNAL_STALL_TIMEOUT_S
    done = meta["offset"] + 1 >= marker_offset
    while not done:
        if stopping():
            log.info("restore of shard %d stopped at journal offset %d of %d", partition,
                     tail.offset, marker_offset)
            consumer.unassign()
            return None
        if time.monotonic() > deadline:
            raise StateError(f"could not read {journal_topic} up to offset {marker_offset}")
        records = take(consumer, 500, 0.2)
        if records:
            deadline = time.monotonic() + JOURNAL_STALL_TIMEOUT_S
        for rec in records:
            if rec.error():
                continue
            if rec.offset() >= marker_offset:
                done = True
                break
            tail.add(wire.decode("journal", rec.value()), rec.offset())
    replay, last, next_batch = tail.replay, tail.last, tail.next_batch
    unsent: list[Transition] = []
    for whole, off in last:
        # The crash may have come before these batches' deliveries were sent: browsers are
        # shown their messages again, and their leases are delivered again (a duplicate copy
        # rather than a lost one, or a lease nobody knows of until it lapses).
        replay.batch(whole, off, skip=Kind.BROWSED)
        unsent += [t for p in whole for t in transitions_in(p) if t.kind is Kind.LEASED]
    consumer.unassign()
    if replay.batches:
        replay.write()
        positions.update(replay.positions)
        took = time.monotonic() - started
        log.info("replayed %d journal batches (%d transitions) into the local state in "
                 "%.1f s: %.0f transitions/s", replay.batches, replay.transitions, took,
                 replay.transitions / max(took, 1e-9))
    return Recovered(positions, next_batch, replay.batches, unsent, seen)


class JournalTail:
    """Whole journal batches of one shard applied in order, the latest UNSENT_BATCHES held
    back: each is replayed once that many more are in, since their deliveries may not have been
    sent (broker.service.commit). Recovery feeds it up to its marker; a standby replica
    feeds it as the journal grows (broker.service.standby)."""

    def __init__(self, store: Store, engine: Engine, fetcher: Consumer,
                 meta: dict[str, Any]) -> None:
        self.replay = _Replay(store, engine, fetcher, empty=meta["offset"] < 0)
        self.batches = BatchAssembler()
        self.batches.reign = meta.get("writer")  # whose parts counted where the state is
        self.last: deque[tuple[list[Part], int]] = deque()
        self.next_batch = meta["batch"] + 1 if meta["offset"] >= 0 else 0
        self.offset = meta["offset"]  # the last journal record fed

    def add(self, part: Part, offset: int) -> None:
        self.offset = offset
        whole = self.batches.add(part)
        if whole is None:
            return
        if len(self.last) == UNSENT_BATCHES:
            self.replay.batch(*self.last.popleft())
            if len(self.replay.cp.transitions) >= REPLAY_CHUNK:
                self.replay.write()
        self.last.append((whole, offset))
        self.next_batch = part["batch"] + 1


class _Replay:
    """Journal batches applied to the engine, their state written every REPLAY_CHUNK
    transitions (with the payloads of the messages they queued) so that a long replay
    holds a bounded part of it in memory, and a crash during it resumes where it was."""

    def __init__(self, store: Store, engine: Engine, fetcher: Consumer, empty: bool) -> None:
        self.store, self.engine, self.fetcher = store, engine, fetcher
        self.empty = empty  # the store held nothing: it has no payload to look up
        self.cp = Checkpoint()
        self.positions: dict[ReaderKey, int] = {}
        self.batches = self.transitions = 0

    def batch(self, parts: list[Part], offset: int, skip: Kind | None = None) -> None:
        cp, apply = self.cp, self.engine.apply
        for part in parts:
            for t in transitions_in(part):
                if t.kind is not skip:
                    cp.add(t, apply(t))
        for pos in parts[-1]["inputs"]:
            cp.positions[(pos["reader"], pos["topic"], pos["partition"])] = pos["offset"]
        cp.batch, cp.journal_offset = parts[-1]["batch"], offset
        cp.writer = parts[-1].get("writer")
        self.batches += 1

    def write(self) -> None:
        """Write what the batches replayed since the last write changed."""
        cp = self.cp
        self._refetch_payloads()
        cp.write(self.store, self.engine)
        self.positions.update(cp.positions)
        self.transitions += len(cp.transitions)
        self.cp = Checkpoint()
        if os.environ.get("KQ_CRASH_IN_REPLAY"):  # crash tests: the replay stops half way
            log.warning("KQ_CRASH_IN_REPLAY: killing myself after a replay write")
            os.kill(os.getpid(), signal.SIGKILL)

    def _refetch_payloads(self) -> None:
        """Messages queued by the replayed batches have no stored payload yet: read them
        again from their topics."""
        # queued here into a store that held nothing: no payload to look for
        fresh = {t.bookmark for t in self.cp.transitions
                 if t.kind is Kind.ENQUEUED} if self.empty else set()
        missing = {bm for (_, bm), msg in self.cp.messages.items() if msg is not None
                   and (bm in fresh or load_payload(self.store, bm) is None)}
        if not missing:
            return
        found = fetch_records(self.fetcher, missing)
        for bm, rec in found.items():
            self.cp.payloads[bm] = Payload(rec.key(), rec.value(), headers_of(rec),
                                           rec.timestamp()[1])
        if len(found) < len(missing):
            raise StateError(f"{len(missing) - len(found)} journaled messages could not be "
                             "read back from their topics")
