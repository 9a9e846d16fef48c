"""The columns of a journal part (journal schema version 2 and later): a batch's transitions
packed column by column, and read back."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise
from operator import attrgetter, itemgetter
from typing import Any, Final

from broker.engine.transitions import Kind, Transition
from broker.packed import pack_array, unpack_array
from broker.values import Bookmark

Part = dict[str, Any]


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
        if values is None:  # no row sets it: every one at its default
            _default_column(out, name, kind, n)
            continue
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


def _default_column(out: dict[str, Any], name: str, kind: str, n: int) -> None:
    """A column whose `n` rows all hold their default: NULL, 0 or False."""
    if kind == "str":
        out[name] = _NULL_INDEX * n
    elif kind == "bool":
        out[name] = bytes(n)
    elif kind.endswith("?"):
        out[name], out[f"{name}_set"] = bytes(8 * n), bytes(n)
    else:
        out[name] = bytes(n * (8 if _CODE[kind] == "q" else 4))


def strings_of(cols: dict[str, Any]) -> list[str]:
    """A part's table of distinct strings, packed (version 7) or listed (before)."""
    if not cols.get("string_offsets"):
        return list(cols["strings"])
    data = cols["string_data"]
    ends = unpack_array("i", cols["string_offsets"])
    return [data[start:end].decode() for start, end in pairwise(ends)]


def _transition_columns(rows: list[Transition]) -> list[list[Any] | None]:
    """The columns of COLUMNS, in its order, read from Transitions: compiled, each field is
    read directly, where `_ROW` looks each one up by name, and each column is made at its
    full length from a list (appended item by item from any other sequence). A column no
    row sets (most of them, for most kinds: an ack sets five) is None, not made."""
    have = _set_columns(rows)
    return [
        [t.kind for t in rows], [t.queue for t in rows], [t.at_ms for t in rows],
        [t.bookmark for t in rows] if have & _BOOKMARK else None,
        [t.sub_id for t in rows] if have & _SUB_ID else None,
        [t.client for t in rows] if have & _CLIENT else None,
        [t.delivery_count for t in rows] if have & _DELIVERY_COUNT else None,
        [t.cancel_count for t in rows] if have & _CANCEL_COUNT else None,
        [t.deadline_ms for t in rows] if have & _DEADLINE_MS else None,
        [t.reason for t in rows] if have & _REASON else None,
        [t.seq for t in rows] if have & _SEQ else None,
        [t.timestamp_ms for t in rows] if have & _TIMESTAMP_MS else None,
        [t.max_backlog for t in rows] if have & _MAX_BACKLOG else None,
        [t.filter for t in rows] if have & _FILTER else None,
        [t.priority for t in rows] if have & _PRIORITY else None,
        [t.barrier for t in rows] if have & _BARRIER else None,
        [t.browse for t in rows] if have & _BROWSE else None,
        [t.principal for t in rows] if have & _PRINCIPAL else None,
        [t.not_before_ms for t in rows] if have & _NOT_BEFORE_MS else None,
        [t.size for t in rows] if have & _SIZE else None,
        [t.sort_text for t in rows] if have & _SORT_TEXT else None,
        [t.group for t in rows] if have & _GROUP else None]


# One bit per column a transition may leave at its default (None, 0, False); constants,
# so that the compiled build tests them as numbers
_BOOKMARK: Final = 1
_SUB_ID: Final = 2
_CLIENT: Final = 4
_DELIVERY_COUNT: Final = 8
_CANCEL_COUNT: Final = 16
_DEADLINE_MS: Final = 32
_REASON: Final = 64
_SEQ: Final = 128
_TIMESTAMP_MS: Final = 256
_MAX_BACKLOG: Final = 512
_FILTER: Final = 1024
_PRIORITY: Final = 2048
_BARRIER: Final = 4096
_BROWSE: Final = 8192
_PRINCIPAL: Final = 16384
_NOT_BEFORE_MS: Final = 32768
_SIZE: Final = 65536
_SORT_TEXT: Final = 131072
_GROUP: Final = 262144
_ALL: Final = 524287


def _set_columns(rows: list[Transition]) -> int:
    """The bits of the columns some row sets: one pass of comparisons (compiled, no object
    made), where making a column is a list of boxed values."""
    have = 0
    for t in rows:
        if t.bookmark is not None:
            have |= _BOOKMARK
        if t.sub_id is not None:
            have |= _SUB_ID
        if t.client is not None:
            have |= _CLIENT
        if t.delivery_count != 0:
            have |= _DELIVERY_COUNT
        if t.cancel_count != 0:
            have |= _CANCEL_COUNT
        if t.deadline_ms is not None:
            have |= _DEADLINE_MS
        if t.reason is not None:
            have |= _REASON
        if t.seq != 0:
            have |= _SEQ
        if t.timestamp_ms != 0:
            have |= _TIMESTAMP_MS
        if t.max_backlog != 0:
            have |= _MAX_BACKLOG
        if t.filter is not None:
            have |= _FILTER
        if t.priority is not None:
            have |= _PRIORITY
        if t.barrier:
            have |= _BARRIER
        if t.browse:
            have |= _BROWSE
        if t.principal is not None:
            have |= _PRINCIPAL
        if t.not_before_ms is not None:
            have |= _NOT_BEFORE_MS
        if t.size is not None:
            have |= _SIZE
        if t.sort_text is not None:
            have |= _SORT_TEXT
        if t.group is not None:
            have |= _GROUP
        if have == _ALL:
            break
    return have


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
