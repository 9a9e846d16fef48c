"""The journal's records: a batch written as parts, and parts read back into whole batches
(or dropped). Each part's transitions are packed in columns (broker.service.columns)."""

from __future__ import annotations

from typing import Final

from broker import wire
from broker.engine.transitions import Kind, Transition
from broker.service.columns import (
    COLUMNS,
    Part,
    decode_columns,
    encode_columns,
    strings_of,
    transition_from,
    transitions_in,
    transitions_of,
)
from broker.values import now_ms

__all__ = ["COLUMNS", "TRANSITIONS_PER_PART", "BatchAssembler", "Part", "decode_columns",
           "encode_columns", "journal_parts", "latest_cursors", "strings_of", "transition_from",
           "transitions_in", "transitions_of"]


class BatchAssembler:
    """Feed decoded journal parts in journal order; get each batch once all its parts are in.

    A batch counts only when its parts arrive whole and in order: leftovers of a batch cut
    short by a crash are dropped (their inputs were never committed, so they are read again),
    and so are parts interrupted by a start-up marker.

    Fencing: every service writes a start-up marker before anything else, and names it as the
    `writer` of each part it writes after. A part counts only when its writer wrote the last
    marker before it; parts of an owner that lost its shard and wrote on (a frozen process
    woken up) land after the new owner's marker and are dropped, by every reader alike.
    Parts without a writer (journal versions before 5) count as before.

    A reader that starts in the middle of a partition (a Spark range) does not know whose
    marker is in force there until it reads one (`settled` is False until then). Parts also
    name their marker's offset (version 6), and the owner in force is the writer whose marker
    is the latest: a fenced writer's marker lies before the marker that fenced it. So until
    the first marker, a part whose marker is later than the one assumed so far names the
    owner in force (and the batches assumed before it were a fenced owner's: see
    `whole_batches`), and a part whose marker is earlier is dropped.
    """

    def __init__(self, reign: str | None = None, settled: bool = True) -> None:
        self._pending: list[Part] = []
        self.reign = reign  # the last marker's nonce: whose parts count
        self.reign_offset: int | None = None  # its journal offset, when known
        self.settled = settled  # the reign was read (a marker, or a checkpoint), not assumed
        self.fenced = 0  # parts dropped for it

    def counts(self, part: Part) -> bool:
        """Whether a part's writer still owned the shard when it was written."""
        writer = part.get("writer")
        return writer is None or self.reign is None or writer == self.reign

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
            self.reign, self.reign_offset = part["marker"], part.get("offset")
            self.settled = True
            return None
        if not self.settled:
            self._assume_from(part)
        if not self.counts(part):
            self.fenced += 1
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

    def _assume_from(self, part: Part) -> None:
        """Before the first marker: a part naming a later marker than the assumed owner's
        shows the owner in force (its marker lies before this reader's start)."""
        at = part.get("writer_offset")
        if at is not None and (self.reign_offset is None or at > self.reign_offset):
            self.reign, self.reign_offset = part["writer"], at
            self._pending = [p for p in self._pending if p.get("writer") == self.reign]


TRANSITIONS_PER_PART: Final = 2000


def latest_cursors(transitions: list[Transition]) -> list[Transition]:
    """The transitions without browser cursors a later one in the same batch moves past
    (a browser fed one message per event would otherwise journal one cursor per message)."""
    seen: set[str | None] = set()
    kept = []
    for t in reversed(transitions):
        if t.kind is Kind.BROWSED:
            if t.sub_id in seen:
                continue
            seen.add(t.sub_id)
        kept.append(t)
    kept.reverse()
    return kept


def journal_parts(transitions: list[Transition], positions: dict[tuple[str, str, int], int],
                  batch: int, writer: str | None, writer_offset: int | None) -> list[bytes]:
    """One batch's journal records: its transitions in parts of TRANSITIONS_PER_PART, its
    input positions on the last part (they count only once the batch is whole)."""
    rows = latest_cursors(transitions)
    chunks = [rows[i:i + TRANSITIONS_PER_PART]
              for i in range(0, len(rows), TRANSITIONS_PER_PART)] or [[]]
    inputs = [{"reader": r, "topic": t, "partition": p, "offset": o}
              for (r, t, p), o in sorted(positions.items())]
    now = now_ms()
    return [wire.encode("journal", {
        "batch": batch, "part": i, "parts": len(chunks), "written_ms": now,
        "marker": None, "writer": writer, "writer_offset": writer_offset,
        "inputs": inputs if i == len(chunks) - 1 else [],
        # the union's branch named: fastavro otherwise validates the whole record against
        # each branch to choose one (a third of writing a part)
        "transitions": [], "columns": ("kq.Columns", encode_columns(chunk)),
    }) for i, chunk in enumerate(chunks)]
