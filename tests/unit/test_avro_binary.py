"""The commands, delivery envelopes and journal parts kq writes and reads in Avro itself
(broker.avro_binary, through broker.wire) are byte for byte what fastavro writes for the same
records with the documented schemas, and read as fastavro reads them."""

import io

import fastavro
from hypothesis import given
from hypothesis import strategies as st

from broker import avro_binary as avro
from broker import wire
from broker.engine.transitions import Kind, Transition
from broker.packed import delivery_batch
from broker.service import journal
from broker.service.envelopes import _Pack
from broker.values import Bookmark

names = st.text(min_size=0, max_size=12)  # (any text: queue and client names are checked
int64 = st.integers(-(2**63), 2**63 - 1)  # elsewhere; the encoding must hold for all)


def fastavro_bytes(schema, value) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    return buf.getvalue()


def fastavro_write(name, record) -> bytes:
    buf = io.BytesIO()
    buf.write(wire.header(name))
    fastavro.schemaless_writer(buf, wire.schema(name), record)
    return buf.getvalue()


def fastavro_read(name, data: bytes):
    return fastavro.schemaless_reader(io.BytesIO(data[len(wire.header(name)):]),
                                      wire.schema(name), None)


@given(int64)
def test_a_long_is_avros(n):
    assert avro.long_(n) == fastavro_bytes("long", n)


@given(names, st.binary(max_size=300))
def test_strings_and_bytes_are_avros(text, data):
    assert avro.string(text) == fastavro_bytes("string", text)
    assert avro.bytes_(data) == fastavro_bytes("bytes", data)


deliveries = st.lists(st.tuples(names, st.integers(0, 2**31 - 1), st.integers(0, 2**62),
                                st.integers(0, 2**62), st.booleans(), st.binary(max_size=300)),
                      min_size=1, max_size=40)


@given(names, names, st.sampled_from(["json", "bytes", "text"]), deliveries)
def test_a_messages_envelope_is_what_fastavro_writes(sub_id, queue, fmt, items):
    pack = _Pack()
    for bm, count, deadline, seq, barrier, payload in items:
        pack.bookmarks.append(bm)
        pack.delivery_counts.append(count)
        pack.lease_deadlines.append(deadline)
        pack.seqs.append(seq)
        pack.barriers.append(barrier)
        pack.payloads.append(payload)
    batch = delivery_batch(pack.bookmarks, pack.delivery_counts, pack.lease_deadlines,
                           pack.seqs, pack.barriers, pack.payloads)
    expected = fastavro_write("envelope", {"kind": "messages", "sub_id": sub_id,
                                           "queue": queue, "format": fmt,
                                           "batch": ("kq.DeliveryBatch", batch)})
    assert pack.encode(sub_id, queue, fmt) == expected
    assert wire.decode("envelope", expected)["batch"]["count"] == len(items)


transitions = st.lists(st.builds(
    Transition, st.sampled_from([Kind.ENQUEUED, Kind.LEASED, Kind.ACKED, Kind.SUBSCRIBED]),
    names, int64, st.one_of(st.none(), st.builds(Bookmark, names, st.integers(0, 9),
                                                 st.integers(0, 2**40))),
    sub_id=st.one_of(st.none(), names), client=st.one_of(st.none(), names),
    delivery_count=st.integers(0, 100), deadline_ms=st.one_of(st.none(), int64),
    seq=st.integers(0, 2**40), priority=st.one_of(st.none(), st.floats(allow_nan=False)),
    browse=st.booleans()), max_size=12)
positions = st.dictionaries(st.tuples(names, names, st.integers(0, 99)), st.integers(0, 2**40),
                            max_size=4)


