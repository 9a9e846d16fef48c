"""How long a message may wait in a queue: its time to live, fixed when it arrives.

The `kq-expiration` header (ms to live from the record's timestamp, an ASCII decimal), else
the queue's `expiration`, else unlimited; then raised to `min_ttl` and lowered to `max_ttl`
(so with `max_ttl` every message expires; an unlimited one is not raised). A header that is
not a whole number of ms >= 0 is ignored.

A message whose time to live is just the queue's `expiration` keeps no expiry of its own
(`None`): it is reckoned from the config, as before these keys, so changing `expiration`
reaches the messages already queued. Any other gets its own, journaled and stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from broker.config import QueueConfig

EXPIRATION_HEADER: Final = "kq-expiration"


def own_expiry(config: QueueConfig, timestamp_ms: int,
               headers: Mapping[str, bytes | None]) -> int | None:
    """When a message arriving with these headers expires (epoch ms), when that is not
    simply its timestamp plus the queue's `expiration`; None otherwise."""
    ttl = header_ttl(headers)
    if ttl is None and config.min_ttl is None and config.max_ttl is None:
        return None  # the queue's expiration, or none: reckoned from the config
    if ttl is None and config.expiration is not None:
        ttl = config.expiration.ms
    if ttl is not None and config.min_ttl is not None:
        ttl = max(ttl, config.min_ttl.ms)
    if config.max_ttl is not None:
        ttl = config.max_ttl.ms if ttl is None else min(ttl, config.max_ttl.ms)
    return None if ttl is None else timestamp_ms + ttl


def header_ttl(headers: Mapping[str, bytes | None]) -> int | None:
    raw = headers.get(EXPIRATION_HEADER)
    if raw is None:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isascii() and text.isdigit() else None
