"""The commit order: the one place that decides what becomes durable when.

Each batch the service processed is made durable in four numbered steps. A crash (kill -9)
may fall into any gap between them; recovery (`broker.service.recovery`) makes every gap safe:

  1. COPIES     produce forwarded records and dead-letter copies; flush; all must be acked.
                Crash after: the batch is not committed, its inputs are read again and the
                copies are produced again (a duplicate copy, never a lost one).
  2. JOURNAL    produce the batch's transitions and its input positions to PREFIX.journal,
                split into parts; flush. The batch is committed once its last part is in Kafka.
                Crash after: recovery replays the journal tail into RocksDB and resumes inputs
                from the journaled positions. Deliveries of this batch were never sent: its
                leases are sent again at start (the client drops a copy it already has) and
                browsers are shown its messages again; at-most-once messages are lost, never
                duplicated, as that mode promises.
  3. DELIVERIES produce deliveries and replies to PREFIX.deliver.<client>; flush.
                Crash after: as after 2, but subscribers got their messages.
  4. STATE      write the state the batch touched, the input positions and the journal offset
                to RocksDB in one WriteBatch.

Setting the environment variable KQ_CRASH_AFTER_STEP=N makes the process SIGKILL itself right
after step N of the first batch that has something to journal; with KQ_CRASH_ON_KIND=KIND
(e.g. `leased`), of the first batch that journals a transition of that kind. Crash tests use it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker import wire
from broker.engine.engine import Engine
from broker.engine.transitions import Kind, Transition
from broker.errors import DeliveryFailedError, StateError
from broker.service.journal import encode_columns
from broker.state.layout import Checkpoint, message_key
from broker.state.store import Store

log = logging.getLogger("kq.commit")

STEPS = ("copies", "journal", "deliveries", "state")
TRANSITIONS_PER_PART = 2000
FLUSH_TIMEOUT_S = 15.0

Headers = list[tuple[str, bytes | None]]


@dataclass
class OutRecord:
    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Headers | None = None
    partition: int = -1  # -1: the producer's partitioner decides


@dataclass
class Outbox:
    copies: list[OutRecord] = field(default_factory=list)  # step 1
    deliveries: list[OutRecord] = field(default_factory=list)  # step 3

    def __bool__(self) -> bool:
        return bool(self.copies or self.deliveries)


def latest_cursors(transitions: list[Transition]) -> list[Transition]:
    """The transitions without browser cursors a later one in the same batch moves past
    (a browser fed one message per event would otherwise journal one cursor per message)."""
    seen: set[str | None] = set()
    kept = []
    for t in reversed(transitions):
        if t.kind is Kind.BROWSED:
            if t.sub_id in seen:
                continue
            seen.add(t.sub_id)
        kept.append(t)
    kept.reverse()
    return kept


class Committer:
    def __init__(self, producer: Producer, store: Store, engine: Engine, journal_topic: str,
                 next_batch: int) -> None:
        self._producer = producer
        self._store = store
        self._engine = engine
        self._journal_topic = journal_topic
        self.next_batch = next_batch
        # The journal only grows; an offset at or below the last one means Kafka lost it.
        self.last_offset = -1
        crash = os.environ.get("KQ_CRASH_AFTER_STEP")
        self._crash_after = int(crash) if crash else None
        self._crash_kind = os.environ.get("KQ_CRASH_ON_KIND")
        # Tests of `kq journal audit` only: lose the state write of the first message that
        # gets a transition of this kind, so the service differs from its journal.
        self._drop_kind = os.environ.get("KQ_TEST_DROP_STATE_WRITE")

    def commit(self, cp: Checkpoint, outbox: Outbox) -> None:
        if not (cp.transitions or cp.positions or outbox):
            return
        self._produce_all(outbox.copies, fatal=True, what="forward/dead-letter copies")
        self._crash_point(1, cp)
        if cp.transitions or cp.positions:
            cp.batch = self.next_batch
            cp.journal_offset = self._journal(cp)
            self.next_batch += 1
        self._crash_point(2, cp)
        self._produce_all(outbox.deliveries, fatal=False, what="deliveries")
        self._crash_point(3, cp)
        cp.write(self._store, self._engine, skip=self._dropped_write(cp))
        self._crash_point(4, cp)

    def _dropped_write(self, cp: Checkpoint) -> frozenset[bytes]:
        hit = next((t for t in cp.transitions if t.kind == self._drop_kind and t.bookmark), None)
        if hit is None or hit.bookmark is None:
            return frozenset()
        self._drop_kind = None
        log.warning("KQ_TEST_DROP_STATE_WRITE: not storing what %s did to %s", hit.kind.value,
                    hit.bookmark)
        return frozenset({message_key(hit.queue, hit.bookmark)})

    def _journal(self, cp: Checkpoint) -> int:
        rows = latest_cursors(cp.transitions)
        chunks = [rows[i:i + TRANSITIONS_PER_PART]
                  for i in range(0, len(rows), TRANSITIONS_PER_PART)] or [[]]
        inputs = [{"reader": r, "topic": t, "partition": p, "offset": o}
                  for (r, t, p), o in sorted(cp.positions.items())]
        now = int(time.time() * 1000)
        records = [
            OutRecord(self._journal_topic, wire.encode("journal", {
                "batch": cp.batch, "part": i, "parts": len(chunks), "written_ms": now,
                "marker": None,
                # positions ride on the last part: they count only once the batch is whole
                "inputs": inputs if i == len(chunks) - 1 else [],
                "transitions": [], "columns": encode_columns(chunk),
            }), partition=0)
            for i, chunk in enumerate(chunks)
        ]
        offsets = self._produce_all(records, fatal=True, what="journal")
        self._check_grows(offsets[0])
        self.last_offset = offsets[-1]
        return offsets[-1]

    def _check_grows(self, offset: int) -> None:
        if offset <= self.last_offset:
            raise StateError(
                f"the journal {self._journal_topic} went back from offset {self.last_offset} to "
                f"{offset}: Kafka lost data (was the broker restarted empty?). Stopping before "
                "the local state diverges; restart against the original cluster, or delete "
                "data_dir to start afresh.")

    def write_marker(self, nonce: str) -> int:
        """A journal record recovery reads up to, proving it has seen the whole tail."""
        record = OutRecord(self._journal_topic, wire.encode("journal", {
            "batch": -1, "part": 0, "parts": 0, "written_ms": int(time.time() * 1000),
            "marker": nonce, "inputs": [], "transitions": []}), partition=0)
        offset = self._produce_all([record], fatal=True, what="journal marker")[0]
        self.last_offset = max(self.last_offset, offset)
        return offset

    def _produce_all(self, records: list[OutRecord], fatal: bool, what: str) -> list[int]:
        if not records:
            return []
        offsets: list[int] = [-1] * len(records)
        errors: list[str] = []

        def report(i: int) -> Any:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    errors.append(f"{msg.topic()}: {err.str()}")
                else:
                    offsets[i] = msg.offset() or 0
            return on_delivery

        for i, r in enumerate(records):
            while True:
                try:
                    self._producer.produce(r.topic, r.value, r.key,
                                           headers=r.headers,  # type: ignore[arg-type]
                                           partition=r.partition, on_delivery=report(i))
                    break
                except BufferError:  # local queue full: let it drain
                    self._producer.poll(0.05)
                except KafkaException as exc:  # refused locally (too large, bad topic name)
                    errors.append(f"{r.topic}: {exc.args[0].str()}")
                    break
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        if left:
            errors.append(f"{left} records not acknowledged within {FLUSH_TIMEOUT_S}s")
        if errors:
            message = f"producing {what} failed: {'; '.join(errors[:5])}"
            if fatal:
                raise DeliveryFailedError(message)
            log.error(message)
        return offsets

    def _crash_point(self, step: int, cp: Checkpoint) -> None:
        if self._crash_after != step or not cp.transitions:
            return
        if self._crash_kind is None or any(t.kind.value == self._crash_kind
                                           for t in cp.transitions):
            log.warning("KQ_CRASH_AFTER_STEP=%d: killing myself after step %s", step,
                        STEPS[step - 1])
            os.kill(os.getpid(), signal.SIGKILL)
