"""The soak's accounting (`ops/soak.py`): every published message followed through the
committed journal and the subscribers' logs, and checked against SPEC section 10."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from broker import wire
from broker.kafka import clients
from broker.service.commit import JOURNALS_IN_FLIGHT
from broker.service.journal import BatchAssembler, transitions_of


@dataclass
class Report:
    published: int = 0
    kills: int = 0
    freezes: int = 0
    acked: int = 0
    removed: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0
    redeliveries: int = 0
    dead_letter_records: int = 0
    states_lost: int = 0  # kills after which the instance's data_dir was deleted
    # batches a woken owner wrote after its successor's marker, before its fence stopped it
    # (without exactly_once a freeze between the fence's look and the write lets one through)
    inert_batches: int = 0
    audited_mid: int | None = None  # messages `kq journal audit` compared mid-run
    audited: int | None = None  # messages `kq journal audit` compared at the end
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"published {self.published}, instances killed {self.kills} times "
            f"({self.states_lost} with data_dir lost), frozen {self.freezes} times",
            f"acked {self.acked}, removed {dict(self.removed)}, "
            f"dead-letter records {self.dead_letter_records}",
            f"deliveries seen by subscribers {self.deliveries} "
            f"(redeliveries {self.redeliveries})",
            f"journal batches written by a woken owner after its successor's marker (ignored "
            f"by every reader): {self.inert_batches}",
            *([f"kq journal audit mid-run: {self.audited_mid} message(s) compared"]
              if self.audited_mid is not None else []),
            *([f"kq journal audit at the end: {self.audited} message(s) compared"]
              if self.audited is not None else []),
            f"problems: {len(self.problems)}",
            *self.problems[:20],
        ]



def read_all(bootstrap: str, topic: str, partition: int = 0) -> list[Any]:
    """Every record of one partition of `topic` (read until a quiet second: used at the end)."""
    c = clients.consumer(bootstrap)
    c.assign([TopicPartition(topic, partition, 0)])
    out: list[Any] = []
    quiet = time.monotonic()
    while time.monotonic() - quiet < 1.5:
        got = [r for r in clients.take(c, 5000, 0.2) if not r.error()]
        if got:
            out.extend(got)
            quiet = time.monotonic()
    c.close()
    return out


def committed_transitions(bootstrap: str, journal: str, shards: int, report: Report,
                          archive: dict[int, list[Any]] | None = None,
                          exactly_once: bool = False) -> list[dict[str, Any]]:
    """Transitions of the batches that were committed (whole), in journal order per shard (a
    queue lives in one shard). `archive`: the journal's records as the soak kept them while
    they were written (the broker deleted its head meanwhile).

    A part an earlier owner wrote after a later owner's takeover marker is inert (every reader
    ignores it). Without exactly_once up to JOURNALS_IN_FLIGHT such batches per takeover are
    the documented gap (the owner frozen between its fence's look and its writes, with the
    journals on their way then; its fence stops it at the first one's acknowledgement); one
    more, or any with exactly_once, is a fencing failure."""
    rows: list[dict[str, Any]] = []
    for shard in range(shards):
        batches = BatchAssembler()
        late: dict[tuple[str | None, str], set[int]] = defaultdict(set)  # (reign, writer)
        for rec in (archive[shard] if archive else read_all(bootstrap, journal, shard)):
            part = wire.decode("journal", rec.value())
            if not part["marker"] and not batches.counts(part):
                seen = late[(batches.reign, part["writer"])]
                seen.add(part["batch"])
                if exactly_once or len(seen) > JOURNALS_IN_FLIGHT:
                    report.problems.append(
                        f"shard {shard}: journal offset {rec.offset()} written by "
                        f"{part['writer']} after {batches.reign} took over"
                        + ("" if exactly_once else f" ({len(seen)} batches after it)"))
            whole = batches.add(part)
            if whole is not None:
                rows.extend(t for p in whole for t in transitions_of(p))
        report.inert_batches += sum(len(b) for b in late.values())
    return rows


def check(report: Report, published: list[str], queue_of: dict[str, str],
          transitions: list[dict[str, Any]], deliveries: list[list[Any]]) -> None:
    """Account for every published message from the journal and the subscribers' logs."""
    history: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for t in transitions:
        if t["bookmark"]:
            history[(t["queue"], t["bookmark"])].append(t)
    acked_at_count: dict[str, int] = {}  # bookmark -> delivery count of the acked lease
    for bm in published:
        h = history.get((queue_of[bm], bm), [])
        kinds = [t["kind"] for t in h]
        if kinds.count("enqueued") != 1 or kinds[0] != "enqueued":
            report.problems.append(f"{bm}: enqueued {kinds.count('enqueued')} times: {kinds}")
            continue
        ends = [i for i, k in enumerate(kinds) if k in ("acked", "removed")]
        if ends != [len(kinds) - 1]:
            report.problems.append(f"{bm}: not finished exactly once: {kinds}")
            continue
        last = h[-1]
        counts = [t["delivery_count"] for t in h if t["kind"] == "leased"]
        if counts != sorted(set(counts)):
            report.problems.append(f"{bm}: delivery counts went back: {counts}")
        if last["kind"] == "acked":
            report.acked += 1
            acked_at_count[bm] = counts[-1] if counts else 0
        else:
            report.removed[last["reason"]] += 1
    for bm, dc, _ in deliveries:
        report.deliveries += 1
        if dc > 1:
            report.redeliveries += 1
        if bm in acked_at_count and dc > acked_at_count[bm]:
            report.problems.append(f"{bm}: delivered (count {dc}) after it was acked")
