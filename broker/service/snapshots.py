"""Snapshots of a shard's state on PREFIX.snapshots: written, found and loaded.

Writing freezes the store (a RocksDB checkpoint: a consistent point between two state writes,
taken in milliseconds) and streams it on a thread of its own, so the shard's loop goes on
serving. The frozen state is exactly what a crash at that moment would have left in RocksDB:
restoring it and replaying the journal after its `meta/journal` offset is the same recovery
as after a crash (`broker.service.recovery`), only without the local files.

The order that keeps a snapshot safe (broker.state.snapshot): chunks, flushed; then its
`complete` record, flushed; only then tombstones for the snapshots it replaces. A crash before
`complete` leaves the previous snapshot the newest complete one; a crash after it leaves
the replaced keys, deleted by the next snapshot.

Crash tests set KQ_CRASH_IN_SNAPSHOT to `chunks` (the process kills itself after writing half
of a snapshot's chunks), `complete` (after its `complete` record, before the tombstones) or
`load` (half way through loading one during a restore).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from broker import wire
from broker.errors import StateError
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from broker.service.metrics import Metrics
from broker.state import snapshot as fmt
from broker.state.layout import META_JOURNAL, load_meta
from broker.state.store import Store

log = logging.getLogger("kq.snapshots")

# snapshots are big and written in the background: fewer, larger, compressed requests
PRODUCER = {"compression.type": "lz4", "linger.ms": 20,
            "message.max.bytes": 16 * 1024 * 1024 + 4096}
# reading one back: whole chunks per fetch, many at a time
READER = {"max.partition.fetch.bytes": 32 * 1024 * 1024, "fetch.max.bytes": 64 * 1024 * 1024,
          "fetch.wait.max.ms": 50}
TURNS_BEFORE = 500  # the loop's last turns before a snapshot: what its turns are compared with
SURVEY_FIRST = 16  # records looked at from the partition's end first; four times more each try
FLUSH_TIMEOUT_S = 60.0
# At a clean stop the snapshot is waited for while it makes progress (a chunk built or
# acknowledged) and given up STALL_S after the last, or after STOP_LIMIT_S in all: a big
# state takes seconds to write, while a stop with Kafka away must stay prompt.
STALL_S = 2.5
STOP_LIMIT_S = 15.0  # within the instance's STOP_WITHIN_S


def _p99(ordered: list[float]) -> float:
    return ordered[int(len(ordered) * 0.99)] if ordered else 0.0


def _crash_if(point: str) -> None:
    if os.environ.get("KQ_CRASH_IN_SNAPSHOT") == point:
        log.warning("KQ_CRASH_IN_SNAPSHOT=%s: killing myself", point)
        os.kill(os.getpid(), signal.SIGKILL)


def survey(consumer: Consumer, topic: str, shard: int) -> fmt.Seen:
    """The complete snapshots of a shard (newest first) and the leftovers of others, read
    from the end of its partition back until a complete one is in view (the newest is
    normally among the last records: only a snapshot being written comes after it)."""
    (low, end), = real_ends(consumer, [(topic, shard)]).values()
    window = SURVEY_FIRST
    while True:
        start = max(low, end - window)
        seen = fmt.survey(shard, ((r.offset(), r.key(), r.value())
                                  for r in records(consumer, topic, shard, start, end)))
        if seen.complete or start == low:
            return seen
        window *= 4


def load(store: Store, consumer: Consumer, topic: str, found: fmt.Found) -> dict[str, Any]:
    """Replace everything in `store` with the snapshot `found`; return its journal meta.

    The store is cleared first (a restore cut short may have left another snapshot's
    entries), and the `meta/journal` entry is written last: until it is there, the store
    counts as empty, and a crash half way loads the snapshot again."""
    store.clear()
    meta_value: bytes | None = None
    seqs: set[int] = set()
    prefix = f"{found.shard}/{found.snapshot}/".encode()
    for rec in records(consumer, topic, found.shard, found.first_offset, found.offset):
        key = rec.key()
        if rec.value() is None or key is None or not key.startswith(prefix):
            continue
        chunk = wire.decode("snapshot", rec.value())
        puts = dict(fmt.entries_of(chunk))
        meta_value = puts.pop(META_JOURNAL, meta_value)
        store.write(puts, ())
        seqs.add(chunk["seq"])
        if len(seqs) == found.chunks // 2 + 1:
            _crash_if("load")
    if seqs != set(range(found.chunks)) or meta_value is None:
        store.clear()
        raise StateError(f"snapshot {found.snapshot} of shard {found.shard} on {topic} is "
                         f"missing chunks ({len(seqs)} of {found.chunks} found)")
    store.write({META_JOURNAL: meta_value}, ())
    return load_meta(store)


def restore(store: Store, consumer: Consumer, topic: str, shard: int, journal_topic: str,
            meta: dict[str, Any]) -> tuple[dict[str, Any], fmt.Seen | None]:
    """Load the newest usable snapshot into `store` when the local state cannot serve: it
    is empty (a new instance, a lost data_dir, a cold takeover) or older than the journal's
    first record (retention deleted what it would replay). Returns the journal meta to
    recover from, and what the survey saw (None when the local state was used)."""
    low, _ = clients.watermarks(consumer, journal_topic, shard)
    stale = 0 <= meta["offset"] < low - 1
    if meta["offset"] >= 0 and not stale:
        return meta, None
    seen = survey(consumer, topic, shard)
    for found in seen.complete:
        if found.journal_offset < low - 1 or found.journal_offset <= meta["offset"]:
            break  # older ones even less
        began = time.monotonic()
        try:
            loaded = load(store, consumer, topic, found)
        except StateError as exc:
            log.warning("%s: trying an older one", exc)
            continue
        log.info("shard %d: loaded snapshot %s (%d entries, journal offset %d, taken %.0f s "
                 "ago) in %.1f s; replaying the journal after it", shard, found.snapshot,
                 found.entries, found.journal_offset,
                 max(0.0, time.time() - found.taken_ms / 1000), time.monotonic() - began)
        return loaded, seen
    if stale or low > 0:
        have = (f"the local state reflects offset {meta['offset']}" if stale
                else "there is no local state")
        newest = (f"the newest snapshot reflects offset {seen.complete[0].journal_offset}"
                  if seen.complete else f"{topic} holds no complete snapshot of it")
        raise StateError(
            f"shard {shard} cannot be restored: its journal {journal_topic} starts at offset "
            f"{low} (retention deleted the records before), {have}, and {newest}. Restore "
            "needs a snapshot at or after the journal's start: was journal_retention shorter "
            "than the time the service was down?")
    return meta, seen


class SnapshotWriter:
    """A shard's snapshots: one every `interval_s` on a thread of its own (`maybe_start`,
    called by the shard's loop), and one on a clean stop (`write_now`)."""

    def __init__(self, store: Store, bootstrap: str, extra: dict[str, Any], topic: str,
                 shard: int, where: Path, interval_s: float, metrics: Metrics,
                 seen: fmt.Seen | None = None) -> None:
        self._store, self._bootstrap, self._extra = store, bootstrap, extra
        self.topic, self.shard, self._where = topic, shard, where
        self.interval_s = interval_s
        self._metrics = metrics
        self._seen = seen  # None: survey the partition before the first snapshot
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        # the first is due at once when no snapshot is known to exist (a new shard, or one
        # from before snapshots): until there is one, a restore replays the whole journal
        due_now = seen is None or not seen.complete
        self._last_start = float("-inf") if due_now else time.monotonic()
        self.failure: BaseException | None = None
        # the shard loop's turns while a snapshot is written, and before: what writing one
        # costs the loop
        self._turns: list[float] = []
        self._before: deque[float] = deque(maxlen=TURNS_BEFORE)
        self._progress_at = 0.0  # when the snapshot being written last moved on

    def turn(self, seconds: float) -> None:
        """The shard's loop took `seconds` for a turn."""
        if self._thread is not None and self._thread.is_alive():
            self._turns.append(seconds)
        else:
            self._before.append(seconds)

    @property
    def written_offset(self) -> int:
        """The journal offset of the newest snapshot known, -1 when none is."""
        return self._seen.complete[0].journal_offset if self._seen and self._seen.complete else -1

    def close(self) -> None:
        """Close its Kafka clients, unless a snapshot given up on still uses them (its
        thread ends with the process)."""
        if self.busy:
            return
        if self._producer is not None:
            self._producer.flush(2)
        if self._consumer is not None:
            self._consumer.close()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def maybe_start(self, now: float | None = None) -> bool:
        """Start a snapshot when one is due and none is being written."""
        now = time.monotonic() if now is None else now
        if self.busy or now - self._last_start < self.interval_s:
            return False
        self._last_start = now
        self._thread = threading.Thread(target=self._write_logged, daemon=True,
                                        name=f"kq-snapshot-{self.shard}")
        self._thread.start()
        return True

    def write_now(self) -> None:
        """At a clean stop: a snapshot of the state as it is now, after any being written,
        waited for while it progresses (see STALL_S). Past that (Kafka slow or away) the
        stop goes on without it: the previous snapshot and the journal restore everything."""
        started = time.monotonic()
        if self._thread is not None:
            self._join_while_moving(started)
        if not self.busy:
            self._thread = threading.Thread(target=self._write_logged, daemon=True,
                                            name=f"kq-snapshot-{self.shard}")
            self._progress_at = time.monotonic()
            self._thread.start()
            self._join_while_moving(started)
        if self.busy:
            log.warning("snapshot of shard %d at the stop not written (nothing for %.1f s, "
                        "or %.0f s in all; is Kafka reachable?): stopping without it",
                        self.shard, STALL_S, STOP_LIMIT_S)

    def _join_while_moving(self, started: float) -> None:
        assert self._thread is not None
        while self._thread.is_alive():
            now = time.monotonic()
            stalled_at = max(self._progress_at, started) + STALL_S
            give_up_at = min(stalled_at, started + STOP_LIMIT_S)
            if now >= give_up_at:
                return
            self._thread.join(min(give_up_at - now, 0.1))

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write_logged(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # noqa: BLE001 - the next one tries again; say it
            self.failure = exc
            log.warning("snapshot of shard %d failed (the next is due in %.0f s): %s",
                        self.shard, self.interval_s, exc)

    def _write(self) -> None:
        started = self._progress_at = time.monotonic()
        self._turns, before = [], sorted(self._before)
        self._before.clear()
        frozen = self._store.frozen(self._where)
        try:
            froze_s = time.monotonic() - started
            self._progress_at = time.monotonic()
            meta = load_meta(frozen)
            if meta["offset"] < 0:
                return  # nothing journaled yet
            if self._producer is None:
                self._producer = clients.producer(self._bootstrap, self._extra, **PRODUCER)
                self._consumer = clients.consumer(self._bootstrap, self._extra)
            if self._seen is None:
                assert self._consumer is not None
                self._seen = survey(self._consumer, self.topic, self.shard)
            if meta["offset"] <= self.written_offset:
                return  # nothing since the newest snapshot
            self._publish(frozen, meta, froze_s, started, _p99(before))
        finally:
            frozen.close()

    def _publish(self, frozen: Store, meta: dict[str, Any], froze_s: float,
                 started: float, p99_before: float) -> None:
        assert self._seen is not None
        snapshot = fmt.new_id(meta["offset"])
        offsets: dict[int, int] = {}
        errors: list[str] = []

        def delivered(seq: int) -> Callable[[KafkaError | None, Any], None]:
            def on_delivery(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    errors.append(err.str())
                else:
                    offsets[seq] = msg.offset()
                    self._progress_at = time.monotonic()
            return on_delivery

        count = entries = size = 0
        for key, value, n in fmt.chunks(frozen.scan(b""), self.shard, snapshot):
            self._produce(key, value, delivered(count))
            count, entries, size = count + 1, entries + n, size + len(value)
            self._progress_at = time.monotonic()
            if count == 1 and os.environ.get("KQ_CRASH_IN_SNAPSHOT") == "chunks":
                self._flush(errors, "chunks")  # crash tests: a chunk in, the rest to come
                _crash_if("chunks")
        self._flush(errors, "chunks")
        replaces = dict(self._seen.leftovers)
        for f in self._seen.complete:
            replaces[f.snapshot] = f.chunks
        done = fmt.complete(self.shard, snapshot, count, entries, offsets[0], meta,
                            int(time.time() * 1000), replaces)
        self._produce(fmt.complete_key(self.shard, snapshot), done, delivered(-1))
        self._flush(errors, "its complete record")
        _crash_if("complete")
        for old, n in replaces.items():
            for key in fmt.keys_of(self.shard, old, n):
                self._produce(key, None, delivered(-2))
        self._flush(errors, "tombstones of the snapshots it replaces")
        self._seen = fmt.Seen([fmt.Found(snapshot, self.shard, count, entries, offsets[0],
                                         offsets[-1], meta["offset"], 0)])
        took = time.monotonic() - started
        label = str(self.shard)
        self._metrics.snapshots.labels(label).inc()
        self._metrics.snapshot_seconds.labels(label).observe(took)
        self._metrics.snapshot_bytes.labels(label).set(size)
        self._metrics.snapshot_journal_offset.labels(label).set(meta["offset"])
        turns = sorted(self._turns)
        log.info("snapshot of shard %d at journal offset %d: %d entries, %.1f MB in %d "
                 "chunk(s), in %.2f s (checkpoint taken in %.0f ms; the loop's turns meanwhile: "
                 "p99 %.0f ms, max %.0f ms of %d; before: p99 %.0f ms)", self.shard,
                 meta["offset"], entries, size / 1e6, count, took, froze_s * 1000,
                 _p99(turns) * 1000, (turns[-1] if turns else 0.0) * 1000, len(turns),
                 p99_before * 1000)

    def _produce(self, key: bytes, value: bytes | None, on_delivery: Any) -> None:
        assert self._producer is not None
        while True:
            try:
                self._producer.produce(self.topic, value, key, partition=self.shard,
                                       on_delivery=on_delivery)
                self._producer.poll(0)  # acknowledgements as they come: they are progress
                return
            except BufferError:  # the producer's queue is full: let some go out
                self._producer.poll(0.1)

    def _flush(self, errors: list[str], what: str) -> None:
        assert self._producer is not None
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        if left or errors:
            raise StateError(f"writing snapshot {what} to {self.topic}: "
                             f"{errors[0] if errors else f'{left} record(s) not delivered'}")
