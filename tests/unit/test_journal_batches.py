from broker.service.journal import BatchAssembler


def part(batch, i, n, marker=None):
    return {"batch": batch, "part": i, "parts": n, "marker": marker, "transitions": [i]}


def test_whole_batches_only_and_leftovers_of_a_crash_are_dropped():
    a = BatchAssembler()
    assert a.add(part(1, 0, 1)) == [part(1, 0, 1)]
    assert a.add(part(2, 0, 3)) is None
    assert a.add(part(2, 1, 3)) is None
    # crash: batch 2 never finished; after the restart marker, batch 2 is written again
    assert a.add(part(-1, 0, 0, marker="m")) is None
    assert a.add(part(2, 2, 3)) is None  # a stray tail is not a batch
    assert a.add(part(2, 0, 2)) is None
    assert a.add(part(2, 1, 2)) == [part(2, 0, 2), part(2, 1, 2)]
    assert a.add(part(3, 1, 2)) is None  # a batch without its start is dropped


def test_a_batch_journals_only_the_last_cursor_of_each_browser():
    from broker.engine.transitions import Kind, Transition
    from broker.service.journal import latest_cursors
    from broker.values import Bookmark

    def cursor(sub: str, seq: int) -> Transition:
        return Transition(Kind.BROWSED, "Q", 0, sub_id=sub, seq=seq)

    enq = Transition(Kind.ENQUEUED, "Q", 0, Bookmark("T", 0, 1), seq=1)
    batch = [cursor("a", 0), cursor("b", 0), enq, cursor("a", 1)]
    assert latest_cursors(batch) == [cursor("b", 0), enq, cursor("a", 1)]


def sample_transitions():
    from broker.engine.transitions import Kind, Transition
    from broker.values import Bookmark

    return [
        Transition(Kind.ENQUEUED, "ORDERS", 10, Bookmark("ORDERS", 3, 17), seq=5,
                   timestamp_ms=9, priority=2.5, barrier=True, not_before_ms=99, size=120),
        Transition(Kind.ENQUEUED, "SORTED", 10, Bookmark("S", 0, 1), sort_text="ab\x00c"),
        Transition(Kind.RETURNED, "ORDERS", 10, Bookmark("ORDERS", 3, 18), not_before_ms=5),
        Transition(Kind.LEASED, "ORDERS", 11, Bookmark("ORDERS", 3, 17), sub_id="s1",
                   client="wörker", delivery_count=2, deadline_ms=70_011),
        Transition(Kind.SUBSCRIBED, "ORDERS", 12, sub_id="s1", client="wörker", max_backlog=7,
                   filter="/sym = 'IBM'", browse=True, principal="p", seq=-1),
        Transition(Kind.SUBSCRIBED, "ORDERS", 12, sub_id="", client="w\n2", max_backlog=1,
                   filter="/sym IN ('😀', 'a\nb')", seq=-1),
        Transition(Kind.REMOVED, "Q2", 13, Bookmark("T", 0, 2**40), cancel_count=3,
                   reason="max-cancels", priority=-1e300),
    ]


def listed_strings(cols):
    """Columns as versions 2-6 wrote them: the table of strings as an array."""
    from broker.service.journal import strings_of

    cols["strings"] = strings_of(cols)
    del cols["string_offsets"], cols["string_data"]
    return cols


def test_packed_columns_give_back_every_field_of_every_transition():
    from broker import wire
    from broker.service.journal import encode_columns, strings_of, transitions_of

    ts = sample_transitions()
    part = wire.decode("journal", wire.encode("journal", {
        "batch": 1, "part": 0, "parts": 1, "written_ms": 0, "marker": None, "inputs": [],
        "transitions": [], "columns": encode_columns(ts)}))
    rows = transitions_of(part)
    assert len(rows) == len(ts)
    for row, t in zip(rows, ts, strict=True):
        for name, value in row.items():
            expected = getattr(t, name)
            expected = str(expected) if name in ("kind", "bookmark") and expected else expected
            assert value == expected, (name, value, expected)
    table = strings_of(part["columns"])
    assert table.count("ORDERS") == 1  # one table of distinct strings
    assert part["columns"]["strings"] == []  # packed (version 7), not an array of strings


def test_recovery_builds_the_same_transitions_straight_from_the_columns():
    from broker import wire
    from broker.service.journal import encode_columns, transitions_in

    ts = sample_transitions()
    part = wire.decode("journal", wire.encode("journal", {
        "batch": 1, "part": 0, "parts": 1, "written_ms": 0, "marker": None, "inputs": [],
        "transitions": [], "columns": encode_columns(ts)}))
    assert transitions_in(part) == ts


def written_with(version: int, cols) -> bytes:
    """A part with `cols`, as a kq writing journal schema `version` wrote it."""
    import io
    import json

    import fastavro

    from broker import wire

    with open(wire._schema_dir() / "history" / f"journal.{version}.avsc") as f:
        old = fastavro.parse_schema(json.load(f))
    buf = io.BytesIO()
    buf.write(wire.MARKER + wire._fingerprint_of(old))
    fastavro.schemaless_writer(buf, old, {
        "batch": 1, "part": 0, "parts": 1, "written_ms": 0, "marker": None, "inputs": [],
        "transitions": [], "columns": cols})
    return buf.getvalue()


def test_a_part_written_before_the_held_size_and_sort_columns_reads_them_as_null():
    from broker import wire
    from broker.service.journal import encode_columns, transitions_in

    ts = sample_transitions()
    cols = listed_strings(encode_columns(ts))
    for name in ("not_before_ms", "not_before_ms_set", "size", "size_set", "sort_text"):
        del cols[name]
    back = transitions_in(wire.decode("journal", written_with(2, cols)))
    assert [(t.not_before_ms, t.size, t.sort_text) for t in back] == [(None, None, None)] * len(ts)
    assert [t.seq for t in back] == [t.seq for t in ts]


def test_a_part_of_version_6_with_its_strings_listed_reads_the_same():
    from broker import wire
    from broker.service.journal import encode_columns, transitions_in

    ts = sample_transitions()
    cols = listed_strings(encode_columns(ts))
    assert transitions_in(wire.decode("journal", written_with(6, cols))) == ts


def test_transitions_and_other_objects_with_their_fields_pack_alike():
    """Transitions are read field by field (compiled: directly); any other object with the
    same attributes (the pipeline's benchmark writes such) by name: the same columns."""
    from types import SimpleNamespace

    from broker.service.journal import COLUMNS, encode_columns

    ts = sample_transitions()
    alike = [SimpleNamespace(**{name: getattr(t, name) for name, _ in COLUMNS}) for t in ts]
    assert encode_columns(ts) == encode_columns(alike)
