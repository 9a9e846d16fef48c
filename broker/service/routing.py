"""Which queues a topic feeds, and which topics are forwarded (SPEC section 5)."""

from __future__ import annotations

from functools import lru_cache

from broker.config import QueueConfig


class Router:
    def __init__(self, queues: tuple[QueueConfig, ...], topic_prefix: str) -> None:
        self._queues = queues
        self._own = topic_prefix + "."
        self.queues_of = lru_cache(maxsize=4096)(self._queues_of)
        self.forward_target = lru_cache(maxsize=4096)(self._forward_target)

    def _queues_of(self, topic: str) -> tuple[str, ...]:
        """The queues that enqueue records of `topic`."""
        if topic.startswith(self._own):
            return ()
        return tuple(q.name for q in self._queues if q.topic_regex.search(topic))

    def _forward_target(self, topic: str) -> str | None:
        """A topic named exactly like a queue, and not matched by its regex, is forwarded."""
        for q in self._queues:
            if q.name == topic and not q.topic_regex.search(topic):
                return q.publish_target
        return None

    def wanted(self, topic: str) -> bool:
        return bool(self.queues_of(topic)) or self.forward_target(topic) is not None
