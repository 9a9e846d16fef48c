"""What expressions (filters, priority, barriers, ack by filter) see of a message: its payload
decoded by its queue's format, and its headers."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable

from broker.config import QueueConfig
from broker.expr import Doc
from broker.formats import decode, load_schema
from broker.service.metrics import Metrics
from broker.state.payload import Payload
from broker.values import Bookmark

DOC_CACHE = 10_000  # decoded payloads kept per shard, for filters asking again


class Docs:
    def __init__(self, queues: Iterable[QueueConfig], metrics: Metrics,
                 payload_of: Callable[[Bookmark], Payload | None]) -> None:
        self._queues = {q.name: q for q in queues}
        self._metrics = metrics
        self._payload_of = payload_of  # a queued message's payload: this batch's or stored
        # per shard: a cache on the method would be shared by every shard of the process
        self.load = functools.lru_cache(maxsize=DOC_CACHE)(self._load)

    def _load(self, queue: str, bm: Bookmark) -> Doc | None:
        """A queued message's Doc, read back (nothing is kept per message in memory)."""
        payload = self._payload_of(bm)
        return None if payload is None else self.of(queue, payload)

    def of(self, queue: str, payload: Payload, now: int | None = None) -> Doc | None:
        """The Doc of a payload (`bytes` format: headers only). None for a payload that does
        not parse: every expression on it is NULL (no filter matches it, lowest priority, not
        a barrier), and it is counted."""
        cfg = self._queues[queue]
        try:
            data = decode(cfg.format, payload.value,
                          load_schema(cfg.schema_) if cfg.schema_ else None)
        except ValueError:
            self._metrics.unparseable.labels(queue).inc()
            return None
        return Doc(data, dict(payload.headers), now if now is not None else int(time.time() * 1000))
