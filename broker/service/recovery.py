"""Start-up: load RocksDB, then replay the journal tail it has not seen (commit step 4 gap)."""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from broker import wire
from broker.engine.engine import Engine
from broker.engine.transitions import Kind, Transition
from broker.errors import StateError
from broker.kafka.clients import headers_of, take
from broker.kafka.fetch import fetch_records
from broker.service.journal import BatchAssembler, Part, transitions_of
from broker.state.layout import (
    Checkpoint,
    Payload,
    ReaderKey,
    load_engine,
    load_meta,
    load_payload,
    load_positions,
)
from broker.state.store import Store
from broker.values import Bookmark

log = logging.getLogger("kq.recovery")

UNSENT_BATCHES = 2  # the journal batches whose deliveries a crash may have cut
JOURNAL_STALL_TIMEOUT_S = 30.0  # give up when the journal yields nothing for this long


@dataclass
class Recovered:
    positions: dict[ReaderKey, int]
    next_batch: int
    replayed_batches: int
    # Leases of the last two journaled batches: their deliveries may not have gone out
    # before the crash (commit steps 2-3 are pipelined), so the service sends them again
    # (the client drops a copy it already has).
    unsent: list[Transition] = field(default_factory=list)


def transition_from(r: dict) -> Transition:  # type: ignore[type-arg]
    return Transition(
        kind=Kind(r["kind"]), queue=r["queue"], at_ms=r["at_ms"],
        bookmark=Bookmark.parse(r["bookmark"]) if r["bookmark"] else None,
        sub_id=r["sub_id"], client=r["client"], delivery_count=r["delivery_count"],
        cancel_count=r["cancel_count"], deadline_ms=r["deadline_ms"], reason=r["reason"],
        seq=r["seq"], timestamp_ms=r["timestamp_ms"], max_backlog=r["max_backlog"],
        filter=r["filter"], priority=r["priority"], barrier=r["barrier"], browse=r["browse"],
        principal=r["principal"],
    )


def recover(store: Store, engine: Engine, consumer: Consumer, journal_topic: str,
            write_marker, now: int) -> Recovered:  # noqa: ANN001
    """Bring `engine` and `store` to the last committed batch of the journal."""
    started = time.monotonic()
    load_engine(store, engine, now)
    positions = load_positions(store)
    meta = load_meta(store)
    marker_offset = write_marker(uuid.uuid4().hex)
    if marker_offset <= meta["offset"]:
        raise StateError(
            f"the journal topic {journal_topic} ends at offset {marker_offset} but the local "
            f"state has seen offset {meta['offset']}: Kafka lost data (was the embedded broker "
            "restarted?). Delete the service's data_dir to start afresh from Kafka."
        )
    # the batch after the last one the state holds (meta["batch"] is that one)
    cp = Checkpoint(positions={}, batch=meta["batch"] + 1 if meta["offset"] >= 0 else 0)
    replayed = 0
    batches = BatchAssembler()
    consumer.assign([TopicPartition(journal_topic, 0, meta["offset"] + 1)])
    if meta["offset"] < 0 and marker_offset > 0:
        log.warning("no local state: rebuilding every queue from the journal (%d records)",
                    marker_offset)
    deadline = time.monotonic() + JOURNAL_STALL_TIMEOUT_S
    done = meta["offset"] + 1 >= marker_offset
    # the latest whole batches, each replayed once two more are in: their deliveries may not
    # have been sent (broker.service.commit)
    last: deque[list[Part]] = deque()
    while not done:
        if time.monotonic() > deadline:
            raise StateError(f"could not read {journal_topic} up to offset {marker_offset}")
        records = take(consumer, 500, 0.2)
        if records:
            deadline = time.monotonic() + JOURNAL_STALL_TIMEOUT_S
        for rec in records:
            if rec.error():
                continue
            off = rec.offset()
            if off >= marker_offset:
                done = True
                break
            part = wire.decode("journal", rec.value())
            whole = batches.add(part)
            if whole is not None:
                if len(last) == UNSENT_BATCHES:
                    _replay(engine, cp, last.popleft())
                last.append(whole)
                cp.batch, cp.journal_offset = part["batch"] + 1, off
                replayed += 1
    unsent: list[Transition] = []
    for batch in last:
        # The crash may have come before these batches' deliveries were sent: browsers are
        # shown their messages again, and their leases are delivered again (a duplicate copy
        # rather than a lost one, or a lease nobody knows of until it lapses).
        _replay(engine, cp, batch, skip=Kind.BROWSED)
        unsent += [transition_from(row) for p in batch for row in transitions_of(p)
                   if row["kind"] == Kind.LEASED.value]
    consumer.unassign()
    if replayed:
        _refetch_payloads(store, engine, consumer, cp)
        cp.write(store, engine)
        positions.update(cp.positions)
        took = time.monotonic() - started
        log.info("replayed %d journal batches (%d transitions) into the local state in "
                 "%.1f s: %.0f transitions/s", replayed, len(cp.transitions), took,
                 len(cp.transitions) / max(took, 1e-9))
    return Recovered(positions, cp.batch, replayed, unsent)


def _replay(engine: Engine, cp: Checkpoint, batch: list[Part], skip: Kind | None = None) -> None:
    for part in batch:
        for row in transitions_of(part):
            t = transition_from(row)
            if t.kind is not skip:
                engine.apply(t)
                cp.transitions.append(t)
    for pos in batch[-1]["inputs"]:
        cp.positions[(pos["reader"], pos["topic"], pos["partition"])] = pos["offset"]


def _refetch_payloads(store: Store, engine: Engine, consumer: Consumer, cp: Checkpoint) -> None:
    """Messages enqueued in the replayed tail have no stored payload yet: read them again."""
    missing = {
        t.bookmark for t in cp.transitions
        if t.kind is Kind.ENQUEUED and t.bookmark is not None
        and engine.queues[t.queue].find(t.bookmark) is not None
        and load_payload(store, t.bookmark) is None
    }
    if not missing:
        return
    found = fetch_records(consumer, missing)
    for bm, rec in found.items():
        cp.payloads[bm] = Payload(rec.key(), rec.value(), headers_of(rec),
                                  rec.timestamp()[1])
    if len(found) < len(missing):
        raise StateError(f"{len(missing) - len(found)} journaled messages could not be read "
                         "back from their topics")
