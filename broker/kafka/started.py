"""The broker a tool runs on: the one given, or one kq starts for the run (`--broker`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from broker.kafka.apache import ApacheKafka
from broker.kafka.embedded import given_or_embedded

BROKERS = ("embedded", "apache")


@contextmanager
def given_or_started(bootstrap: str | None, broker: str = "embedded") -> Iterator[str]:
    """`bootstrap` when given; else an embedded broker, or with `broker="apache"` a
    single-node Apache Kafka, started here on free ports and stopped at the end."""
    if bootstrap or broker == "embedded":
        with given_or_embedded(bootstrap) as servers:
            yield servers
        return
    if broker != "apache":
        raise ValueError(f"unknown broker {broker!r}: choose from {', '.join(BROKERS)}")
    def say(line: str) -> None:  # on stderr: a tool's stdout may be JSON
        print(line, file=sys.stderr, flush=True)

    kafka = ApacheKafka().start(say=say)
    say(f"Apache Kafka {kafka.version} started in {kafka.started_in_s:.1f} s at "
        f"{kafka.bootstrap_servers}")
    try:
        yield kafka.bootstrap_servers
    finally:
        kafka.stop(timeout=0)
