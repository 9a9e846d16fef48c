"""What a subscriber saw, message by message: the part of SPEC 10 a subscriber can check
itself (no message delivered again after its ack, no delivery count going back)."""

from __future__ import annotations

from typing import Any


class Ledger:
    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.counts: dict[str, int] = {}
        self.problems: list[str] = []

    def ack(self, msg: Any) -> None:  # noqa: ANN401 - a broker.subscription.Message
        """Check a delivered message against what came before it, then ack it."""
        if msg.bookmark in self.acked:
            self.problems.append(f"{msg.bookmark} delivered again after its ack")
        if msg.delivery_count < self.counts.get(msg.bookmark, 0):
            self.problems.append(f"{msg.bookmark} delivery count went back")
        self.counts[msg.bookmark] = msg.delivery_count
        msg.ack()
        self.acked.add(msg.bookmark)
