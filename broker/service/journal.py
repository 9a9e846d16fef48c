"""Reading the journal back: parts become whole batches, or are dropped."""

from __future__ import annotations

from typing import Any

Part = dict[str, Any]


class BatchAssembler:
    """Feed decoded journal parts in journal order; get each batch once all its parts are in.

    A batch counts only when its parts arrive whole and in order: leftovers of a batch cut
    short by a crash are dropped (their inputs were never committed, so they are read again),
    and so are parts interrupted by a start-up marker.
    """

    def __init__(self) -> None:
        self._pending: list[Part] = []

    def continues(self, part: Part) -> bool:
        """Whether this part is the next one of the batch being assembled (a reader of an
        offset range reads past its end only for that)."""
        return (part["marker"] is None and bool(self._pending)
                and self._pending[-1]["batch"] == part["batch"]
                and self._pending[-1]["part"] == part["part"] - 1)

    def add(self, part: Part) -> list[Part] | None:
        """The whole batch this part completes, or None."""
        if part["marker"] is not None:
            self._pending = []
            return None
        if part["part"] == 0:
            self._pending = [part]
        elif self.continues(part):
            self._pending.append(part)
        else:
            self._pending = []
            return None
        if part["part"] != part["parts"] - 1:
            return None
        whole, self._pending = self._pending, []
        return whole
