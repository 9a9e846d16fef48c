"""One shard served: poll a batch, turn records into events, run the engine, commit.

No queue rule lives here. The commit order is `broker.service.commit`'s; start-up recovery is
`broker.service.recovery`'s; which shards a process serves is `broker.service.instance`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import KafkaError
from confluent_kafka import Message as KafkaMessage

from broker.config import Config
from broker.engine import events as ev
from broker.engine.effects import (
    CommandRejected,
    DeadLetter,
    Defer,
    Deliver,
    Flow,
    Journal,
    Reply,
    Resume,
)
from broker.engine.engine import Engine
from broker.engine.transitions import Reason, Transition
from broker.errors import CommandError, StateError
from broker.kafka import clients
from broker.kafka.records import bookmark_of, headers_of
from broker.service.commands import Invalid, Query, decode_command, shard_elsewhere
from broker.service.commit import Committer, Outbox, OutRecord
from broker.service.copies import dead_letter_copy, flow_event, reply_record
from broker.service.docs import Docs
from broker.service.envelopes import Envelopes
from broker.service.fence import Fence
from broker.service.inputs import SERVICE, Inputs
from broker.service.memory import IdleRelease, calm_collector, thaw_collector
from broker.service.metrics import Metrics
from broker.service.notices import say_lost, say_strays, say_too_large
from broker.service.queries import SNAPSHOT, answer, snapshot
from broker.service.recovery import recover
from broker.service.routing import Router
from broker.service.shard_io import ShardIO
from broker.service.snapshots import READER as SNAPSHOT_READER
from broker.service.snapshots import SnapshotWriter
from broker.service.swap import keep_pager
from broker.service.topics import Topics, shard_dir
from broker.state.layout import Checkpoint, load_meta, load_packed_payload, load_payload
from broker.state.pager import RocksPager
from broker.state.payload import Payload
from broker.state.store import Store
from broker.values import Bookmark, now_ms

log = logging.getLogger("kq.service")

BATCH_SIZE: Final = 1000
SLOW_BATCH_S: Final = 0.5
DEAF_S: Final = 0.5  # a loop turn later: beyond it, not the clients' silence (Engine.deaf_for)
DEFAULT_MAX_MESSAGE_BYTES: Final = 1_000_000  # librdkafka's and Kafka's default record size limit
ENVELOPE_ALLOWANCE: Final = 4096  # what the delivery envelope adds around a record


@dataclass
class _Batch:
    """What one poll produced, on its way to the commit."""

    cp: Checkpoint = field(default_factory=Checkpoint)
    outbox: Outbox = field(default_factory=Outbox)
    resumes: set[str] = field(default_factory=set)  # queues to read on after the commit
    snapshots: list[Query] = field(default_factory=list)  # answered once the batch is in
    envelopes: Envelopes | None = None  # deliveries, packed per subscription at the commit


class Service:
    def __init__(self, config: Config, bootstrap_servers: str, store: Store | None = None,
                 shard: int = 0, metrics: Metrics | None = None,
                 still_owner: Callable[[], bool] = lambda: True) -> None:
        self.config = config
        svc = config.service
        self.shard, self.bootstrap = shard, bootstrap_servers
        self.topics = Topics(svc.topic_prefix)
        queues = config.queues_of_shard(shard)
        self.router = Router(queues, svc.topic_prefix)
        limit = int(svc.kafka.get("message.max.bytes", DEFAULT_MAX_MESSAGE_BYTES))
        self.engine = Engine(queues, svc.heartbeat_timeout.ms,
                             max_message_bytes=limit - ENVELOPE_ALLOWANCE,
                             auth=dict(config.auth) or None,
                             doc_loader=lambda queue, bm: self._docs.load(queue, bm))
        self._batch_payloads: dict[Bookmark, Payload] = {}
        self._pager: RocksPager | None = None
        self._deliver_topic = functools.lru_cache(4096)(self.topics.deliver)  # named once
        self._store = store
        # command topic -> who sent what is on it: nobody known without [auth] (None); with
        # it, each principal's own topic, and nobody ("") on the shared one.
        self._command_topics: dict[str, str | None] = {
            self.topics.commands: "" if config.auth else None,
            **{self.topics.commands_of(p): p for p in config.auth}}
        self.metrics = metrics or Metrics()
        self._docs = Docs(queues, self.metrics,
                          lambda bm: self._in_hand(bm) or load_payload(self._store, bm))
        self._still_owner = still_owner  # the group still gives this process the shard
        self._stop = threading.Event()
        # Crash tests only: a held batch rides with the next one (as in a busy service).
        self._idle_flush = not os.environ.get("KQ_TEST_NO_IDLE_FLUSH")
        self._release = IdleRelease(lambda: [self.engine.pager, *filter(None, [self._store])])
        self.ready = threading.Event()
        self._snapshots: SnapshotWriter | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Connect, recover, then serve until `stop()`."""
        svc = self.config.service
        io = ShardIO.open(self.config, self.bootstrap, self.shard, list(self._command_topics),
                          self._store)
        self._store = store = io.store
        if io.pager is not None:
            self.use_pager(io.pager)
        try:
            self._fence = fence = Fence(io.journal_reader, self.topics.journal, self.shard,
                          session_s=svc.session_timeout.ms / 1000, still_owner=self._still_owner)
            self._committer = Committer(io.producer, store, self.engine,
                                        self.topics.journal, next_batch=0,
                                        transactional=svc.exactly_once, partition=self.shard,
                                        fence=fence)
            reader = clients.consumer(self.bootstrap, dict(svc.kafka), **SNAPSHOT_READER)
            try:
                rec = recover(store, self.engine, io.consumer, self.topics.journal,
                              self._committer.write_marker, now_ms(), fetcher=io.commands,
                              partition=self.shard, stopping=self._stop.is_set,
                              snapshot_topic=self.topics.snapshots, snapshot_reader=reader)
            finally:
                reader.close()
            if rec is None:  # stopped during the restore
                return
            self._snapshots = SnapshotWriter(
                store, self.bootstrap, dict(svc.kafka), self.topics.snapshots, self.shard,
                shard_dir(svc.data_dir, self.shard) / "snapshot", svc.snapshot_interval.seconds,
                self.metrics, seen=rec.seen)
            self._committer.next_batch = rec.next_batch
            self.inputs = Inputs(io.consumer, io.commands, io.admin, self.router,
                                 self.engine, list(self._command_topics), rec.positions,
                                 required=(self.topics.journal,), command_partition=self.shard,
                                 reread_gaps=io.may_skip_records)
            self.inputs.on_lost = functools.partial(say_lost, self.metrics)
            say_strays(store, self.config, self.shard)
            self._configure_queues()
            self._send_again(rec.unsent)
            self.inputs.start()
            self.ready.set()
            calm_collector()
            log.info("ready: shard %d, %d queue(s), %d batch(es) replayed from the journal",
                     self.shard, len(self.engine.queues), rec.replayed_batches)
            while not self._stop.is_set():
                began = time.monotonic()
                self._step()
                self._snapshots.turn(time.monotonic() - began)
            self._committer.flush_held(stopping=True)
            self._snapshots.write_now()  # a clean stop: the next owner starts from here
            keep_pager(self.engine, load_meta(store))  # and from its pager, if it is this one
        finally:
            if self._snapshots is not None:
                self._snapshots.close()  # before the store it reads is closed
            io.close()
            self._committer = None  # type: ignore[assignment]  # a stopping broker waits
            thaw_collector()  # for open connections: drop its clients, free the shard

    def use_pager(self, pager: RocksPager) -> None:
        """Page deep queues out to `pager`, with the payloads in hand in their rows."""
        self.engine.use_pager(pager)
        pager.payload_source = lambda bm: None if (p := self._in_hand(bm)) is None else p.encode()
        self._pager = pager

    def lag(self) -> int:
        return self.inputs.lag() if hasattr(self, "inputs") else 0

    # -- one iteration ---------------------------------------------------------------------
    def _configure_queues(self) -> None:
        """New queues start at their recovery point; changed ones start again from it."""
        batch, now = _Batch(), now_ms()
        for name, q in self.engine.queues.items():
            event = ev.Configured(name, q.config.recovery_point, q.config.recovery_start_ms(now))
            self._run(event, now, batch)
        for name in self.engine.resets([Journal(t) for t in batch.cp.transitions]):
            log.warning("queue %s: recovery point changed to %s; it starts again from there",
                        name, self.engine.queues[name].recovery_point)
            batch.cp.positions.update(self.inputs.rewind(name))
        self._commit(batch, records_in=0)

    def _send_again(self, leases: list[Transition]) -> None:
        """Deliver again the leases of the last batch before a crash that still stand."""
        batch, now = _Batch(), now_ms()
        for t in leases:
            q = self.engine.queues.get(t.queue)
            msg = q.messages.get(t.bookmark) if q and t.bookmark else None
            sub = self.engine.subs.get(t.sub_id or "")
            if (q is None or msg is None or sub is None or msg.holder != t.sub_id
                    or msg.delivery_count != t.delivery_count):
                continue  # settled, returned or leased anew since
            if msg.deadline_ms is not None and msg.deadline_ms <= now:
                continue  # lapsed while the service was down: the first tick returns it
            self._deliver(Deliver(sub.client, sub.sub_id, q.name, msg.bookmark,
                                  msg.delivery_count, msg.deadline_ms, seq=msg.seq), batch)
        if batch.envelopes:
            log.info("sent %d lease(s) of the last batch again", len(batch.envelopes or ()))
            self._commit(batch, records_in=0)

    def _commit(self, batch: _Batch, records_in: int) -> None:
        if batch.envelopes:  # after the replies: a subscription is known before its messages
            batch.outbox.deliveries.extend(batch.envelopes.records())
        self._committer.commit(batch.cp, batch.outbox)
        self.inputs.positions.update(batch.cp.positions)
        for queue in batch.resumes:  # only now: the rest of the batch must not overtake
            self.inputs.resume(queue)
        self.metrics.observe(self.engine, batch.cp.transitions, records_in=records_in)

    def _step(self) -> None:
        self._heed_gap()
        if self._idle_flush:  # (tests without it move batches on at commits only)
            self._committer.advance()
        self.inputs.refresh()
        # With a batch held, take only what is there: if nothing is, it goes out now. With
        # an ack by filter under way, the same: its next part is waiting.
        records = self.inputs.poll(BATCH_SIZE, wait=not (
            self.engine.sweeping() or (self._committer.holding and self._idle_flush)))
        self._heed_gap()  # an idle service is frozen inside the poll's wait, most likely
        started = time.monotonic()
        now = now_ms()
        batch = _Batch()
        self._batch_payloads = batch.cp.payloads
        for rec in records:
            err = rec.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", err.str())
                continue
            bm = bookmark_of(rec)
            readers = [r for r in self.inputs.readers(bm.topic)
                       if self.inputs.is_new(r, bm.topic, bm.partition, bm.offset)]
            for reader in readers:
                batch.cp.positions[(reader, bm.topic, bm.partition)] = bm.offset + 1
            if bm.topic in self._command_topics:
                if readers:
                    self._command(rec, self._command_topics[bm.topic], now, batch)
            else:
                self.inputs.arrived(bm.topic, bm.partition, bm.offset)
                self._source_record(rec, bm, readers, now, batch)
        if self.inputs.caught_up(batch.cp.positions):
            self._run(ev.Tick(), now, batch)
        if self.engine.sweeping():
            self._run(ev.Proceed(), now, batch)
        handled = time.monotonic()
        self._commit(batch, records_in=len(records))
        if not records and self._idle_flush:
            self._committer.send_held()
        if records:
            self._release.busy()
        elif self.inputs.idle:
            self._release.idle()
        if batch.snapshots:
            self._answer_snapshots(batch.snapshots)
        assert self._snapshots is not None
        self._snapshots.maybe_start()
        if (took := time.monotonic() - started) > SLOW_BATCH_S:
            log.info("slow batch: %d records, %d transitions, %d deliveries; %.0f ms "
                     "(engine %.0f ms)", len(records), len(batch.cp.transitions),
                     len(batch.envelopes or ()), took * 1000, (handled - started) * 1000)

    def _heed_gap(self) -> None:  # frozen or slow since the last look: heartbeats unread
        if (gap := self._fence.alive()) > DEAF_S:
            self.engine.deaf_for(int((gap - DEAF_S) * 1000))

    def _answer_snapshots(self, queries: list[Query]) -> None:
        """State snapshots between batches: exactly the last journaled batch's state (the
        answer carries its number), which an audit can rebuild from the journal."""
        replies, last = _Batch(), self._committer.next_batch - 1
        for q in queries:
            for body in snapshot(self.engine, last, self.shard):
                self._reply(replies, q.client, q.request_id, body=body)
        self._committer.send_now(replies.outbox.deliveries)  # replies only: no journal

    def _source_record(self, rec: KafkaMessage, bm: Bookmark, readers: list[str], now: int,
                       batch: _Batch) -> None:
        queues = [r for r in readers if r != SERVICE]
        target = self.router.forward_target(bm.topic) if SERVICE in readers else None
        headers = headers_of(rec)
        if target is not None:
            forwarded = [*headers, ("kq-forwarded-from", str(bm).encode())]
            batch.outbox.copies.append(OutRecord(target, rec.value(), rec.key(), forwarded))
        if not queues:
            return
        ts = rec.timestamp()[1]
        payload = Payload(rec.key(), rec.value(), headers, ts)
        batch.cp.payloads[bm] = payload
        headers_seen = dict(payload.headers)
        for name in queues:
            q = self.engine.queues[name]
            # decoded now only for the queue's own expressions; filters decode on demand
            doc = self._docs.of(name, payload, now) if q.needs_doc else None
            # headers even when the payload does not parse: kq-expiration, kq-priority
            self._run(ev.MessageArrived(name, bm, ts, payload.size, doc, headers_seen),
                      now, batch)

    def _command(self, rec: KafkaMessage, principal: str | None, now: int, batch: _Batch) -> None:
        elsewhere = shard_elsewhere(self.config, self.engine.queues, rec.value())
        if elsewhere is not None:  # passed on, with the rest of the batch (commit step 1)
            batch.outbox.copies.append(OutRecord(rec.topic() or "", rec.value(), rec.key(),
                                                 headers_of(rec), partition=elsewhere))
            return
        for item in decode_command(rec.value(), principal):
            if isinstance(item, Invalid):
                log.warning("rejected command from %s: %s", item.client or "?", item.message)
                self.metrics.bad_commands.inc()
                if item.client:
                    self._reply(batch, item.client, item.request_id, error=item.message)
            elif isinstance(item, Query) and item.args.get("what") == SNAPSHOT:
                batch.snapshots.append(item)
            elif isinstance(item, Query):
                try:
                    body = answer(self.engine, item.args, now, self.inputs.of_queue,
                                  where={"shard": self.shard,
                                         "owner": self.config.service.instance})
                except CommandError as exc:
                    self._reply(batch, item.client, item.request_id, error=str(exc))
                except Exception as exc:  # noqa: BLE001 - changes nothing: not worth a stop
                    log.exception("query %s from %s failed", item.args.get("what"), item.client)
                    self._reply(batch, item.client, item.request_id, error=f"failed: {exc!r}")
                else:
                    self._reply(batch, item.client, item.request_id, body=body)
            else:
                self._run(item, now, batch)

    def _run(self, event: ev.Event, now: int, batch: _Batch) -> None:
        for effect in self.engine.handle(event, now):
            if isinstance(effect, Journal):  # most (compiled: read directly, where a class
                batch.cp.add(t := effect.transition, effect.message)  # pattern looks up names)
                if t.reason and t.reason == Reason.TOO_LARGE.value:  # (most have none)
                    say_too_large(self.engine, t.queue, t.bookmark)
                continue
            match effect:
                case Deliver():
                    self._deliver(effect, batch)
                case DeadLetter():
                    self._dead_letter(effect, batch)
                case Reply():
                    self._reply(batch, effect.client, effect.request_id, body=effect.body)
                case Defer(queue=queue, bookmark=bm):
                    # not consumed for this queue: it stays at this record, and stops
                    batch.cp.positions[(queue, bm.topic, bm.partition)] = bm.offset
                    self.inputs.block(queue, bm.topic, bm.partition)
                case Resume(queue=queue):
                    batch.resumes.add(queue)
                case Flow():  # after the journal, with the deliveries (SPEC 5)
                    batch.outbox.deliveries.append(flow_event(self.topics.flow, effect))
                case CommandRejected():
                    log.info("rejected command from %s: %s", effect.client, effect.message)
                    self._reply(batch, effect.client, effect.request_id, error=effect.message)

    # -- effects ---------------------------------------------------------------------------
    def _packed(self, bm: Bookmark, queue: str) -> bytes:
        """A message's payload as envelopes carry it: stored packed, so passed on as it is.
        From memory when it can be (its row in the pager, its batch, one on its way)."""
        packed = self._pager.payload(bm) if self._pager is not None else None
        if packed is None:
            p = self._in_hand(bm)
            packed = p.encode() if p is not None else load_packed_payload(self._store, bm)
        if packed is None:
            raise StateError(f"no stored record for {bm} in queue {queue}")
        return packed

    def _in_hand(self, bm: Bookmark) -> Payload | None:
        """A payload not stored yet: its batch's, or one on its way (the committer's)."""
        return self._batch_payloads.get(bm) or self._committer.held_payload(bm)

    def _deliver(self, d: Deliver, batch: _Batch) -> None:
        packed = self._packed(d.bookmark, d.queue)
        if batch.envelopes is None:
            batch.envelopes = Envelopes(self.engine.max_message_bytes + ENVELOPE_ALLOWANCE)
        batch.envelopes.add(self._deliver_topic(d.client), d.sub_id, d.queue,
                            self.engine.queues[d.queue].format, str(d.bookmark),
                            d.delivery_count, d.lease_deadline_ms, d.is_barrier, d.seq, packed)

    def _dead_letter(self, d: DeadLetter, batch: _Batch) -> None:
        p = Payload.decode(self._packed(d.bookmark, d.queue))
        batch.outbox.copies.append(dead_letter_copy(d, p))

    def _reply(self, batch: _Batch, client: str, request_id: str,
               body: dict[str, Any] | None = None, error: str | None = None) -> None:
        batch.outbox.deliveries.append(reply_record(
            self.engine, self.shard, self.topics.deliver(client), client, request_id, body, error))
