"""What one shard's service runs on: its Kafka clients and its local stores, opened together
at start-up and closed together at the end, so `broker.service.service` is only the loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from broker.config import Config
from broker.kafka import clients
from broker.service.topics import Topics, prepare_topics, shard_dir
from broker.state.pager import RocksPager
from broker.state.rocks import RocksStore
from broker.state.store import Store


@dataclass
class ShardIO:
    admin: AdminClient
    store: Store
    pager: RocksPager | None  # None with a store given from outside (tests): all in memory
    producer: Producer
    consumer: Consumer  # the queues' sources and the journal
    commands: Consumer  # the command topics, and payloads fetched back during a restore
    bootstrap: str
    extra: dict[str, Any]
    _fence_reader: Consumer | None = None

    @classmethod
    def open(cls, config: Config, bootstrap: str, shard: int, command_topics: list[str],
             store: Store | None = None) -> ShardIO:
        """Check Kafka answers, create kq's topics, open the shard's state and clients."""
        svc = config.service
        extra = dict(svc.kafka)
        clients.check_reachable(bootstrap, extra)
        admin = clients.admin(bootstrap, extra)
        topics = Topics(svc.topic_prefix)
        prepare_topics(admin, topics, command_topics, svc)
        pager = None
        if store is None:  # RocksDB: each shard gets its part of the memory budget,
            budget = int(svc.memory_budget) // svc.shards  # half for state, half for pager
            store = RocksStore(shard_dir(svc.data_dir, shard), budget - budget // 2)
            pager = RocksPager(shard_dir(svc.data_dir, shard) / "pager", budget // 2, reuse=True)
        # with exactly_once, transactional: its start fences an earlier owner of this shard
        producer = clients.service_producer(bootstrap, extra, (
            f"{topics.prefix}.shard.{shard}" if svc.exactly_once else None))
        # Sources prefetch little: what is fetched ahead is memory, and delays commands.
        wait = clients.fetch_wait_ms(bootstrap, extra)
        consumer = clients.consumer(bootstrap, extra, **{
            "queued.min.messages": 2000, "queued.max.messages.kbytes": 16384,
            "fetch.wait.max.ms": wait})
        commands = clients.consumer(bootstrap, extra, **{"fetch.wait.max.ms": wait})
        return cls(admin, store, pager, producer, consumer, commands, bootstrap, extra)

    @property
    def may_skip_records(self) -> bool:
        """Whether the broker may hand out a record before an earlier one of its partition
        is readable (`broker.kafka.gaps`): any but Apache Kafka."""
        return not clients.is_apache_kafka(self.bootstrap, self.extra)

    def journal_reader(self) -> Consumer:
        """A consumer for the fence's look at the journal, made on first use."""
        if self._fence_reader is None:
            self._fence_reader = clients.consumer(self.bootstrap, self.extra)
        return self._fence_reader

    def close(self) -> None:
        self.consumer.close()
        self.commands.close()
        if self._fence_reader is not None:
            self._fence_reader.close()
        self.producer.flush(5)
        self.store.close()
        if self.pager is not None:
            self.pager.close()
