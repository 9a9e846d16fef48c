"""Instances tell each other (and `kq instances`) what they serve, on PREFIX.instances.

Each instance writes its status every few seconds, keyed by its name: the shards it owns,
those it keeps warm, and how far behind each is. The latest record of a name is its
status; one older than the session timeout (or saying it stopped) is an instance gone.
Standby placement is computed from these by every instance alike.

Each record also names the process that wrote it (its incarnation: a restart is a new one),
so two live processes given the same instance name find each other: a record of their name
from another incarnation, written after they started reading, can only come from a process
alive now; two such records (written 2 s apart) rule out an earlier run still stopping as
this one starts. The later started of the two stops (`StatusBoard.earlier_namesake`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from broker import values
from broker.config import Config
from broker.errors import ConfigError
from broker.kafka import clients

log = logging.getLogger("kq.status")

LOOK_BACK = 5_000  # status records read at start: the latest of every live instance


@dataclass
class InstanceStatus:
    instance: str
    owned: list[int]
    standby: list[int]
    lag: dict[str, dict[str, Any]] = field(default_factory=dict)  # shard -> role, records
    at_ms: int = 0
    stopped: bool = False
    incarnation: str = ""  # this run of the process ("" from older kq)
    started_ms: int = 0
    host: str = ""
    pid: int = 0
    # what every instance of one topic prefix must agree on (broker.config.Config.digest):
    # the shard count and the queues' definitions ("" from older kq)
    config_digest: str = ""
    queues: list[str] = field(default_factory=list)

    def live(self, now_ms: int, timeout_ms: int) -> bool:
        return not self.stopped and now_ms - self.at_ms <= timeout_ms


def decode(value: bytes | None) -> InstanceStatus | None:
    try:
        raw = json.loads(value or b"")
        return InstanceStatus(raw["instance"], list(raw["owned"]), list(raw["standby"]),
                              dict(raw.get("lag") or {}), int(raw["at_ms"]),
                              bool(raw.get("stopped")), str(raw.get("incarnation") or ""),
                              int(raw.get("started_ms") or 0), str(raw.get("host") or ""),
                              int(raw.get("pid") or 0), str(raw.get("config_digest") or ""),
                              list(raw.get("queues") or []))
    except (ValueError, KeyError, TypeError):
        return None


def read_statuses(consumer: Any, topic: str, bootstrap: str = "Kafka"
                  ) -> dict[str, InstanceStatus]:
    """The latest status of every instance that wrote one lately (a consumer of its own)."""
    _, high = clients.watermarks(consumer, topic, 0, bootstrap)
    latest: dict[str, InstanceStatus] = {}
    if high <= 0:
        return latest
    consumer.assign([TopicPartition(topic, 0, max(0, high - LOOK_BACK))])
    seen, deadline = -1, time.monotonic() + 10
    while seen < high - 1 and time.monotonic() < deadline:
        for rec in clients.take(consumer, 1000, 0.2):
            if rec.error() is not None:
                continue
            seen = rec.offset()
            status = decode(rec.value())
            if status is not None:
                latest[status.instance] = status
    consumer.unassign()
    return latest


class Namesakes:
    """Other processes under this instance's name, from the records written since it began
    reading (the earlier ones are of runs that ended before it started)."""

    def __init__(self, me: InstanceStatus, timeout_ms: int) -> None:
        self.me, self.timeout_ms = me, timeout_ms
        self.latest: dict[str, InstanceStatus] = {}  # incarnation -> its latest status
        self.records: dict[str, int] = {}  # incarnation -> records seen

    def seen(self, status: InstanceStatus) -> None:
        if status.instance == self.me.instance and status.incarnation != self.me.incarnation:
            self.latest[status.incarnation] = status
            self.records[status.incarnation] = self.records.get(status.incarnation, 0) + 1

    def earlier(self, now_ms: int) -> InstanceStatus | None:
        """A live one that started before this one (ties broken by incarnation, so both
        sides agree which is the later); two records, so not a run that is stopping."""
        me = self.me
        return next((s for s in self.latest.values() if s.live(now_ms, self.timeout_ms)
                     and self.records[s.incarnation] >= 2
                     and (s.started_ms, s.incarnation) < (me.started_ms, me.incarnation)),
                    None)


class StatusBoard:
    """This instance's view of all of them, kept current by reading the topic as it grows."""

    def __init__(self, bootstrap: str, extra: dict[str, Any], topic: str,
                 timeout_ms: int, me: InstanceStatus | None = None) -> None:
        self.topic, self.timeout_ms = topic, max(timeout_ms, 3 * 2000)
        self.namesakes = Namesakes(me, self.timeout_ms) if me is not None else None
        self._producer = clients.producer(bootstrap, extra, **{"allow.auto.create.topics": False})
        self._consumer = clients.consumer(bootstrap, extra, **{
            "fetch.wait.max.ms": clients.fetch_wait_ms(bootstrap, extra)})
        self.latest = read_statuses(self._consumer, topic, bootstrap)
        _, high = clients.watermarks(self._consumer, topic, 0, bootstrap)
        self._consumer.assign([TopicPartition(topic, 0, max(0, high))])

    def publish(self, status: InstanceStatus) -> None:
        """Sent in the background: the instance's loop never waits on Kafka for it (one
        record every few seconds; what Kafka cannot take in time is dropped by librdkafka).
        A status Kafka refuses at once (its topic gone with a broker that lost its data, a
        full queue) is dropped too, with a warning: it must not hide why the instance stops."""
        try:
            self._producer.produce(self.topic, json.dumps(asdict(status)).encode(),
                                   status.instance.encode(), partition=0)
            self._producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.warning("instance status not sent to %s: %s", self.topic, exc)
        self.latest[status.instance] = status

    def refresh(self) -> None:
        for rec in clients.take(self._consumer, 1000, 0):
            status = decode(rec.value()) if rec.error() is None else None
            if status is None:
                continue
            self.latest[status.instance] = status
            if self.namesakes is not None:
                self.namesakes.seen(status)

    def earlier_namesake(self) -> InstanceStatus | None:
        if self.namesakes is None:
            return None
        return self.namesakes.earlier(int(time.time() * 1000))

    def live(self) -> list[InstanceStatus]:
        now = int(time.time() * 1000)
        return sorted((s for s in self.latest.values() if s.live(now, self.timeout_ms)),
                      key=lambda s: s.instance)

    def serving_other_than(self, name: str, shard: int) -> str | None:
        """A live instance other than `name` whose latest record says it serves `shard`."""
        self.refresh()
        return next((s.instance for s in self.live()
                     if s.instance != name and shard in s.owned), None)

    def standby_shards_of(self, name: str, shards: int) -> set[int]:
        """The shards `name` keeps warm: each shard's standby is the live instance after its
        owner in name order (none while the owner is alone)."""
        self.refresh()
        live = [s.instance for s in self.live()]
        if name not in live or len(live) < 2:
            return set()
        owner_of = {shard: s.instance for s in self.live() for shard in s.owned}
        mine = set()
        for shard in range(shards):
            owner = owner_of.get(shard)
            if owner is None or owner not in live or owner == name:
                continue
            follower = live[(live.index(owner) + 1) % len(live)]
            if follower == name:
                mine.add(shard)
        return mine

    def close(self, wait_s: float = 5.0) -> None:
        """Send what is pending within `wait_s`, then drop the rest (Kafka away: the others
        see this instance's records stop, and count it gone after the timeout)."""
        if self._producer.flush(wait_s):
            if wait_s:
                log.info("Kafka did not take the last status record within %.0f s", wait_s)
            self._producer.purge()
        self._consumer.close()


