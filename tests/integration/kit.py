"""Helpers for integration tests: a service in a thread, producers, readers, waiting."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from confluent_kafka import Producer, TopicPartition

from broker.config import parse_config
from broker.kafka import clients
from broker.service.service import Service

T = TypeVar("T")


def uid() -> str:
    return uuid.uuid4().hex[:8]


def wait_for(condition: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def config(prefix: str, data_dir: str, queues: list[dict[str, Any]], **service: Any) -> Any:
    return parse_config({
        "service": {"topic_prefix": prefix, "data_dir": data_dir, "metrics_port": 0, **service},
        "queue": queues,
    })


@contextmanager
def running_service(bootstrap: str, cfg: Any) -> Iterator[Service]:
    service = Service(cfg, bootstrap)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # surfaced to the test below
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: service.ready.is_set() or failure, 30, "the service to start")
    if failure:
        raise failure[0]
    try:
        yield service
    finally:
        service.stop()
        thread.join(15)
    if failure:
        raise failure[0]


def publish(bootstrap: str, topic: str, values: list[bytes], key: bytes | None = None,
            headers: list[tuple[str, bytes]] | None = None) -> list[str]:
    """Produce with a plain confluent producer; return the bookmarks."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    out: list[str] = []
    for v in values:
        p.produce(topic, v, key, headers=headers,
                  on_delivery=lambda e, m: out.append(f"{m.topic()}/{m.partition()}/{m.offset()}"))
    assert p.flush(10) == 0
    return out


def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 10.0) -> list[Any]:
    """Read `count` records from every partition of `topic`, from the start."""
    c = clients.consumer(bootstrap)
    parts = wait_for(lambda: clients.topic_partitions(clients.admin(bootstrap)).get(topic),
                     timeout, f"topic {topic}")
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got.extend(r for r in c.consume(100, 0.1) if not r.error())
    c.close()
    return got


def drain(sub: Any, count: int, timeout: float = 10.0) -> list[Any]:
    """Take `count` messages from a subscription without acking them."""
    got: list[Any] = []
    for msg in sub.messages(timeout=timeout):
        got.append(msg)
        if len(got) >= count:
            break
    return got


def ensure_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    clients.ensure_topics(clients.admin(bootstrap), [topic], partitions)