def expected_parts(rows, inputs, batch, writer, offset, written_ms):
    """What fastavro writes for `journal_parts`' arguments (parts of TRANSITIONS_PER_PART)."""
    per_part = journal.TRANSITIONS_PER_PART
    kept = journal.latest_cursors(rows)
    chunks = [kept[i:i + per_part] for i in range(0, len(kept), per_part)] or [[]]
    listed = [{"reader": r, "topic": t, "partition": p, "offset": o}
              for (r, t, p), o in sorted(inputs.items())]
    return [fastavro_write("journal", {
        "batch": batch, "part": i, "parts": len(chunks), "written_ms": written_ms,
        "marker": None, "writer": writer, "writer_offset": offset,
        "inputs": listed if i == len(chunks) - 1 else [], "transitions": [],
        "columns": ("kq.Columns", journal.encode_columns(chunk))})
        for i, chunk in enumerate(chunks)]


# (nothing patched: compiled, the module's constants and functions are bound at build time)
@given(transitions, positions, st.integers(0, 2**40), st.one_of(st.none(), names),
       st.one_of(st.none(), int64))
def test_journal_parts_are_what_fastavro_writes(rows, inputs, batch, writer, offset):
    parts = journal.journal_parts(rows, inputs, batch, writer, offset)
    written_ms = wire.decode("journal", parts[0])["written_ms"]
    assert parts == expected_parts(rows, inputs, batch, writer, offset, written_ms)


def test_a_batch_of_several_journal_parts_is_what_fastavro_writes():
    n = 2 * journal.TRANSITIONS_PER_PART + 1
    rows = [Transition(Kind.ENQUEUED, "Q", 5, bookmark=Bookmark("T", 0, i), seq=i)
            for i in range(n)]
    parts = journal.journal_parts(rows, {("Q", "T", 0): n}, 7, "instance-a", 42)
    written_ms = wire.decode("journal", parts[0])["written_ms"]
    assert len(parts) == 3
    assert parts == expected_parts(rows, {("Q", "T", 0): n}, 7, "instance-a", 42, written_ms)


def records_of(schema):
    """Any record `schema` allows (every field, each of its kinds, nested records too)."""
    def of(t):
        nullable = isinstance(t, list)
        t = t[1] if nullable else t
        base = {"string": names, "bytes": st.binary(max_size=40), "long": int64,
                "int": st.integers(-(2**31), 2**31 - 1),
                "boolean": st.booleans(),
                "double": st.floats(allow_nan=False)}.get(t) if isinstance(t, str) else None
        if base is None and t["type"] == "enum":
            base = st.sampled_from(t["symbols"])
        elif base is None and t["type"] == "record":
            base = records_of(t)
        elif base is None:  # an array
            base = st.lists(of(t["items"]), max_size=4)
        return st.one_of(st.none(), base) if nullable else base
    return st.fixed_dictionaries({f["name"]: of(f["type"]) for f in schema["fields"]})


RECORDS = st.sampled_from(["command", "envelope", "journal"]).flatmap(
    lambda name: st.tuples(st.just(name), records_of(wire.schema(name))))


@given(RECORDS)
def test_commands_envelopes_and_journal_parts_are_written_and_read_as_fastavro_does(named):
    name, record = named
    data = wire.encode(name, record)
    assert data == fastavro_write(name, record)
    assert wire.decode(name, data) == record == fastavro_read(name, data)


@given(RECORDS, st.data())
def test_a_damaged_record_is_refused_or_read_as_fastavro_reads_it(named, data):
    name, record = named
    good = wire.encode(name, record)
    head = len(wire.header(name))
    cut = data.draw(st.integers(head, len(good)))
    bad = good[:cut] + data.draw(st.binary(max_size=30))
    try:
        mine = wire.decode(name, bad)
    except ValueError as exc:
        assert str(exc).startswith(f"not a valid {name} record")
    else:
        assert mine == fastavro_read(name, bad)


def test_a_command_missing_a_field_without_a_default_is_not_written():
    import pytest

    with pytest.raises(ValueError, match="client"):
        wire.encode("command", {"type": "ack"})
    with pytest.raises(ValueError, match="not one of its symbols"):
        wire.encode("command", {"type": "dance", "client": "c"})