def kq_serve_runs(pid: int) -> bool:
    """Whether another process of this host with `pid` runs `kq serve` (True when this
    system cannot tell: the rule of records then decides)."""
    if pid <= 0 or pid == os.getpid():  # a container restarted: the same pid, a new run
        return False
    if not Path("/proc/self").exists():
        return True
    try:
        return b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True


def refuse_other_queues(config: Config, board: StatusBoard, name: str, prefix: str) -> None:
    """Instances of one topic prefix share the shards, so they must share the queues: a
    second config on the prefix with other queues would have each instance serve queues
    the other does not know. Refused before joining the group."""
    now = values.now_ms()
    mine = config.digest()
    for other in board.latest.values():
        if (other.instance == name or not other.config_digest
                or other.config_digest == mine or not other.live(now, board.timeout_ms)):
            continue
        ours, theirs = set(config.queues), set(other.queues)
        if ours == theirs:  # a rolling change of queue settings: allowed, but said
            log.warning("instance %s (host %s) serves topic prefix %r with the same queues "
                        "defined differently; fine while a config change rolls out, not "
                        "for long", other.instance, other.host, prefix)
            continue
        differ = "; ".join(filter(None, [
            f"queues only here: {', '.join(sorted(ours - theirs))}" if ours - theirs else "",
            f"queues only there: {', '.join(sorted(theirs - ours))}" if theirs - ours else "",
        ]))
        raise ConfigError(
            f"instance {other.instance} (host {other.host}, pid {other.pid}) serves topic "
            f"prefix {prefix!r} with other queues ({differ}). Instances of "
            "one topic prefix share its shards, so they must have the same [[queue]] "
            "tables: give this config a topic_prefix of its own, or the same queues")
