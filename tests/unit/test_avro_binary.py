"""The envelopes and journal parts kq lays out in Avro itself are byte for byte what fastavro
writes for the same records with the documented schemas (so every reader reads them)."""

import io
from unittest import mock

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


@given(int64)
def test_a_long_is_avros(n):
    assert avro.long_(n) == fastavro_bytes("long", n)


@given(names, st.one_of(st.none(), names), st.one_of(st.none(), int64))
def test_strings_and_unions_are_avros(text, maybe_text, maybe_long):
    assert avro.string(text) == fastavro_bytes("string", text)
    assert avro.optional_string(maybe_text) == fastavro_bytes(["null", "string"], maybe_text)
    assert avro.optional_long(maybe_long) == fastavro_bytes(["null", "long"], maybe_long)


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
    expected = wire.encode("envelope", {"kind": "messages", "sub_id": sub_id, "queue": queue,
                                        "format": fmt, "batch": ("kq.DeliveryBatch", batch)})
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


@given(transitions, positions, st.integers(0, 2**40), st.one_of(st.none(), names),
       st.one_of(st.none(), int64), st.integers(1, 5))
def test_journal_parts_are_what_fastavro_writes(rows, inputs, batch, writer, offset, per_part):
    with mock.patch.object(journal, "TRANSITIONS_PER_PART", per_part), \
            mock.patch.object(journal, "now_ms", lambda: 1_700_000_000_000):
        parts = journal.journal_parts(rows, inputs, batch, writer, offset)
    kept = journal.latest_cursors(rows)
    chunks = [kept[i:i + per_part] for i in range(0, len(kept), per_part)] or [[]]
    listed = [{"reader": r, "topic": t, "partition": p, "offset": o}
              for (r, t, p), o in sorted(inputs.items())]
    assert parts == [wire.encode("journal", {
        "batch": batch, "part": i, "parts": len(chunks), "written_ms": 1_700_000_000_000,
        "marker": None, "writer": writer, "writer_offset": offset,
        "inputs": listed if i == len(chunks) - 1 else [], "transitions": [],
        "columns": ("kq.Columns", journal.encode_columns(chunk))})
        for i, chunk in enumerate(chunks)]


def _command_records():
    """Any record the command schema allows (every field, each of its kinds)."""
    def of(t):
        nullable = isinstance(t, list)
        t = t[1] if nullable else t
        base = {"string": names, "bytes": st.binary(max_size=40), "long": int64,
                "int": st.integers(-(2**31), 2**31 - 1)}.get(t) if isinstance(t, str) else None
        if base is None and t["type"] == "enum":
            base = st.sampled_from(t["symbols"])
        elif base is None:  # an array
            base = st.lists(names if t["items"] == "string" else int64, max_size=5)
        return st.one_of(st.none(), base) if nullable else base
    return st.fixed_dictionaries({f["name"]: of(f["type"])
                                  for f in wire.schema("command")["fields"]})


def fastavro_command(record) -> bytes:
    buf = io.BytesIO()
    buf.write(wire.header("command"))
    fastavro.schemaless_writer(buf, wire.schema("command"), record)
    return buf.getvalue()


def fastavro_read_command(data: bytes):
    return fastavro.schemaless_reader(io.BytesIO(data[len(wire.header("command")):]),
                                      wire.schema("command"), None)


@given(_command_records())
def test_a_command_is_written_and_read_as_fastavro_does(record):
    data = wire.encode("command", record)
    assert data == fastavro_command(record)
    assert wire.decode("command", data) == record == fastavro_read_command(data)


@given(_command_records(), st.data())
def test_a_damaged_command_is_refused_or_read_as_fastavro_reads_it(record, data):
    good = wire.encode("command", record)
    head = len(wire.header("command"))
    cut = data.draw(st.integers(head, len(good)))
    bad = good[:cut] + data.draw(st.binary(max_size=30))
    try:
        mine = wire.decode("command", bad)
    except ValueError as exc:
        assert str(exc).startswith("not a valid command record")
    else:
        assert mine == fastavro_read_command(bad)


def test_a_command_missing_a_field_without_a_default_is_not_written():
    import pytest

    with pytest.raises(ValueError, match="client"):
        wire.encode("command", {"type": "ack"})
    with pytest.raises(ValueError, match="not one of its symbols"):
        wire.encode("command", {"type": "dance", "client": "c"})
