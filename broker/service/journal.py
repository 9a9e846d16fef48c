"""The journal's records: a batch written as parts, and parts read back into whole batches
(or dropped)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise
from operator import attrgetter, itemgetter
from typing import Any, Final

from broker import wire
from broker.engine.transitions import Kind, Transition
from broker.packed import pack_array, unpack_array
from broker.values import Bookmark, now_ms

Part = dict[str, Any]


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


# -- the columns of a journal part (journal schema version 2) --------------------------------
# A part carries its transitions column by column, each column packed into bytes, little
# endian: string columns as int32 indexes into the part's table of distinct strings (-1 for
# NULL), integers as int32 / int64, booleans as one byte, nullable numbers as values plus a
# byte per row saying whether it is set. Packing and unpacking are C loops (`array`), not a
# Python step per field, and a reader can hand the buffers to Arrow as they are. Parts of
# version 1 list the transitions as records under "transitions" and are read as before.
COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("kind", "str"), ("queue", "str"), ("at_ms", "int64"), ("bookmark", "str"),
    ("sub_id", "str"), ("client", "str"), ("delivery_count", "int32"),
    ("cancel_count", "int32"), ("deadline_ms", "int64?"), ("reason", "str"), ("seq", "int64"),
    ("timestamp_ms", "int64"), ("max_backlog", "int32"), ("filter", "str"),
    ("priority", "double?"), ("barrier", "bool"), ("browse", "bool"), ("principal", "str"),
    # (added later: empty in older parts, read as all NULL)
    ("not_before_ms", "int64?"), ("size", "int64?"), ("sort_text", "str"), ("group", "str"))
_CODE: Final = {"str": "i", "int32": "i", "int64": "q", "int64?": "q", "double?": "d"}


_ROW: Final = attrgetter(*(name for name, _ in COLUMNS))  # one C call per row, not one per field
_NULL_INDEX: Final = pack_array("i", [-1])


def encode_columns(rows: Sequence[Any]) -> dict[str, Any]:
    """Objects with the transition fields as attributes (enums and bookmarks as str) ->
    the `columns` record of a journal part."""
    n = len(rows)
    table: dict[str, int] = {}
    out: dict[str, Any] = {"count": n}
    columns: Any
    if all(isinstance(r, Transition) for r in rows):
        columns = _transition_columns(rows if isinstance(rows, list) else list(rows))
    else:
        columns = zip(*map(_ROW, rows), strict=True) if n else iter([()] * len(COLUMNS))
    for (name, kind), values in zip(COLUMNS, columns, strict=True):
        # most columns are empty for most kinds of transition; one whose first row is set
        # is not looked through (comparing each value with None costs)
        empty = n > 0 and values[0] is None and values.count(None) == n
        if kind == "str" and empty:
            out[name] = _NULL_INDEX * n
        elif name == "bookmark":  # one per row, mostly: each looked up once
            out[name] = pack_array("i", [
                -1 if v is None else table.setdefault(str(v), len(table)) for v in values])
        elif kind == "str":  # a few distinct values (kinds, queues, clients): each turned
            # into a string and looked up once, then the column read through them in C
            index = {v: -1 if v is None else table.setdefault(str(v), len(table))
                     for v in dict.fromkeys(values)}
            if len(index) <= 1:  # (the queue, in most batches; or no rows)
                out[name] = pack_array("i", list(index.values())) * n
            else:  # (two keys or more: itemgetter of one gives the value, not a tuple)
                out[name] = pack_array("i", itemgetter(*values)(index))
        elif kind == "bool":
            out[name] = bytes(map(bool, values)) if True in values else bytes(n)
        elif kind.endswith("?"):
            if empty:
                out[name], out[f"{name}_set"] = bytes(8 * n), bytes(n)
            else:
                out[name] = pack_array(_CODE[kind], [0 if v is None else v for v in values])
                out[f"{name}_set"] = bytes(0 if v is None else 1 for v in values)
        elif n > 0 and values.count(values[0]) == n:  # one value throughout (most columns
            out[name] = pack_array(_CODE[kind], values[:1]) * n  # of most batches): packed once
        else:
            out[name] = pack_array(_CODE[kind], values)
    # the table packed (version 7): fastavro writes an array of strings one item at a time
    encoded = [text.encode() for text in table]
    out["strings"] = []
    out["string_offsets"] = pack_array("i", accumulate(map(len, encoded), initial=0))
    out["string_data"] = b"".join(encoded)
    return out


def strings_of(cols: dict[str, Any]) -> list[str]:
    """A part's table of distinct strings, packed (version 7) or listed (before)."""
    if not cols.get("string_offsets"):
        return list(cols["strings"])
    data = cols["string_data"]
    ends = unpack_array("i", cols["string_offsets"])
    return [data[start:end].decode() for start, end in pairwise(ends)]


