"""The names of kq's own topics, under the configured prefix, and their creation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions

from broker.errors import ConfigError, StateError
from broker.kafka import clients

KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


@dataclass
class Topics:
    prefix: str

    @property
    def commands(self) -> str:
        """Commands, one partition per shard: a queue's commands go to its shard's."""
        return f"{self.prefix}.commands"

    def commands_of(self, principal: str) -> str:
        """A principal's own command topic: Kafka ACLs can let only that principal write it,
        and the service takes every command on it as sent by that principal."""
        return f"{self.prefix}.commands.{principal}"

    @property
    def journal(self) -> str:
        """The journal, one partition per shard; its partition count fixes the shards."""
        return f"{self.prefix}.journal"

    def deliver(self, client: str) -> str:
        return f"{self.prefix}.deliver.{client}"

    @property
    def flow(self) -> str:
        """Pause and resume records of flow-controlled queues, keyed by queue name."""
        return f"{self.prefix}.flow"

    @property
    def instances(self) -> str:
        """What each `kq serve` instance serves, keyed by instance name (`kq instances`)."""
        return f"{self.prefix}.instances"


def shard_dir(data_dir: str | Path, shard: int) -> Path:
    """Where a shard's RocksDB state (and its pager) live."""
    return Path(data_dir) / f"shard-{shard}"


def prepare_topics(admin: AdminClient, topics: Topics, command_topics: list[str],
                   shards: int) -> None:
    """Create kq's own topics: the journal and each command topic with one partition per
    shard. The journal fixes the shard count: a config asking for another is refused."""
    existing = clients.topic_partitions(admin)
    journal = existing.get(topics.journal)
    if journal is not None and journal != shards and not any(
            clients.end_offsets(admin, topics.journal, journal)):
        raise StateError(
            f"the journal {topics.journal} has {journal} partition(s) and no record: Kafka "
            "made it on the fly, so the journal kq wrote is gone: Kafka lost data (was the "
            "broker restarted empty?). Delete that topic, and the service's data_dir to "
            "start afresh from Kafka")
    if journal is not None and journal != shards:
        raise ConfigError(
            f"[service] shards = {shards}, but the journal {topics.journal} has {journal} "
            f"partition(s): the shard count is fixed when the journal is created. Set "
            f"shards = {journal}, or start afresh with another topic_prefix")
    for topic in command_topics:
        have = existing.get(topic)
        if have is not None and have > shards:
            raise ConfigError(
                f"[service] shards = {shards}, but the command topic {topic} has {have} "
                "partitions: clients would send commands to partitions no shard reads. "
                f"Set shards = {have}, or start afresh with another topic_prefix")
    # The journal is the state: a new queue state is rebuilt from all of it.
    clients.ensure_topics(admin, [topics.journal], partitions=shards, config=KEEP_FOREVER)
    clients.ensure_topics(admin, command_topics, partitions=shards)
    clients.ensure_topics(admin, [topics.flow, topics.instances])
    # a client may have created a command topic first, with one partition
    grow = [NewPartitions(t, shards) for t in command_topics
            if existing.get(t) is not None and existing[t] < shards]
    for topic, future in (admin.create_partitions(grow).items() if grow else ()):
        try:
            future.result()
        except KafkaException as exc:
            raise ConfigError(
                f"[service] shards = {shards}, but the command topic {topic} has fewer "
                f"partitions and this Kafka cannot add some ({exc.args[0].str()}): delete "
                "the topic, or start afresh with another topic_prefix") from None
