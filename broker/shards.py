"""Which shard a queue belongs to, computed the same way by the service and the client.

The client knows the shard count (the command topic's partitions) but not the config, so a
queue without a `shard` key is placed by a hash of its name alone. A queue with one is
found by its first command going to the hashed shard, whose owner forwards it and answers
a subscribe with the queue's real shard (broker.client remembers it).
"""

from __future__ import annotations

import zlib
from typing import Any


def shard_by_name(queue: str, shards: int) -> int:
    """A stable hash (CRC-32, the same in every process and release) of the name."""
    return zlib.crc32(queue.encode()) % shards if shards > 1 else 0


def join_answers(answers: dict[int, dict[str, Any]], missing: list[int]) -> dict[str, Any]:
    """The answers of several shards to one query as one: lists joined in shard order, other
    fields from the first shard that has them; `unanswered_shards` names those missing."""
    joined: dict[str, Any] = {"unanswered_shards": missing} if missing else {}
    for _, body in sorted(answers.items()):
        for key, value in body.items():
            if isinstance(value, list):
                joined.setdefault(key, []).extend(value)
            else:
                joined.setdefault(key, value)
    return joined
