"""The journal's batch rule over offset ranges: read in pieces (as Spark does) or in one go
(as `kq journal dump` and recovery do), the same committed transitions, and never a part of
a batch a crash cut short."""

import random

from hypothesis import given
from hypothesis import strategies as st

from broker import wire
from broker.history.journal import rows_in


def part(batch: int, i: int, n: int, tag: str, marker: str | None = None,
         writer: tuple[str, int] | None = None) -> bytes:
    """One journal record; `writer`: the nonce and offset of its writer's marker."""
    transitions = [] if marker else [{
        "kind": "enqueued", "queue": "Q", "at_ms": batch, "bookmark": f"T/0/{tag}",
        "sub_id": None, "client": None, "delivery_count": 0, "cancel_count": 0,
        "deadline_ms": None, "reason": None, "seq": 0, "timestamp_ms": 0, "max_backlog": 0,
        "filter": None, "priority": None, "barrier": False, "browse": False,
        "principal": None}]
    return wire.encode("journal", {"batch": batch, "part": i, "parts": n, "written_ms": 0,
                                   "marker": marker, "inputs": [], "transitions": transitions,
                                   "writer": writer and writer[0],
                                   "writer_offset": writer and writer[1]})


def journal(seed: int) -> tuple[list[tuple[int, bytes]], set[str]]:
    """A journal of whole batches and crash-cut ones; returns it and the tags committed."""
    rng = random.Random(seed)
    values: list[bytes] = []
    committed: set[str] = set()
    for b in range(30):
        n = rng.randint(1, 3)
        if rng.random() < 0.2:  # a crash after some of its parts, then the restart marker
            values += [part(b, i, n + 1, f"cut{b}.{i}") for i in range(rng.randint(1, n))]
            values.append(part(-1, 0, 0, "", marker=f"m{b}"))
        values += [part(b, i, n, f"{b}.{i}") for i in range(n)]
        committed |= {f"{b}.{i}" for i in range(n)}
    return list(enumerate(values)), committed


def in_pieces(records: list[tuple[int, bytes]], cuts: list[int]) -> list:
    """The rows of the ranges the journal is cut into at `cuts`, read one after another."""
    bounds = sorted({0, len(records), *(c for c in cuts if c < len(records))})
    pieces = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        pieces += rows_in(records[lo:], end=hi)  # a range reads on past its end if it must
    return pieces


def tags(rows) -> list[str]:
    return [r["bookmark"].split("/")[-1] for r in rows]


def test_a_batch_cut_between_its_parts_is_not_shown():
    records = list(enumerate([part(1, 0, 1, "a"), part(2, 0, 3, "b0"), part(2, 1, 3, "b1"),
                              part(-1, 0, 0, "", marker="m"), part(2, 0, 2, "c0"),
                              part(2, 1, 2, "c1"), part(3, 0, 2, "tail")]))
    rows = list(rows_in(records, end=len(records)))
    assert tags(rows) == ["a", "c0", "c1"]  # b was cut by a crash; the tail is not whole yet
    assert [(r["batch"], r["offset"], r["index"]) for r in rows] == [(1, 0, 0), (2, 4, 0),
                                                                      (2, 5, 0)]


@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(0, 120), max_size=6))
def test_ranges_read_apart_give_what_one_reader_gets(seed, cuts):
    records, committed = journal(seed)
    whole = list(rows_in(records, end=len(records)))
    assert set(tags(whole)) == committed
    assert in_pieces(records, cuts) == whole


# -- fencing: ranges that start after a takeover marker they do not see -------------------------

def fenced_journal(seed: int) -> tuple[list[tuple[int, bytes]], set[str]]:
    """Owners taking over one after another; after a takeover the previous owner (woken from
    a freeze) may still write a batch or two, anywhere among the new owner's, which every
    reader must drop. Returns the journal and the tags of the parts that count, by the rule
    itself: a part counts when its writer wrote the last marker before it. (As in a running
    service, the owner in force journals something after a fenced owner's part: the fenced
    owner's batch came from inputs the owner in force reads too.)"""
    rng = random.Random(seed)
    values: list[bytes] = []
    committed: set[str] = set()
    owner: tuple[str, int] | None = None
    batch = 0

    def write(by: tuple[str, int], counts: bool, tag: str) -> None:
        nonlocal batch
        n = rng.randint(1, 3)
        values.extend(part(batch, i, n, f"{tag}{batch}.{i}", writer=by) for i in range(n))
        if counts:
            committed.update(f"{tag}{batch}.{i}" for i in range(n))
        batch += 1

    for k in range(rng.randint(2, 6)):
        before = owner
        owner = (f"m{k}", len(values))
        values.append(part(-1, 0, 0, "", marker=owner[0]))
        for _ in range(rng.randint(2, 25)):
            if before is not None and rng.random() < 0.15:
                write(before, False, "z")  # fenced: after `owner`'s marker
            write(owner, True, "")
    return list(enumerate(values)), committed


def test_a_range_starting_between_a_takeover_and_a_fenced_part_drops_that_part():
    records = list(enumerate([
        part(-1, 0, 0, "", marker="a"), part(0, 0, 1, "a0", writer=("a", 0)),
        part(-1, 0, 0, "", marker="b"),  # b takes over at offset 2
        part(1, 0, 1, "b1", writer=("b", 2)),
        part(1, 0, 1, "a-late", writer=("a", 0)),  # a, woken, writes on: fenced
        part(2, 0, 2, "b2.0", writer=("b", 2)), part(2, 1, 2, "b2.1", writer=("b", 2))]))
    assert tags(rows_in(records, end=len(records))) == ["a0", "b1", "b2.0", "b2.1"]
    assert tags(rows_in(records[4:], end=len(records))) == ["b2.0", "b2.1"]
    # the range holds only the fenced part: what comes after its end tells
    assert tags(rows_in(records[4:], end=5)) == []


@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(0, 150), max_size=6))
def test_ranges_drop_fenced_parts_as_one_reader_does(seed, cuts):
    records, committed = fenced_journal(seed)
    whole = list(rows_in(records, end=len(records)))
    assert set(tags(whole)) == committed
    assert in_pieces(records, cuts) == whole
