"""Which subscription gets the next message (SPEC section 6, Fairness)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from broker.engine.queue import Subscription


def pick_fast(subs: Sequence[Subscription], last: str | None) -> Subscription | None:
    """The first subscription found with room."""
    return next((s for s in subs if s.room > 0), None)


def pick_round_robin(subs: Sequence[Subscription], last: str | None) -> Subscription | None:
    """The next subscription after the one served last, in subscription order, with room."""
    start = 0
    if last is not None:
        for i, s in enumerate(subs):
            if s.sub_id == last:
                start = i + 1
                break
    n = len(subs)
    for k in range(n):
        s = subs[(start + k) % n]
        if s.room > 0:
            return s
    return None


def pick_proportional(subs: Sequence[Subscription], last: str | None) -> Subscription | None:
    """The subscription with the lowest leased/max_backlog ratio; first found on a tie."""
    best: Subscription | None = None
    best_ratio = 2.0
    for s in subs:
        if s.room <= 0:
            continue
        ratio = len(s.held) / s.cap
        if ratio < best_ratio:
            best, best_ratio = s, ratio
    return best


PICKERS: Final = {
    "fast": pick_fast,
    "round-robin": pick_round_robin,
    "proportional": pick_proportional,
}
