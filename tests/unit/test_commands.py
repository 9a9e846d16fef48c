"""Ack commands as the service reads them: packed by clients since command schema 4, as
arrays by older clients; both mean the same acks, and a malformed one is refused."""

from __future__ import annotations

import itertools

import pytest

from broker import wire
from broker.client.core import ClientCore
from broker.client.message import Message
from broker.engine import events as ev
from broker.packed import pack_array
from broker.service.commands import Invalid, decode_command
from broker.values import Bookmark

BOOKMARKS = ["T/0/7", "T/1/3", "my.topic-x/2/1000000000000"]
COUNTS = [1, 2, 1]
EXPECTED = ev.Acked("w", "Q", tuple(Bookmark.parse(b) for b in BOOKMARKS), "", None,
                    tuple(COUNTS))


def _command(**fields: object) -> bytes:
    return wire.encode("command", {"type": "ack", "client": "w", "request_id": "",
                                   "queue": "Q", **fields})


def test_a_clients_batched_acks_reach_the_service_as_they_were_acked():
    core = ClientCore("w", "")
    for bm, n in zip(BOOKMARKS, COUNTS, strict=True):
        core.ack(Message("Q", bm, None, None, [], n, None, False, 0, None))
    (record,) = core.take_acks()
    assert decode_command(record.value) == [EXPECTED]
    assert not wire.decode("command", record.value)["bookmarks"]  # sent packed


def test_acks_of_a_client_before_packing_mean_the_same():
    old = _command(bookmarks=BOOKMARKS, delivery_counts=COUNTS)
    assert decode_command(old) == [EXPECTED]


@pytest.mark.parametrize(("counts", "why"), [
    (pack_array("i", [1, 2]), "2 delivery counts for 3 bookmarks"),
    (b"\x01\x00\x00", "bad ack command"),  # not a whole number of int32
])
def test_packed_acks_whose_counts_do_not_fit_are_refused(counts, why):
    (out,) = decode_command(_command(packed_bookmarks="\n".join(BOOKMARKS),
                                     packed_counts=counts))
    assert isinstance(out, Invalid) and why in out.message and out.client == "w"


def test_a_packed_bookmark_that_is_not_one_is_refused():
    (out,) = decode_command(_command(packed_bookmarks="T/0/1\nnot-a-bookmark",
                                     packed_counts=pack_array("i", [1, 1])))
    assert isinstance(out, Invalid) and "bad ack command" in out.message


# texts that are bookmarks or nearly: a topic with a slash, partitions alike as numbers,
# offsets that int() takes but a bookmark does not
_TEXTS = ["/".join(parts) for parts in itertools.product(
    ["T", "T/0"], ["0", "1", "00"], ["7", "12", "", "²", "1a", "1_0", " 1"])] + [
    "T", "T/", "T/7", "/0/1", "T/0/1/", "no"]


def test_many_bookmarks_parse_as_each_alone():
    """An ack command's bookmarks are parsed together, each topic and partition once per
    run of them: the same bookmarks as one by one, and the same refusal of a bad one, for
    every pair and every run of three of these texts."""
    def alone(text):
        try:
            return Bookmark.parse(text)
        except ValueError:
            return None

    for texts in itertools.chain(itertools.product(_TEXTS, repeat=2),
                                 itertools.product(_TEXTS[:21], repeat=3)):
        each = [alone(t) for t in texts]
        if None in each:
            with pytest.raises(ValueError):
                Bookmark.parse_many(list(texts))
        else:
            many = Bookmark.parse_many(list(texts))
            assert [(b.topic, b.partition, b.offset, str(b)) for b in many] == \
                [(b.topic, b.partition, b.offset, str(b)) for b in each], texts


def test_acks_written_with_the_command_schema_before_packing_are_read():
    """What a client of command schema 3 sends: its schema's fingerprint, arrays."""
    import io
    import json

    import fastavro

    old = fastavro.parse_schema(json.loads(
        (wire._schema_dir() / "history" / "command.3.avsc").read_text()))
    buf = io.BytesIO()
    buf.write(wire.MARKER + wire._fingerprint_of(old))
    fastavro.schemaless_writer(buf, old, {
        "type": "ack", "client": "w", "request_id": "", "queue": "Q", "sub_id": None,
        "max_backlog": None, "filter": None, "mode": None, "bookmarks": BOOKMARKS,
        "query": None, "principal": None, "replay_period_ms": None, "delay_ms": None,
        "delivery_counts": COUNTS, "period_ms": None, "sent_ms": 0})
    assert decode_command(buf.getvalue()) == [EXPECTED]


@pytest.mark.parametrize(("fields", "why"), [
    ({"type": "subscribe", "sub_id": "s", "max_backlog": 2**31}, "max_backlog must be <="),
    ({"type": "subscribe", "sub_id": "s", "mode": "browse", "replay_period_ms": 2**62},
     "longer than a hundred years"),
    ({"type": "extend", "bookmarks": ["T/0/1"], "period_ms": 2**62}, "at most a hundred"),
    ({"type": "cancel", "bookmarks": ["T/0/1"], "delay_ms": 2**62}, "at most a hundred"),
])
def test_values_past_what_the_journal_holds_are_refused_not_carried_in(fields, why):
    """A max_backlog past int32, or a period or delay whose deadline passes int64 ms, went
    into the engine and then into the journal's packing, which raised struct.error inside
    `kq serve`: it stopped, and stopped again at every restart on reading the command."""
    (out,) = decode_command(_command(**fields))
    assert isinstance(out, Invalid) and why in out.message and out.client == "w"


def test_the_largest_values_a_command_may_ask_pack_into_a_journal_part():
    from broker.engine.transitions import Kind, Transition
    from broker.service.journal import encode_columns
    from broker.values import MAX_BACKLOG, MAX_PERIOD_MS
    t = Transition(Kind.LEASED, "Q", 0, Bookmark.parse("T/0/1"), max_backlog=MAX_BACKLOG,
                   deadline_ms=4_102_444_800_000 + MAX_PERIOD_MS)  # leased in 2100
    assert encode_columns([t])["count"] == 1
