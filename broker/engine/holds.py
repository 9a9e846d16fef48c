"""When a message may be delivered: held on arrival, and delayed after a lease ends.

Two rules set a message's `not_before_ms`, the moment it becomes available:

  hold until        with `hold_on_publish`, the `kq-not-before` header (epoch ms, an ASCII
                    decimal; anything else is ignored) when it lies in the future (Qpid's
                    hold-until).
  redelivery delay  a cancelled or lapsed message waits `redelivery_delay`, doubled for each
                    delivery before the last under `exponential` (capped by
                    `max_redelivery_delay`); `msg.cancel(delay=...)` sets it for one return.

A held message is in the queue (depth, `kq inspect` shows it `held`) but not among the
available ones, so it blocks nothing behind it; the engine's timers release it when due.
The moment is journaled with the transition that sets it (ENQUEUED, RETURNED) and stored
with the message, so a restart holds it just as long.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from broker.config import QueueConfig

NOT_BEFORE_HEADER: Final = "kq-not-before"


def hold_until(config: QueueConfig, now: int, headers: Mapping[str, bytes | None]) -> int | None:
    """When a message arriving now with these headers becomes available, if it is held."""
    if not config.hold_on_publish:
        return None
    raw = headers.get(NOT_BEFORE_HEADER)
    text = raw.decode("ascii", "replace").strip() if raw is not None else ""
    if not (text.isascii() and text.isdigit()):
        return None
    at = int(text)
    return at if at > now else None


def redelivery_delay_ms(config: QueueConfig, delivery_count: int) -> int:
    """How long a message returned after its `delivery_count`-th delivery waits."""
    base = config.redelivery_delay.ms if config.redelivery_delay else 0
    if config.redelivery_backoff != "exponential" or delivery_count <= 1:
        return base
    cap = config.max_redelivery_delay.ms if config.max_redelivery_delay else None
    # doubled per delivery before the last; the exponent is bounded before it can overflow
    delay = base << min(delivery_count - 1, 40)
    return delay if cap is None else min(delay, cap)
