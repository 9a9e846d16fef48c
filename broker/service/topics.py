"""The names of kq's own topics, under the configured prefix, and their creation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions

from broker.config import ServiceConfig
from broker.errors import ConfigError, StateError
from broker.kafka import clients
from broker.service.retention import SNAPSHOT_TOPIC, apply_journal_retention, journal_settings

log = logging.getLogger("kq.topics")
T = TypeVar("T")



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
    def snapshots(self) -> str:
        """Each shard's snapshots (compacted), one partition per shard (SPEC 14)."""
        return f"{self.prefix}.snapshots"

    @property
    def instances(self) -> str:
        """What each `kq serve` instance serves, keyed by instance name (`kq instances`)."""
        return f"{self.prefix}.instances"


def shard_dir(data_dir: str | Path, shard: int) -> Path:
    """Where a shard's RocksDB state (and its pager) live."""
    return Path(data_dir) / f"shard-{shard}"


def prepare_topics(admin: AdminClient, topics: Topics, command_topics: list[str],
                   svc: ServiceConfig) -> None:
    """Create kq's own topics: the journal, the snapshots and each command topic with one
    partition per shard. The journal fixes the shard count: a config asking for another is
    refused. The journal's retention is set and checked (broker.service.retention)."""
    shards = svc.shards
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
    # The journal and the newest snapshot are the state: a restore loads the one and
    # replays the other after it.
    clients.ensure_topics(admin, [topics.journal], partitions=shards,
                          config=journal_settings(svc), tuning=clients.SMALL_INDEXES)
    apply_journal_retention(admin, topics.journal, svc)
    clients.ensure_topics(admin, [topics.snapshots], partitions=shards, config=SNAPSHOT_TOPIC)
    clients.ensure_topics(admin, command_topics, partitions=shards, tuning=clients.SMALL_INDEXES)
    clients.ensure_topics(admin, [topics.flow, topics.instances], tuning=clients.SMALL_INDEXES)
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
    if grow:
        clients.wait_for_leaders(admin, [g.topic for g in grow])


class TopicWatch:
    """Kafka's topics, listed every `every_s` on a thread of its own: a loop asking for them
    never waits on a slow metadata answer (with Kafka unreachable, each waits `timeout_s`),
    so it goes on answering heartbeats, signals and the group meanwhile.

    It also notices kq's own topics (`required`) vanishing: missing from two listings in a
    row (one broker of a cluster may not know a topic just created yet), Kafka lost its data,
    and going on would let the local state diverge from it."""

    def __init__(self, admin: AdminClient, required: set[str], every_s: float = 2.0,
                 timeout_s: float = 5.0) -> None:
        self._admin, self.required = admin, required
        self._every_s, self._timeout_s = every_s, timeout_s
        self._listing: Future[dict[str, int | None] | None] | None = None
        self._last = float("-inf")  # when the last listing was asked for
        self._missing_before = False
        self._failing = False  # the last listing failed

    def now(self) -> dict[str, int | None] | None:
        """A listing, waited for (at start-up, before anything is served); None if it
        failed."""
        self._last = time.monotonic()
        return self._checked(self._list())

    def latest(self) -> dict[str, int | None] | None:
        """A listing finished since the last call, else None; asks for the next one when
        due."""
        if self._listing is None:
            if time.monotonic() - self._last >= self._every_s:
                self._last = time.monotonic()
                self._listing = _in_background(self._list)
            return None
        if not self._listing.done():
            return None
        done, self._listing = self._listing, None
        return self._checked(done.result())

    def _list(self) -> dict[str, int | None] | None:
        try:
            listed = clients.topic_metadata(self._admin, timeout=self._timeout_s)
        except Exception as exc:  # noqa: BLE001 - a slow answer is not a lost topic
            # said once, not every few seconds for as long as Kafka is away
            log.log(logging.DEBUG if self._failing else logging.WARNING,
                    "could not list Kafka's topics (trying again every %.0f s): %s",
                    self._every_s, exc)
            self._failing = True
            return None
        if self._failing:
            log.info("Kafka lists its topics again")
            self._failing = False
        return listed

    def _checked(self, listed: dict[str, int | None] | None) -> dict[str, int | None] | None:
        if listed is None:
            return None
        missing = sorted(t for t in self.required if t not in listed)
        seen_missing_before, self._missing_before = self._missing_before, bool(missing)
        if missing and seen_missing_before:
            raise StateError(
                f"the topic(s) {', '.join(missing)} are gone from Kafka: Kafka lost data (was "
                "the broker restarted empty?). Stopping before the local state diverges; "
                "restart against the original cluster, or delete data_dir to start afresh.")
        return listed


def _in_background(fn: Callable[[], T]) -> Future[T]:
    """`fn()` on a daemon thread (one that never holds up the process's exit)."""
    result: Future[T] = Future()

    def run() -> None:
        try:
            result.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the result
            result.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="kq-topic-listing").start()
    return result
