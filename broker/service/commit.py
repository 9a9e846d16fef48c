"""The commit order: the one place that decides what becomes durable when.

Each batch the service processed is made durable in four numbered steps. Batches are
pipelined: step 3 of a batch rides in the same flush as step 2 of the next one, so a busy
service waits for Kafka once per batch, not twice. A crash (kill -9) may fall into any gap;
recovery (`broker.service.recovery`) makes every gap safe:

  1. COPIES     produce forwarded records and dead-letter copies; flush; all must be acked.
                Crash after: the batch is not committed, its inputs are read again and the
                copies are produced again (a duplicate copy, never a lost one).
  2. JOURNAL    produce the batch's transitions and its input positions to PREFIX.journal,
                split into parts, together with step 3 of the batch before; flush. The batch
                is committed once its last part is in Kafka.
                Crash after: recovery replays the journal tail into RocksDB and resumes inputs
                from the journaled positions. Deliveries of this batch were never sent: its
                leases are sent again at start (the client drops a copy it already has) and
                browsers are shown its messages again; at-most-once messages are lost, never
                duplicated, as that mode promises.
  3. DELIVERIES produce deliveries and replies to PREFIX.deliver.<client>: with step 2 of the
                next batch, or alone once no input is waiting; flush.
                Crash after: as after 2, but subscribers got their messages. The journal of
                the next batch may be in too: it is replayed the same way.
  4. STATE      write the state the batch left, encoded when it was processed, with its input
                positions and journal offset, to RocksDB in one WriteBatch. RocksDB therefore
                never holds a batch whose deliveries may not have gone out: the journal tail
                recovery replays (at most the last two batches) is exactly what may be unsent.
                Until then, the payloads the batch stores are read from memory.

With `[service] exactly_once = true` the producer is transactional: steps 1 to 3 of a commit
(the copies, the journal, and the deliveries riding along) are one Kafka transaction, committed
before step 4. A crash inside it aborts them all: under Apache Kafka, readers (recovery, the
client, dead-letter consumers: librdkafka reads `read_committed` by default) never see the
copies or deliveries of a batch whose journal is not in, and a second service started with
the same transactional id fences the first. Without it, the gaps above are made safe by
recovery instead (a copy may be duplicated, a lease sent twice; never lost). The embedded
broker accepts transactions but does not isolate them, so there only the steps are tested.

Setting the environment variable KQ_CRASH_AFTER_STEP=N makes the process SIGKILL itself right
after step N of the first batch that has something to journal; with KQ_CRASH_ON_KIND=KIND
(e.g. `leased`), of the first batch that journals a transition of that kind; with
`exactly_once` and KQ_CRASH_BEFORE_COMMIT=1, step 2's crash comes inside the Kafka
transaction, after the journal was flushed and before the commit. Crash tests use them.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker import wire
from broker.engine.engine import Engine
from broker.engine.transitions import Kind, Transition
from broker.errors import DeliveryFailedError, FencedError, StateError
from broker.service.fence import Fence
from broker.service.journal import encode_columns
from broker.state.layout import Checkpoint, Payload, StateChanges, message_key
from broker.state.store import Store
from broker.values import Bookmark

log = logging.getLogger("kq.commit")

STEPS = ("copies", "journal", "deliveries", "state")
# A transactional producer refused because a newer one with its id started: a new owner of
# the shard (librdkafka's local code, then the brokers' two)
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
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
class _Held:
    """A journaled batch whose deliveries and state wait for the next flush (steps 3, 4)."""

    cp: Checkpoint
    deliveries: list[OutRecord]
    changes: StateChanges


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
                 next_batch: int, transactional: bool = False, partition: int = 0,
                 fence: Fence | None = None) -> None:
        self._producer = producer
        self.transactional = transactional  # the producer has a transactional.id
        self._store = store
        self._engine = engine
        self._journal_topic = journal_topic
        self._partition = partition  # the shard's journal partition
        self._fence = fence
        self.next_batch = next_batch
        self._held: _Held | None = None
        # The journal only grows; an offset at or below the last one means Kafka lost it.
        self.last_offset = -1
        self.writer: str | None = None  # our start-up marker's nonce, named in every part
        self.writer_offset: int | None = None  # and its journal offset, named too
        crash = os.environ.get("KQ_CRASH_AFTER_STEP")
        self._crash_after = int(crash) if crash else None
        self._crash_kind = os.environ.get("KQ_CRASH_ON_KIND")
        # with exactly_once, step 2's crash comes before the transaction's commit instead
        self._crash_before_commit = os.environ.get("KQ_CRASH_BEFORE_COMMIT") == "1"
        # Tests of `kq journal audit` only: lose the state write of the first message that
        # gets a transition of this kind, so the service differs from its journal.
        self._drop_kind = os.environ.get("KQ_TEST_DROP_STATE_WRITE")

    @property
    def holding(self) -> bool:
        """Whether a batch's deliveries and state wait for the next flush."""
        return self._held is not None

    def held_payload(self, bm: Bookmark) -> Payload | None:
        """A payload the held batch stores, not in RocksDB yet."""
        return self._held.changes.payloads.get(bm) if self._held is not None else None

    def commit(self, cp: Checkpoint, outbox: Outbox) -> None:
        """Steps 1 and 2 of this batch, 3 and 4 of the one held; then hold this one."""
        if not (cp.transitions or cp.positions or outbox):
            return
        if self._fence is not None:
            self._fence.before_commit(self.last_offset)  # a frozen owner finds out here
        held, self._held = self._held, None
        with self._atomically():
            self._produce_all(outbox.copies, fatal=True, what="forward/dead-letter copies")
            self._crash_point(1, cp)
            journal = self._journal_records(cp) if cp.transitions or cp.positions else []
            offsets = self._produce_all(journal, fatal=True, what="journal",
                                        also=held.deliveries if held else ())
            if self.transactional and self._crash_before_commit:
                self._crash_point(2, cp, "journal, inside the open Kafka transaction")
        if journal:
            if self._fence is not None:  # before anything of this batch goes out
                self._fence.after_journal(self.last_offset, offsets[0])
            self._journaled(cp, offsets)
        self._crash_point(2, cp)
        if held is not None:
            self._crash_point(3, held.cp)
            self._write_state(held)
        self._held = _Held(cp, outbox.deliveries,
                           cp.changes(self._engine, skip=self._dropped_write(cp)))

    def flush_held(self) -> None:
        """Steps 3 and 4 of the held batch, now: no input is waiting to carry them."""
        held, self._held = self._held, None
        if held is None:
            return
        if self._fence is not None:
            self._fence.before_commit(self.last_offset)
        with self._atomically():
            self._produce_all(held.deliveries, fatal=False, what="deliveries")
        self._crash_point(3, held.cp)
        self._write_state(held)

    def send_now(self, records: list[OutRecord]) -> None:
        """Replies that need no journal (state snapshots): produced and flushed at once."""
        with self._atomically():
            self._produce_all(records, fatal=False, what="replies")

    @contextmanager
    def _atomically(self) -> Iterator[None]:
        """With exactly_once: what is produced inside is one Kafka transaction."""
        if not self.transactional:
            yield
            return
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            self._raise_if_fenced(exc.args[0])
            raise
        try:
            yield
        except BaseException:
            with suppress(KafkaException):
                self._producer.abort_transaction(FLUSH_TIMEOUT_S)
            raise
        try:
            self._producer.commit_transaction(FLUSH_TIMEOUT_S)
        except KafkaException as exc:
            self._raise_if_fenced(exc.args[0])
            raise DeliveryFailedError(f"committing the Kafka transaction failed: {exc}") from None

    def _raise_if_fenced(self, err: KafkaError | None) -> None:
        """The broker refused us because a newer producer of this shard started: the shard
        has a new owner, whose takeover the broker itself fences (nothing of ours lands
        after its start)."""
        if err is not None and err.code() in FENCED:
            raise FencedError(f"shard {self._partition}: Kafka fenced this instance's "
                              f"producer ({err.str()}): another instance took the shard "
                              "over; this one writes nothing more for it")

    def _write_state(self, held: _Held) -> None:
        held.changes.write_to(self._store)
        self._crash_point(4, held.cp)

    def _dropped_write(self, cp: Checkpoint) -> frozenset[bytes]:
        hit = next((t for t in cp.transitions if t.kind == self._drop_kind and t.bookmark), None)
        if hit is None or hit.bookmark is None:
            return frozenset()
        self._drop_kind = None
        log.warning("KQ_TEST_DROP_STATE_WRITE: not storing what %s did to %s", hit.kind.value,
                    hit.bookmark)
        return frozenset({message_key(hit.queue, hit.bookmark)})

    def _journal_records(self, cp: Checkpoint) -> list[OutRecord]:
        cp.batch, cp.writer = self.next_batch, self.writer
        self.next_batch += 1
        rows = latest_cursors(cp.transitions)
        chunks = [rows[i:i + TRANSITIONS_PER_PART]
                  for i in range(0, len(rows), TRANSITIONS_PER_PART)] or [[]]
        inputs = [{"reader": r, "topic": t, "partition": p, "offset": o}
                  for (r, t, p), o in sorted(cp.positions.items())]
        now = int(time.time() * 1000)
        return [
            OutRecord(self._journal_topic, wire.encode("journal", {
                "batch": cp.batch, "part": i, "parts": len(chunks), "written_ms": now,
                "marker": None, "writer": self.writer, "writer_offset": self.writer_offset,
                # positions ride on the last part: they count only once the batch is whole
                "inputs": inputs if i == len(chunks) - 1 else [],
                "transitions": [], "columns": encode_columns(chunk),
            }), partition=self._partition)
            for i, chunk in enumerate(chunks)
        ]

    def _journaled(self, cp: Checkpoint, offsets: list[int]) -> None:
        self._check_grows(offsets[0])
        self.last_offset = cp.journal_offset = offsets[-1]

    def _check_grows(self, offset: int) -> None:
        if offset <= self.last_offset:
            raise StateError(
                f"the journal {self._journal_topic} went back from offset {self.last_offset} to "
                f"{offset}: Kafka lost data (was the broker restarted empty?). Stopping before "
                "the local state diverges; restart against the original cluster, or delete "
                "data_dir to start afresh.")

    def write_marker(self, nonce: str) -> int:
        """A journal record recovery reads up to, proving it has seen the whole tail."""
        if self._fence is not None:
            self._fence.before_marker()
        record = OutRecord(self._journal_topic, wire.encode("journal", {
            "batch": -1, "part": 0, "parts": 0, "written_ms": int(time.time() * 1000),
            "marker": nonce, "writer": None, "inputs": [], "transitions": []}),
            partition=self._partition)
        with self._atomically():
            offset = self._produce_all([record], fatal=True, what="journal marker")[0]
        self.last_offset = max(self.last_offset, offset)
        self.writer = nonce  # from now on our parts count, until someone else's marker
        self.writer_offset = offset
        if self._fence is not None:
            self._fence.writer = nonce
        return offset

    def _produce_all(self, records: list[OutRecord], fatal: bool, what: str,
                     also: Sequence[OutRecord] = ()) -> list[int]:
        """Produce `records` (their offsets are returned; a failure is fatal if `fatal`) and
        `also` (deliveries riding along: a failure is logged), and flush them all."""
        if not records and not also:
            return []
        offsets: list[int] = [-1] * len(records)
        errors: list[str] = []
        lost: list[str] = []

        fenced: list[KafkaError] = []

        def lost_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                lost.append(f"{msg.topic()}: {err.str()}")
                fenced.extend([err] if err.code() in FENCED else [])

        def report(i: int) -> Any:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    errors.append(f"{msg.topic()}: {err.str()}")
                    fenced.extend([err] if err.code() in FENCED else [])
                else:
                    offsets[i] = msg.offset() or 0
            return on_delivery

        for r in also:
            self._produce(r, lost_delivery, lost)
        for i, r in enumerate(records):
            self._produce(r, report(i), errors)
        left = self._flush()
        if left:
            (errors if records else lost).append(
                f"{left} records not acknowledged within {FLUSH_TIMEOUT_S}s")
        if fenced:
            self._raise_if_fenced(fenced[0])
        if lost:
            log.error("producing deliveries failed: %s", "; ".join(lost[:5]))
        if errors:
            message = f"producing {what} failed: {'; '.join(errors[:5])}"
            if fatal:
                raise DeliveryFailedError(message)
            log.error(message)
        return offsets

    def _flush(self) -> int:
        """Flush; a fatal producer error (a fenced transactional producer) surfaces here as a
        KafkaException, or as the cause of a SystemError when confluent-kafka then calls a
        delivery callback with it still pending."""
        try:
            return int(self._producer.flush(FLUSH_TIMEOUT_S))
        except (KafkaException, SystemError) as exc:
            fatal = exc if isinstance(exc, KafkaException) else exc.__cause__
            if isinstance(fatal, KafkaException):
                self._raise_if_fenced(fatal.args[0])
                raise DeliveryFailedError(f"producing failed: {fatal}") from None
            raise

    def _produce(self, r: OutRecord, on_delivery: Any, errors: list[str]) -> None:
        while True:
            try:
                self._producer.produce(r.topic, r.value, r.key,
                                       headers=r.headers,  # type: ignore[arg-type]
                                       partition=r.partition, on_delivery=on_delivery)
                return
            except BufferError:  # local queue full: let it drain
                self._producer.poll(0.05)
            except KafkaException as exc:  # refused locally (too large, bad topic name)
                self._raise_if_fenced(exc.args[0])
                errors.append(f"{r.topic}: {exc.args[0].str()}")
                return

    def _crash_point(self, step: int, cp: Checkpoint, where: str = "") -> None:
        if self._crash_after != step or not cp.transitions:
            return
        if step == 2 and self.transactional and self._crash_before_commit and not where:
            return  # it came inside the transaction, or not at all
        if self._crash_kind is None or any(t.kind.value == self._crash_kind
                                           for t in cp.transitions):
            log.warning("KQ_CRASH_AFTER_STEP=%d: killing myself after step %s", step,
                        where or STEPS[step - 1])
            os.kill(os.getpid(), signal.SIGKILL)