def _transition_columns(rows: list[Transition]) -> list[list[Any]]:
    """The columns of COLUMNS, in its order, read from Transitions: compiled, each field is
    read directly, where `_ROW` looks each one up by name, and each column is made at its
    full length from a list (appended item by item from any other sequence)."""
    return [
        [t.kind for t in rows], [t.queue for t in rows], [t.at_ms for t in rows],
        [t.bookmark for t in rows], [t.sub_id for t in rows], [t.client for t in rows],
        [t.delivery_count for t in rows], [t.cancel_count for t in rows],
        [t.deadline_ms for t in rows], [t.reason for t in rows], [t.seq for t in rows],
        [t.timestamp_ms for t in rows], [t.max_backlog for t in rows],
        [t.filter for t in rows], [t.priority for t in rows], [t.barrier for t in rows],
        [t.browse for t in rows], [t.principal for t in rows], [t.not_before_ms for t in rows],
        [t.size for t in rows], [t.sort_text for t in rows], [t.group for t in rows]]


def decode_columns(cols: dict[str, Any]) -> list[dict[str, Any]]:
    """The `columns` record of a journal part -> one dict per transition (as version 1)."""
    strings = strings_of(cols)
    values: list[list[Any]] = []
    for name, kind in COLUMNS:
        if not cols[name] and cols["count"]:  # a column added later: all NULL
            values.append([None] * cols["count"])
        elif kind == "str":
            values.append([None if i < 0 else strings[i] for i in unpack_array("i", cols[name])])
        elif kind == "bool":
            values.append([b == 1 for b in cols[name]])
        elif kind.endswith("?"):
            values.append(_nullable(cols, name, _CODE[kind]))
        else:
            values.append(list(unpack_array(_CODE[kind], cols[name])))
    names = [name for name, _ in COLUMNS]
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


def _nullable(cols: dict[str, Any], name: str, code: str) -> list[Any]:
    """A nullable number column; all NULL in a part written before the column existed."""
    if not cols[name] and cols["count"]:
        return [None] * cols["count"]
    return [v if s else None for v, s in zip(unpack_array(code, cols[name]),
                                             cols[f"{name}_set"], strict=True)]


def transitions_of(part: Part) -> list[dict[str, Any]]:
    """A part's transitions as dicts, whichever version wrote it."""
    cols = part.get("columns")
    return decode_columns(cols) if cols else part["transitions"]


def transition_from(r: dict[str, Any]) -> Transition:
    """One transition as `transitions_of` lists it."""
    return Transition(
        kind=Kind(r["kind"]), queue=r["queue"], at_ms=r["at_ms"],
        bookmark=Bookmark.parse(r["bookmark"]) if r["bookmark"] else None,
        sub_id=r["sub_id"], client=r["client"], delivery_count=r["delivery_count"],
        cancel_count=r["cancel_count"], deadline_ms=r["deadline_ms"], reason=r["reason"],
        seq=r["seq"], timestamp_ms=r["timestamp_ms"], max_backlog=r["max_backlog"],
        filter=r["filter"], priority=r["priority"], barrier=r["barrier"], browse=r["browse"],
        principal=r["principal"], not_before_ms=r.get("not_before_ms"), size=r.get("size"),
        sort_text=r.get("sort_text"), group=r.get("group"),
    )


def transitions_in(part: Part) -> list[Transition]:
    """A part's transitions, built straight from its columns (recovery replays millions):
    each distinct string of the part is turned into a kind or a bookmark once."""
    cols = part.get("columns")
    if not cols:
        return [transition_from(r) for r in part["transitions"]]
    strings = strings_of(cols)
    kinds = [Kind(strings[i]) for i in unpack_array("i", cols["kind"])]
    text = [None if i < 0 else strings[i] for i in range(-1, len(strings))]
    marks: dict[int, Bookmark | None] = {-1: None}

    def bookmark(i: int) -> Bookmark | None:
        bm = marks.get(i)
        if bm is None and i >= 0:
            bm = marks[i] = Bookmark.parse(strings[i])
        return bm

    def strs(name: str) -> list[str | None]:
        if not cols[name] and cols["count"]:  # a column added later: all NULL
            return [None] * cols["count"]
        return [text[i + 1] for i in unpack_array("i", cols[name])]

    rows = zip(kinds, strs("queue"), unpack_array("q", cols["at_ms"]),
               [bookmark(i) for i in unpack_array("i", cols["bookmark"])], strs("sub_id"),
               strs("client"), unpack_array("i", cols["delivery_count"]),
               unpack_array("i", cols["cancel_count"]), _nullable(cols, "deadline_ms", "q"),
               strs("reason"), unpack_array("q", cols["seq"]),
               unpack_array("q", cols["timestamp_ms"]), unpack_array("i", cols["max_backlog"]),
               strs("filter"), _nullable(cols, "priority", "d"), [b == 1 for b in cols["barrier"]],
               [b == 1 for b in cols["browse"]], strs("principal"),
               _nullable(cols, "not_before_ms", "q"), _nullable(cols, "size", "q"),
               strs("sort_text"), strs("group"), strict=True)
    return [Transition(*row) for row in rows]  # type: ignore[arg-type]


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
