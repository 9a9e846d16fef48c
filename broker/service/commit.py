"""The commit order: the one place that decides what becomes durable when.

Each batch the service processed is made durable in four numbered steps, each started once
the step before was acknowledged. Batches are pipelined: while Kafka acknowledges a batch's
journal the service goes on with the next batch, whose journal goes out behind it (Kafka
keeps one partition's records in order; they are counted in order too); the deliveries go
out as soon as the journal is in, and the state is written once they are acknowledged, one
write for the batches of a short window (broker.service.coalesce). Before it produces a
batch's journal, the committer waits until the journal of the batch before the last is in
and every batch before those two was delivered: so at most the last three journaled batches
(UNSENT_BATCHES) may have deliveries that did not go out. A crash
(kill -9) may fall into any gap; recovery (`broker.service.recovery`) makes every gap safe:

  1. COPIES     produce forwarded records and dead-letter copies; flush; all must be acked.
                Crash after: the batch is not committed, its inputs are read again and the
                copies are produced again (a duplicate copy, never a lost one).
  2. JOURNAL    produce the batch's transitions and its input positions to PREFIX.journal,
                split into parts. The batch is committed once its last part is in Kafka.
                Crash after: recovery replays the journal tail into RocksDB and resumes inputs
                from the journaled positions. Deliveries of this batch were never sent: its
                leases are sent again at start (the client drops a copy it already has) and
                browsers are shown its messages again; at-most-once messages are lost, never
                duplicated, as that mode promises.
  3. DELIVERIES produce deliveries and replies to PREFIX.deliver.<client>, once the journal is
                acknowledged.
                Crash after: as after 2, but subscribers got their messages. The journals
                of the next two batches may be in too: they are replayed the same way.
  4. STATE      write the state the window's batches left, encoded right after its last
                batch was processed, with its input positions and journal offset, to RocksDB
                in one WriteBatch, once that batch is delivered. RocksDB therefore never holds
                a batch whose deliveries may not have gone out; of the journal tail recovery
                replays (the batches of at most one window and three more), only the last
                three may be unsent. Until then, the payloads stored are read from memory.

With `[service] exactly_once = true` the producer is transactional: steps 1 and 2 of a batch
and step 3 of the batch before (its deliveries ride along) are one Kafka transaction,
committed before that batch's step 4. A crash inside it aborts them all: under Apache Kafka,
readers (recovery, the client, dead-letter consumers: librdkafka reads `read_committed` by
default) never see the copies or deliveries of a batch whose journal is not in, and a second
service started with the same transactional id fences the first. Without it, the gaps above
are made safe by recovery instead (a copy may be duplicated, a lease sent twice; never lost).
The embedded broker accepts transactions but does not isolate them, so there only the steps
are tested.

The crash tests stop the process at each step (broker.service.crash_points).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Final

from confluent_kafka import KafkaException, Producer

from broker import wire
from broker.engine.engine import Engine
from broker.errors import DeliveryFailedError, StateError
from broker.service.coalesce import StateWindow
from broker.service.crash_points import CrashPoints
from broker.service.fence import Fence
from broker.service.journal import journal_parts
from broker.service.sending import FLUSH_TIMEOUT_S, Acks, OutRecord, Sender
from broker.state.layout import (
    META_JOURNAL,
    Checkpoint,
    Payload,
    StateChanges,
    journal_meta,
)
from broker.state.store import Store
from broker.values import Bookmark, now_ms

__all__ = ["Committer", "OutRecord", "Outbox"]

log = logging.getLogger("kq.commit")

# Journals on their way at once, the one being produced included: a batch's journal does not
# wait for the batch before's (Kafka keeps them in order), only for the one before that.
JOURNALS_IN_FLIGHT: Final = 2
# The journaled batches whose deliveries a crash may have cut: those whose journal may be on
# its way, and the one before, whose deliveries may be.
UNSENT_BATCHES: Final = JOURNALS_IN_FLIGHT + 1


@dataclass
class _InFlight:
    """A journaled batch on its way: its journal's acknowledgements, then its deliveries',
    then its state write (steps 2 to 4)."""

    cp: Checkpoint
    deliveries: list[OutRecord]
    journal: Acks
    # the state write of the window this batch closes (broker.service.coalesce); None: the
    # batch is inside a window, its state is written with the window's last batch
    changes: StateChanges | None = None
    window: Checkpoint | None = None
    journaled: bool = False  # its journal was acknowledged and checked
    sent: Acks | None = None  # its deliveries, once produced

    @property
    def delivered(self) -> bool:
        return self.sent is not None and self.sent.done


@dataclass
class Outbox:
    copies: list[OutRecord] = field(default_factory=list)  # step 1
    deliveries: list[OutRecord] = field(default_factory=list)  # step 3

    def __bool__(self) -> bool:
        return bool(self.copies or self.deliveries)


class Committer:
    def __init__(self, producer: Producer, store: Store, engine: Engine, journal_topic: str,
                 next_batch: int, transactional: bool = False, partition: int = 0,
                 fence: Fence | None = None, window: StateWindow | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._producer = producer
        self._sender = Sender(producer, partition, transactional, clock)
        self.transactional = transactional  # the producer has a transactional.id
        self._store = store
        self._engine = engine
        self._journal_topic = journal_topic
        self._partition = partition  # the shard's journal partition
        self._fence = fence
        self.next_batch = next_batch
        self._flight: deque[_InFlight] = deque()  # oldest first; at most two at a commit
        self._window = StateWindow() if window is None else window  # state not encoded yet
        # The journal only grows; an offset at or below the last one means Kafka lost it.
        self.last_offset = -1
        self.writer: str | None = None  # our start-up marker's nonce, named in every part
        self.writer_offset: int | None = None  # and its journal offset, named too
        self._crash = CrashPoints(transactional)

    @property
    def holding(self) -> bool:
        """Whether a batch's deliveries are still to go out (its journal is on its way, or
        with exactly_once its transaction is not open yet)."""
        return any(b.sent is None for b in self._flight)

    def held_payload(self, bm: Bookmark) -> Payload | None:
        """A payload a batch on its way stores, not in RocksDB yet."""
        p = self._window.payload(bm)
        if p is not None:
            return p
        for i in range(len(self._flight) - 1, -1, -1):  # newest first
            changes = self._flight[i].changes
            if changes is not None and (p := changes.payloads.get(bm)) is not None:
                return p
        return None

    def commit(self, cp: Checkpoint, outbox: Outbox) -> None:
        """Steps 1 and 2 of this batch once the batch before the last is journaled (its
        deliveries then go out) and every earlier one wrote its state; the rest comes with
        `advance`."""
        if not (cp.transitions or cp.positions or outbox):
            return
        room = JOURNALS_IN_FLIGHT - 1  # for the batches before this one
        self._sender.wait(lambda: self._unjournaled() <= room, "journal", self._settle)
        self._sender.wait(lambda: len(self._flight) <= JOURNALS_IN_FLIGHT, "deliveries",
                          lambda: self._settle(keep=JOURNALS_IN_FLIGHT))
        if self._fence is not None:
            self._fence.before_commit(self.last_offset)  # a frozen owner finds out here
        with self._atomically():
            if self.transactional and self._flight and self._flight[-1].sent is None:
                # the batch before's deliveries ride along
                self._send_deliveries(self._flight[-1])
            self._produce_now(outbox.copies, "forward/dead-letter copies")
            self._crash.reached(1, cp)
            journal = self._journal_records(cp) if cp.transitions or cp.positions else []
            acks = self._sender.produce(journal, len(journal))
            if self.transactional:
                self._sender.flush()
                if self._crash.before_commit:
                    self._crash.reached(2, cp, "journal, inside the open Kafka transaction")
        b = _InFlight(cp, outbox.deliveries, acks)
        self._window.add(cp, self._crash.dropped_write(cp))
        if journal and self._window.due():  # closed at a batch the journal records
            b.window, b.changes = self._window.close(self._engine)
        self._flight.append(b)
        if self.transactional:  # all acknowledged: the transaction committed
            self._settle()

    def advance(self) -> None:
        """Serve the acknowledgements that came: a journaled batch's deliveries go out, a
        delivered batch's state is written. Never waits; raises for deliveries unanswered
        too long (an idle service has nothing else that waits for them)."""
        if self._flight:
            self._sender.poll(0)
            self._settle()
            if self._flight and (sent := self._flight[0].sent) is not None:
                self._sender.check_answered(sent, "deliveries")

    def send_held(self) -> None:
        """No input is waiting: the journals on their way, waited for, so that their
        deliveries go out now; not the deliveries' answers, which a later `advance` serves
        (writing the state), so that records arriving meanwhile need not wait for them too."""
        if self.transactional:  # a transaction's deliveries would wait for the next one
            self.flush_held()
            return
        if self._flight:
            self._sender.wait(self._journaled_all, "journal", self._settle)
        if self._window and not self._flight and self._window.due():
            self._write_window()

    def flush_held(self, stopping: bool = False) -> None:
        """Everything on its way, now, waiting for each step; the state too if its window
        is due, or the service stops."""
        if self._flight:
            self._drain_flight()
        if self._window and (stopping or self._window.due()):
            self._write_window()

    def _drain_flight(self) -> None:
        """Every batch in flight journaled and delivered, waiting for each step."""
        self._sender.flush()  # the journal in: (without exactly_once) its deliveries go out
        self._sender.wait(self._journaled_all, "journal", self._settle)
        if self.transactional and self._flight and self._flight[-1].sent is None:
            if self._fence is not None:
                self._fence.before_commit(self.last_offset)
            with self._atomically():
                self._send_deliveries(self._flight[-1])
        self._sender.flush()
        self._sender.wait(lambda: not self._flight, "deliveries", self._settle)

    def _write_window(self) -> None:
        """The open window's state, now: every batch of it is delivered, and the engine is
        where its last batch left it (called between batches)."""
        window, changes = self._window.close(self._engine)
        changes.write_to(self._store)
        self._crash.reached(4, window)

    def send_now(self, records: list[OutRecord]) -> None:
        """Replies that need no journal (state snapshots): produced and flushed at once."""
        with self._atomically():
            acks = self._sender.produce(records, len(records))
            self._flushed(acks, "replies")
        if acks.errors:
            log.error("producing replies failed: %s", "; ".join(acks.errors[:5]))

    # -- the steps -------------------------------------------------------------------------
    def _journaled_all(self) -> bool:
        return not self._flight or self._flight[-1].journaled

    def _unjournaled(self) -> int:
        return sum(not b.journaled for b in self._flight)

    def _settle(self, keep: int = 0) -> None:
        """Move every batch on as far as its acknowledgements allow, in order (a journal
        counts once those before it did); write the state of the oldest delivered ones, in
        order, leaving at least `keep` batches."""
        for b in self._flight:
            if not b.journaled:
                if not b.journal.done:
                    break
                self._journaled(b)
        while len(self._flight) > keep and self._flight[0].delivered:
            self._write_state(self._flight.popleft())

    def _journaled(self, b: _InFlight) -> None:
        """Step 2 done: the journal is in Kafka. Checked, then (without exactly_once) its
        deliveries go out."""
        self._sender.check(b.journal, "journal")
        b.journaled = True
        offsets = b.journal.offsets
        if offsets:
            if self._fence is not None:  # before anything of this batch goes out
                self._fence.after_journal(self.last_offset, offsets[0])
            self._check_grows(offsets[0])
            self.last_offset = b.cp.journal_offset = offsets[-1]
            if b.changes is not None:
                b.changes.puts[META_JOURNAL] = journal_meta(offsets[-1], b.cp.batch,
                                                            b.cp.writer)
        self._crash.reached(2, b.cp)
        if not self.transactional:
            self._send_deliveries(b)

    def _send_deliveries(self, b: _InFlight) -> None:
        b.sent = self._sender.produce(b.deliveries, len(b.deliveries))

    def _write_state(self, b: _InFlight) -> None:
        assert b.sent is not None
        if b.sent.fenced:
            self._sender.raise_if_fenced(b.sent.fenced[0])
        if b.sent.errors:  # a lease nobody got lapses and is delivered again
            log.error("producing deliveries failed: %s", "; ".join(b.sent.errors[:5]))
        self._crash.reached(3, b.cp)
        if b.changes is not None and b.window is not None:
            b.changes.write_to(self._store)
            self._crash.reached(4, b.window)

    def _produce_now(self, records: list[OutRecord], what: str) -> None:
        """Produce and flush; every record must be acknowledged."""
        if records:
            acks = self._sender.produce(records, len(records))
            self._flushed(acks, what)
            self._sender.check(acks, what)

    def _flushed(self, acks: Acks, what: str) -> None:
        try:
            left = self._sender.flush()
        except SystemError:  # a fatal producer error confluent-kafka lost the cause of:
            if acks.fenced:  # the records' own answers may still say who fenced us
                self._sender.raise_if_fenced(acks.fenced[0])
            raise
        if left and not acks.done:
            acks.errors.append(f"{left} records not acknowledged within {FLUSH_TIMEOUT_S}s")

    @contextmanager
    def _atomically(self) -> Iterator[None]:
        """With exactly_once: what is produced inside is one Kafka transaction."""
        if not self.transactional:
            yield
            return
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            self._sender.raise_if_fenced(exc.args[0])
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
            self._sender.raise_if_fenced(exc.args[0])
            raise DeliveryFailedError(f"committing the Kafka transaction failed: {exc}") from None

    def _journal_records(self, cp: Checkpoint) -> list[OutRecord]:
        cp.batch, cp.writer = self.next_batch, self.writer
        self.next_batch += 1
        return [OutRecord(self._journal_topic, value, partition=self._partition)
                for value in journal_parts(cp.transitions, cp.positions, cp.batch, self.writer,
                                           self.writer_offset)]

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
            "batch": -1, "part": 0, "parts": 0, "written_ms": now_ms(),
            "marker": nonce, "writer": None, "inputs": [], "transitions": []}),
            partition=self._partition)
        with self._atomically():
            acks = self._sender.produce([record], 1)
            self._flushed(acks, "journal marker")
            self._sender.check(acks, "journal marker")
        offset = acks.offsets[0]
        self.last_offset = max(self.last_offset, offset)
        self.writer = nonce  # from now on our parts count, until someone else's marker
        self.writer_offset = offset
        if self._fence is not None:
            self._fence.writer = nonce
        return offset
