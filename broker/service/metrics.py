"""Prometheus metrics of the service, in a registry the service owns."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from broker.engine.engine import Engine
from broker.engine.transitions import Kind, Transition, tally


class Metrics:
    """One per process: every shard the instance runs reports into it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.transitions = Counter("kq_transitions", "Queue state transitions",
                                   ["queue", "kind", "reason"], registry=self.registry)
        self.records_in = Counter("kq_records_consumed", "Records consumed (sources and "
                                  "commands)", registry=self.registry)
        self.bad_commands = Counter("kq_bad_commands", "Commands that could not be decoded",
                                    registry=self.registry)
        self.unparseable = Counter("kq_unparseable_payloads", "Payloads that did not parse "
                                   "(expressions see NULL)", ["queue"], registry=self.registry)
        self.depth = Gauge("kq_queue_depth", "Messages in the queue (available + leased)",
                           ["queue"], registry=self.registry)
        self.available = Gauge("kq_queue_available", "Available messages", ["queue"],
                               registry=self.registry)

        # scale-out (SPEC 12): what this instance serves, per shard
        self.shards = Gauge("kq_service_shards", "The configured shard count",
                            registry=self.registry)
        self.owned = Gauge("kq_shard_owned", "1 for each shard this instance owns",
                           ["shard", "kq_instance"], registry=self.registry)
        self.standby = Gauge("kq_shard_standby", "1 for each shard this instance keeps warm",
                             ["shard", "kq_instance"], registry=self.registry)
        self.lag = Gauge("kq_shard_lag_records", "Records behind: an owner's unread input "
                         "records, a standby's unapplied journal records",
                         ["shard", "kq_instance", "role"], registry=self.registry)

        # a bounded journal (SPEC 14)
        self.snapshots = Counter("kq_snapshots_written", "Snapshots written to "
                                 "PREFIX.snapshots", ["shard"], registry=self.registry)
        self.snapshot_seconds = Histogram(
            "kq_snapshot_write_seconds", "How long writing a snapshot took", ["shard"],
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=self.registry)
        self.snapshot_bytes = Gauge("kq_snapshot_bytes", "Size of the newest snapshot",
                                    ["shard"], registry=self.registry)
        self.snapshot_journal_offset = Gauge(
            "kq_snapshot_journal_offset", "The journal offset the newest snapshot reflects",
            ["shard"], registry=self.registry)
        self.lost_to_retention = Counter(
            "kq_records_lost_to_retention", "Records of underlying topics deleted by their "
            "retention before kq read them", ["topic"], registry=self.registry)

    def shards_status(self, instance: str, shards: int, status: Any) -> None:
        self.shards.set(shards)
        for shard in range(shards):
            key = str(shard)
            self.owned.labels(key, instance).set(1 if shard in status.owned else 0)
            self.standby.labels(key, instance).set(1 if shard in status.standby else 0)
            for role in ("owner", "standby"):
                held = status.lag.get(key, {})
                self.lag.labels(key, instance, role).set(
                    held.get("records", 0) if held.get("role") == role else 0)

    def forget_queues(self, names: Iterable[str]) -> None:
        """A shard given away: its queues' gauges are another instance's to report."""
        for name in names:
            for gauge in (self.depth, self.available):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)

    def observe(self, engine: Engine, transitions: list[Transition], records_in: int) -> None:
        if not transitions and not records_in:  # an idle turn of the loop: nothing to count
            return
        counts = tally(transitions)
        for (queue, kind, reason), n in counts.items():
            self.transitions.labels(queue, kind.value, reason).inc(n)
        touched = {queue for queue, kind, _ in counts if kind is not Kind.SUBSCRIBED}
        self.records_in.inc(records_in)
        for name in touched:
            q = engine.queues.get(name)
            if q is not None:
                self.available.labels(name).set(q.available_count())
                self.depth.labels(name).set(q.depth())
