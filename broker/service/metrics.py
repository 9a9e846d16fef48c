"""Prometheus metrics of the service, in a registry the service owns."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from broker.engine.engine import Engine
from broker.engine.transitions import Kind, Transition


class Metrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self._engine = engine
        self.transitions = Counter("kq_transitions", "Queue state transitions",
                                   ["queue", "kind", "reason"], registry=self.registry)
        self.records_in = Counter("kq_records_consumed", "Records consumed (sources and "
                                  "commands)", registry=self.registry)
        self.bad_commands = Counter("kq_bad_commands", "Commands that could not be decoded",
                                    registry=self.registry)
        self.depth = Gauge("kq_queue_depth", "Messages in the queue (available + leased)",
                           ["queue"], registry=self.registry)
        self.available = Gauge("kq_queue_available", "Available messages", ["queue"],
                               registry=self.registry)

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)

    def observe(self, transitions: Iterable[Transition], records_in: int) -> None:
        touched = set()
        for t in transitions:
            self.transitions.labels(t.queue, t.kind.value, t.reason or "").inc()
            if t.kind is not Kind.SUBSCRIBED:
                touched.add(t.queue)
        self.records_in.inc(records_in)
        for name in touched:
            q = self._engine.queues.get(name)
            if q is not None:
                self.available.labels(name).set(len(q.available))
                self.depth.labels(name).set(len(q.messages))
