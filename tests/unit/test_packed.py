"""The packed layouts of the hot path: stored payloads, stored messages and delivery
envelopes read back exactly, records of earlier versions still read, and an envelope never
outgrows the record size limit."""

import pytest

from broker import wire
from broker.client.message import unpack_deliveries
from broker.engine.queue import Message
from broker.engine.states import MessageState
from broker.packed import unpack_payload
from broker.service.envelopes import Envelopes
from broker.state.layout import (
    Payload,
    decode_message,
    encode_message,
    load_packed_payload,
    payload_key,
)
from broker.state.store import MemoryStore
from broker.values import Bookmark

BM = Bookmark("ORDERS", 2, 41)


@pytest.mark.parametrize("payload", [
    Payload(None, None, [], 0),
    Payload(b"k", b'{"a": 1}', [], 1_700_000_000_123),
    Payload(b"", b"", [("kq-priority", b"7"), ("empty", None), ("naïve", b"\x00\xff")], -5),
    Payload(b"k" * 70_000, b"v" * 300, [("n" * 300, b"z" * 66_000)], 2**62),  # every byte used
    Payload(None, b"x", [], -(2**62)),
])
def test_a_stored_payload_reads_back_as_written(payload):
    assert Payload.decode(payload.encode()) == payload


def test_a_payload_cut_short_in_its_head_is_refused():
    """(the client drops such an envelope on IndexError; the numbers are read byte by byte)"""
    with pytest.raises(IndexError):
        unpack_payload(Payload(b"k", b"v", [("h", b"1")], 9).encode()[:15])


def test_a_payload_stored_by_an_earlier_kq_as_avro_is_still_read():
    old = wire.encode("stored_payload", {"key": b"k", "value": b"v", "timestamp_ms": 9,
                                         "headers": [{"key": "h", "value": None}]})
    assert Payload.decode(old) == Payload(b"k", b"v", [("h", None)], 9)


def test_a_payload_goes_into_envelopes_packed_whichever_kq_stored_it():
    """Deliveries pass stored bytes on as they are; an Avro one of an earlier kq is packed."""
    store = MemoryStore()
    packed = Payload(b"k", b"v", [("h", None)], 9).encode()
    store.write({payload_key(BM): packed}, ())
    assert load_packed_payload(store, BM) == packed
    store.write({payload_key(BM): wire.encode("stored_payload", {
        "key": b"k", "value": b"v", "timestamp_ms": 9,
        "headers": [{"key": "h", "value": None}]})}, ())
    assert load_packed_payload(store, BM) == packed
    assert load_packed_payload(store, Bookmark("ORDERS", 2, 42)) is None


def test_a_stored_message_reads_back_as_written():
    msg = Message(BM, 7, 1234, MessageState.LEASED, 3, 1, "sub-é", 99_000)
    msg.priority, msg.is_barrier = 0.0, True
    back = decode_message(BM, encode_message(msg))
    assert (back.seq, back.timestamp_ms, back.state, back.delivery_count, back.cancel_count,
            back.holder, back.deadline_ms, back.priority, back.is_barrier) == (
        7, 1234, MessageState.LEASED, 3, 1, "sub-é", 99_000, 0.0, True)
    plain = decode_message(BM, encode_message(Message(BM, 1, 2)))
    assert (plain.holder, plain.deadline_ms, plain.priority, plain.is_barrier) == (
        None, None, None, False)


def test_a_message_stored_by_an_earlier_kq_as_avro_is_still_read():
    old = wire.encode("stored_message", {
        "seq": 4, "timestamp_ms": 5, "state": "leased", "delivery_count": 2,
        "cancel_count": 0, "holder": "s1", "deadline_ms": 77, "priority": 1.5,
        "barrier": False})
    back = decode_message(BM, old)
    assert (back.seq, back.state, back.holder, back.deadline_ms, back.priority) == (
        4, MessageState.LEASED, "s1", 77, 1.5)


def deliveries_in(records):
    out = []
    for r in records:
        env = wire.decode("envelope", r.value)
        assert env["kind"] == "messages"
        out.append([(env["sub_id"], bookmark, count, deadline, seq, barrier, value, headers)
                    for bookmark, count, deadline, barrier, seq, _key, value, headers, _ts
                    in unpack_deliveries(env["batch"])])
    return out


def test_an_envelope_carries_a_subscriptions_messages_in_order():
    env = Envelopes(1_000_000)
    p1 = Payload(None, b"one", [("h", b"x")], 10).encode()
    p2 = Payload(b"k", None, [], 11).encode()
    env.add("kq.deliver.c", "s1", "Q", "json", "T/0/1", 1, 5000, False, 0, p1)
    env.add("kq.deliver.c", "s2", "Q", "json", "T/0/2", 1, None, True, 1, p2)
    env.add("kq.deliver.c", "s1", "Q", "json", "T/0/3", 2, 6000, False, 2, p2)
    records = env.records()
    assert len(env) == 3 and all(r.topic == "kq.deliver.c" for r in records)
    assert deliveries_in(records) == [
        [("s1", "T/0/1", 1, 5000, 0, False, b"one", [("h", b"x")]),
         ("s1", "T/0/3", 2, 6000, 2, False, None, [])],
        [("s2", "T/0/2", 1, None, 1, True, None, [])],
    ]
    # each payload is read in place from the envelope's blob: keys and times included
    env1 = wire.decode("envelope", records[0].value)
    assert [(key, ts) for _, _, _, _, _, key, _, _, ts in unpack_deliveries(env1["batch"])] == [
        (None, 10), (b"k", 11)]


def test_an_envelope_that_would_outgrow_the_record_limit_is_split():
    limit = 20_000
    env = Envelopes(limit)
    big = Payload(None, b"x" * 6000, [], 1).encode()
    for i in range(10):
        env.add("t", "s1", "Q", "bytes", f"T/0/{i}", 1, 1, False, i, big)
    records = env.records()
    assert len(records) > 1 and all(len(r.value or b"") <= limit for r in records)
    assert [d[1] for pack in deliveries_in(records) for d in pack] == [
        f"T/0/{i}" for i in range(10)]
