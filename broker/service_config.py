"""The `[service]` table of the configuration."""

from __future__ import annotations

import socket
from typing import Final

from pydantic import ByteSize, Field, StrictBool, StrictInt, field_validator, model_validator

from broker.config_fields import DurationField, RetentionField, check_bootstrap
from broker.config_fields import Strict as _Strict
from broker.values import Duration

INSTANCE_NAME: Final = r"^[A-Za-z0-9._-]{1,200}$"  # [service] instance, kq serve --instance


class ServiceConfig(_Strict):
    """The `[service]` table."""

    bootstrap_servers: str | None = None
    """Kafka's address (host:port,...). Default: none, and `kq serve` starts the embedded
    broker (`--bootstrap-servers` or env KQ_BOOTSTRAP_SERVERS override it)."""
    data_dir: str = Field("./kq-data", min_length=1)
    """Where the RocksDB state of this instance's shards lives (`kq serve --data-dir` or env
    KQ_DATA_DIR override it)."""
    topic_prefix: str = Field("kq", pattern=r"^[A-Za-z0-9._-]+$")
    """The prefix of kq's own topics (PREFIX.commands, PREFIX.journal, PREFIX.deliver.*, ...)
    and of its consumer group."""
    metrics_port: StrictInt = Field(9464, ge=0, le=65535)
    """The Prometheus /metrics port. 0: none."""
    heartbeat_timeout: DurationField = Duration(10_000)
    """A client not heard from this long is dropped: its leases go back to the queues."""
    exactly_once: StrictBool = False
    """Wrap each commit (journal, deliveries, dead letters) in a Kafka transaction."""
    memory_budget: ByteSize = Field(ByteSize(64 * 1024 * 1024), ge=16 * 1024 * 1024)
    """What RocksDB's block caches and memtables may use together (e.g. "64MiB", "1GB");
    at least 16 MiB."""
    kafka: dict[str, str | int | bool] = Field(default_factory=dict)
    """The `[service.kafka]` table: librdkafka settings for every Kafka client of the
    service (security, tuning; `group.protocol` = classic or consumer). Settings kq decides
    itself are refused by name."""
    # Scale-out (SPEC 12): the queues are split into `shards`, each owned by one instance of
    # the consumer group PREFIX.service at a time; fixed once the journal exists.
    shards: StrictInt = Field(1, ge=1, le=256)
    """How many shards the queues are split into (1-256), each owned by one instance at a
    time. Fixed once the journal exists."""
    instance: str = Field(default_factory=socket.gethostname, pattern=INSTANCE_NAME)
    """This instance's name, unique among the instances of a topic prefix (`kq serve
    --instance` or env KQ_INSTANCE override it). Default: the host name."""
    session_timeout: DurationField = Duration(10_000)
    """How long the other instances wait for a silent instance before they take its shards
    (Kafka's group session timeout)."""
    snapshot_interval: DurationField = Duration(300_000)
    """How often each shard writes a snapshot of its state (every unfinished message with
    its payload, leases and counts) to the compacted topic PREFIX.snapshots; also on a clean
    stop. A restore without local state loads the newest and replays only the journal after
    it."""
    journal_retention: RetentionField = Duration(7 * 86_400_000)
    """How long PREFIX.journal keeps its records (its `retention.ms`); `"forever"` keeps
    them all. At least twice `snapshot_interval`: a restore needs the journal after the
    newest snapshot."""
    standby_replicas: StrictInt = Field(0, ge=0, le=1)
    """1: the next instance keeps each shard's state warm, so that a takeover replays only
    the journal's last second."""

    @model_validator(mode="after")
    def _journal_outlives_snapshots(self) -> ServiceConfig:
        if self.snapshot_interval.ms < 1000:
            raise ValueError(f"snapshot_interval = {self.snapshot_interval}: at least 1s")
        if self.session_timeout.ms <= 0:  # (librdkafka's own complaint names its setting)
            raise ValueError(f"session_timeout = {self.session_timeout}: must be more than 0")
        retention = self.journal_retention
        if retention is not None and retention.ms < 2 * self.snapshot_interval.ms:
            raise ValueError(
                f"journal_retention = {retention} is shorter than twice snapshot_interval "
                f"({self.snapshot_interval}): a restore reads the journal after the newest "
                f"snapshot, so keep it at least {Duration(2 * self.snapshot_interval.ms)}")
        return self

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap(cls, servers: str | None) -> str | None:
        return None if servers is None else check_bootstrap(servers)

    @field_validator("heartbeat_timeout")
    @classmethod
    def _some_time(cls, value: Duration) -> Duration:
        if value.ms <= 0:  # (every client would be dropped as it subscribes)
            raise ValueError(f"{value}: must be more than 0")
        return value

    @field_validator("kafka")
    @classmethod
    def _group_protocol(cls, kafka: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        chosen = kafka.get("group.protocol", "classic")
        if chosen not in ("classic", "consumer"):
            raise ValueError(f"group.protocol = {chosen!r}: kq's instances join their group "
                             "with 'classic' (the default) or 'consumer' (KIP-848)")
        return kafka
