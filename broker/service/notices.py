"""What the service tells operators in its log about records it could not serve."""

from __future__ import annotations

import logging

from broker.config import Config
from broker.engine.engine import Engine
from broker.service.metrics import Metrics
from broker.state.layout import SEP
from broker.state.store import Store
from broker.values import Bookmark

log = logging.getLogger("kq.service")


def say_lost(metrics: Metrics, topic: str, partition: int, start: int, end: int) -> None:
    """Records of an underlying topic deleted by its retention before kq read them."""
    metrics.lost_to_retention.labels(topic).inc(end - start)
    log.warning("%s/%d: %d record(s) at offsets %d to %d were deleted by the topic's "
                "retention before kq read them: they never reached the queues reading it "
                "(kq_records_lost_to_retention_total)", topic, partition, end - start,
                start, end - 1)


def say_too_large(engine: Engine, queue: str, bm: Bookmark | None) -> None:
    """A record no delivery could carry is removed at once: an operator must hear it."""
    q = engine.queues[queue]
    where = (f"dead-lettered to {q.config.dead_letter_topic} without its value"
             if q.config.dead_letter_topic else "dropped (the queue has no dead_letter_topic)")
    log.warning("queue %s: %s is larger than the largest record kq may deliver (%d bytes: "
                "the broker's message.max.bytes less kq's envelope); %s. Raise the "
                "broker's and the topics' max.message.bytes to deliver such records",
                queue, bm, engine.max_message_bytes, where)


def say_strays(store: Store, config: Config, shard: int) -> list[str]:
    """Queues this shard holds state of but no longer serves (their `shard` key changed, or
    they left the configuration), named at start: the state stays, unserved, and a queue
    now on another shard starts there from its recovery point. Not refused: that shard
    may be serving it already. The names, for tests."""
    served = {q.name for q in config.queues_of_shard(shard)}
    strays = []
    for key, _ in store.scan(b"q" + SEP):
        name = key[2:].decode()
        if name in served:
            continue
        strays.append(name)
        if name not in config.queues:
            log.info("queue %s has state in shard %d but is not in the configuration: "
                     "the state is kept, unserved, until the queue is configured again",
                     name, shard)
        else:
            log.warning("queue %s has state in shard %d, but its `shard` key now places it "
                        "in shard %d, which serves it from its recovery point: messages "
                        "acked here may be delivered again there, and those queued here "
                        "are not served. Set `shard = %d` on it to serve this state again",
                        name, shard, config.shard_of(name), shard)
    return strays
