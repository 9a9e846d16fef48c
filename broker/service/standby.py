"""A standby replica: a shard another instance owns, kept warm in the local RocksDB copy.

A copy that is empty (or older than the journal's first record) starts from the shard's
newest snapshot. It tails the shard's journal partition and applies each whole batch the
way recovery does (`JournalTail`: fenced parts dropped, the last three batches held back as
possibly unsent), writing the state about once a second. When the group then gives this
instance the shard, its `Service` restores from that copy and replays only the last seconds
of the journal.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import TopicPartition

from broker import wire
from broker.config import Config
from broker.engine.engine import Engine
from broker.kafka import clients
from broker.service.recovery import JournalTail
from broker.service.snapshots import READER, restore
from broker.service.swap import use_kept_pager
from broker.service.topics import Topics, shard_dir
from broker.state.layout import load_engine, load_meta
from broker.state.pager import RocksPager
from broker.state.rocks import RocksStore
from broker.values import now_ms

log = logging.getLogger("kq.standby")

WRITE_EVERY_S = 1.0


class Standby:
    def __init__(self, config: Config, bootstrap: str, shard: int) -> None:
        self.config, self.bootstrap, self.shard = config, bootstrap, shard
        self._stop = threading.Event()
        self.lag = 0  # journal records not applied yet
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run_safely, daemon=True,
                                        name=f"kq-standby-{shard}")

    def start(self) -> Standby:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, wait_s: float = 60.0) -> None:
        """Write what was applied and close the copy (the shard's service may open it),
        waiting at most `wait_s` for it."""
        self._stop.set()
        self._thread.join(wait_s)

    def _run_safely(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # a standby is an optimisation: log it, never crash
            log.warning("standby of shard %d stopped: %s", self.shard, exc)
            self.failure = exc

    def _run(self) -> None:
        svc = self.config.service
        extra = dict(svc.kafka)
        budget = int(svc.memory_budget) // svc.shards
        where = shard_dir(svc.data_dir, self.shard)
        store = RocksStore(where, budget - budget // 2)
        pager = RocksPager(where / "pager", budget // 2, reuse=True)
        engine = Engine(self.config.queues_of_shard(self.shard), svc.heartbeat_timeout.ms)
        engine.use_pager(pager)
        journal = clients.consumer(self.bootstrap, extra, **{
            "fetch.wait.max.ms": clients.fetch_wait_ms(self.bootstrap, extra)})
        reader = clients.consumer(self.bootstrap, extra, **READER)
        fetcher = clients.consumer(self.bootstrap, extra)
        try:
            topics = Topics(svc.topic_prefix)
            topic = topics.journal
            # an empty copy, or one older than the journal's start, begins at the snapshot
            meta, _ = restore(store, reader, topics.snapshots, self.shard, topic,
                              load_meta(store))
            load_engine(store, engine, now_ms(), use_kept_pager(engine, meta))
            tail = JournalTail(store, engine, fetcher, meta)
            journal.assign([TopicPartition(topic, self.shard, meta["offset"] + 1)])
            log.info("standby of shard %d from journal offset %d", self.shard,
                     meta["offset"] + 1)
            written = time.monotonic()
            while not self._stop.is_set():
                for rec in clients.take(journal, 500, 0.2):
                    if rec.error() is None:
                        tail.add(wire.decode("journal", rec.value()), rec.offset())
                _, high = journal.get_watermark_offsets(
                    TopicPartition(topic, self.shard), cached=True)
                self.lag = max(0, int(high or 0) - tail.offset - 1)
                if tail.replay.batches and time.monotonic() - written > WRITE_EVERY_S:
                    tail.replay.write()
                    tail.replay.batches = 0
                    written = time.monotonic()
            if tail.replay.batches:
                tail.replay.write()
        finally:
            reader.close()
            journal.close()
            fetcher.close()
            store.close()
            pager.close()
