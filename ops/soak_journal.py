"""The soak with a short journal retention (`ops/soak.py --journal-retention`): the journal as
it was written, kept by the soak itself, and the journal's size on the broker over time.

With a retention of minutes the broker deletes the journal's head during the run, while the
soak's check needs every transition: an archiver reads the journal as it is written and keeps
it (it is an observer: kq never reads it). The size the broker keeps is asked of it with
Apache Kafka's own `kafka-log-dirs` tool (the jars kq fetched), every `every_s`.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from broker.kafka import clients
from broker.kafka.apache import KAFKA_VERSION, ensure_jars


class JournalArchive:
    """Every record of the journal's partitions, read as they are written."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.records: dict[int, list[Any]] = {p: [] for p in range(partitions)}
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="journal-archive")

    def start(self) -> JournalArchive:
        self._thread.start()
        return self

    def stop(self, settle_s: float = 3.0) -> None:
        """Read on until the journal has been quiet `settle_s`, then stop."""
        time.sleep(settle_s)
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        c = clients.consumer(self.bootstrap, None, **{"fetch.wait.max.ms": 50})
        c.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        expected = dict.fromkeys(range(self.partitions), 0)
        while not self._stop.is_set():
            for rec in clients.take(c, 5000, 0.2):
                if rec.error() is not None:
                    continue
                p = rec.partition()
                low, _ = c.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                if rec.offset() > expected[p] and low is not None and low > expected[p]:
                    self.problems.append(
                        f"the archive of {self.topic}/{p} missed offsets {expected[p]} to "
                        f"{rec.offset() - 1}: retention deleted them before it read them")
                expected[p] = rec.offset() + 1
                self.records[p].append(rec)
        c.close()


def journal_bytes(bootstrap: str, topic: str) -> int | None:
    """The bytes the broker keeps for `topic` (all partitions), or None if it does not say."""
    libs = ensure_jars(KAFKA_VERSION)
    try:
        out = subprocess.run(
            ["java", "-cp", f"{libs}/*", "org.apache.kafka.tools.LogDirsCommand", "--describe",
             "--bootstrap-server", bootstrap, "--topic-list", topic],
            capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if line.startswith("{"):
            found = json.loads(line)
            return sum(part["size"] for b in found["brokers"] for d in b["logDirs"]
                       for part in d["partitions"])
    return None


class BytesSampler:
    """The journal's size on the broker, every `every_s` seconds, as (seconds, bytes)."""

    def __init__(self, bootstrap: str, topic: str, every_s: float = 30.0) -> None:
        self.bootstrap, self.topic, self.every_s = bootstrap, topic, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="journal-bytes")

    def start(self) -> BytesSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        began = time.monotonic()
        while not self._stop.is_set():
            size = journal_bytes(self.bootstrap, self.topic)
            if size is not None:
                self.samples.append((time.monotonic() - began, size))
            self._stop.wait(self.every_s)

    def line(self) -> str:
        return "journal bytes on the broker: " + ", ".join(
            f"{t / 60:.1f} min {b / 1e6:.1f} MB" for t, b in self.samples)


class Retention:
    """The soak's retention settings, and what it does with them around the run."""

    def __init__(self, snapshot_interval: str | None, journal_retention: str | None,
                 segment_ms: int) -> None:
        lines = []
        if snapshot_interval:
            lines.append(f'snapshot_interval = "{snapshot_interval}"')
        if journal_retention:
            lines.append(f'journal_retention = "{journal_retention}"')
        self.service = "\n".join(lines)
        self.short = journal_retention is not None
        self.segment_ms = segment_ms
        self.archive: JournalArchive | None = None
        self.sampler: BytesSampler | None = None

    def begin(self, bootstrap: str, journal: str, partitions: int) -> None:
        """Once the journal exists: small segments, so retention really deletes; the archive
        and the size samples start."""
        if not self.short:
            return
        admin = clients.admin(bootstrap)
        resource = ConfigResource(ResourceType.TOPIC, journal)
        resource.add_incremental_config(ConfigEntry(
            "segment.ms", str(self.segment_ms), incremental_operation=AlterConfigOpType.SET))
        admin.incremental_alter_configs([resource])[resource].result(30)
        self.archive = JournalArchive(bootstrap, journal, partitions).start()
        self.sampler = BytesSampler(bootstrap, journal).start()

    def end(self, report: Any) -> dict[int, list[Any]] | None:
        if self.archive is None:
            return None
        self.archive.stop()
        if self.sampler is not None:
            self.sampler.stop()
        report.problems += self.archive.problems
        return self.archive.records
