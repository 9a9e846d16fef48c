"""Binary layouts on the hot path, packed with `struct` and `array` instead of Avro.

Avro (fastavro) costs a few microseconds per record and per nested record; a message's stored
payload is written once, read at every delivery, and shipped inside a delivery envelope as
it is, so it is packed here: a fixed header, then the raw bytes. Columns of integers are
packed as little-endian arrays, one C loop for a whole batch.

Stored payload (`pack_payload`):
    TAG | timestamp_ms int64 | key length int32 | value length int32 | header count uint16
    | key | value | per header: name length uint16 | value length int32 | name | value
A length of -1 is a NULL. TAG cannot start an Avro record kq wrote before, so those are
still read (`broker.state.layout.Payload.decode`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable
from typing import Any, Final

from mypy_extensions import i64

PAYLOAD_TAG: Final = b"\xc3\x03"
_HEAD: Final = struct.Struct("<2sqiiH")
_HEADER: Final = struct.Struct("<Hi")
_HEAD_SIZE: Final = 20  # (_HEAD.size and _HEADER.size, as constants: checked below)
_HEADER_SIZE: Final = 6
assert _HEAD.size == _HEAD_SIZE and _HEADER.size == _HEADER_SIZE

Headers = list[tuple[str, bytes | None]]


def pack_payload(key: bytes | None, value: bytes | None, headers: Headers,
                 timestamp_ms: int) -> bytes:
    parts = [_HEAD.pack(PAYLOAD_TAG, timestamp_ms, -1 if key is None else len(key),
                        -1 if value is None else len(value), len(headers)),
             key or b"", value or b""]
    for name, v in headers:
        raw = name.encode()
        parts += [_HEADER.pack(len(raw), -1 if v is None else len(v)), raw, v or b""]
    return b"".join(parts)


def unpack_payload(data: bytes, start: i64 = 0) -> tuple[bytes | None, bytes | None, Headers, int]:
    """(key, value, headers, timestamp_ms) of the packed payload at `start` of `data`."""
    key, value, headers, ts = unpack_delivered(data, start)
    return key, value, headers if headers is not None else [], ts


def unpack_delivered(data: bytes, start: i64 = 0
                     ) -> tuple[bytes | None, bytes | None, Headers | None, int]:
    """As `unpack_payload`, with None for no headers: a worker makes a message's empty list
    only if it is read (one more object per message for the collector to track made a
    worker's collections twice as frequent). A delivery envelope's blob holds many payloads,
    each read in place, each part sliced once. Runs once per message in a worker and per
    message paged in by the service: its numbers are read byte by byte as 64-bit machine
    integers (compiled, an index is a load and the shifts are instructions, where
    `Struct.unpack_from` is a call through Python that builds a tuple), and its sizes are
    constants (a Struct's `size` is an attribute lookup)."""
    ts = _int32(data, start + 6) << 32 | _uint32(data, start + 2)
    klen, vlen = _int32(data, start + 10), _int32(data, start + 14)
    count = _uint16(data, start + 18)
    pos = start + _HEAD_SIZE
    key = value = None
    if klen >= 0:
        key = data[pos:pos + klen]
        pos += klen
    if vlen >= 0:
        value = data[pos:pos + vlen]
        pos += vlen
    if not count:
        return key, value, None, ts
    headers: Headers = []
    for _ in range(count):
        nlen, hlen = _uint16(data, pos), _int32(data, pos + 2)
        pos += _HEADER_SIZE
        name = data[pos:pos + nlen].decode()
        pos += nlen
        header = None
        if hlen >= 0:
            header = data[pos:pos + hlen]
            pos += hlen
        headers.append((name, header))
    return key, value, headers, ts


def _uint16(data: bytes, pos: i64) -> i64:
    low: i64 = data[pos]
    high: i64 = data[pos + 1]
    return low | high << 8


def _uint32(data: bytes, pos: i64) -> i64:
    b0: i64 = data[pos]
    b1: i64 = data[pos + 1]
    b2: i64 = data[pos + 2]
    b3: i64 = data[pos + 3]
    return b0 | b1 << 8 | b2 << 16 | b3 << 24


def _int32(data: bytes, pos: i64) -> i64:
    n = _uint32(data, pos)
    return n - 0x1_0000_0000 if n >= 0x8000_0000 else n


def is_packed_payload(data: bytes) -> bool:
    return data[:2] == PAYLOAD_TAG


# -- stored messages ---------------------------------------------------------------------------
# A queued message's record (broker.state.layout.encode_message): written at every lease and
# return. MESSAGE_TAG cannot start an Avro record kq wrote (wire.MARKER or a small zigzag
# long), so records of earlier versions are still read.
MESSAGE_TAG: Final = b"\xc3\x02"
MESSAGE: Final = struct.Struct("<2sqqBiiqdB")  # tag seq ts state dc cc deadline priority flags
HAS_DEADLINE: Final = 1
HAS_PRIORITY: Final = 2
BARRIER: Final = 4
HAS_HOLDER: Final = 8
HAS_EXPIRY: Final = 16
HELD: Final = 32
HAS_SIZE: Final = 64
SORTED: Final = 128
# A record with flags beyond one byte has its own tag and two bytes of flags (the others
# stay as they were, byte for byte).
WIDE_TAG: Final = b"\xc3\x04"
WIDE: Final = struct.Struct("<2sqqBiiqdH")
GROUPED: Final = 256
# After the fixed part, each when flagged: its own expiry (HAS_EXPIRY), the moment it is
# held until (HELD), its size (HAS_SIZE), its sort key (SORTED: the kind, then a number, or
# a string's length and UTF-8), its group (GROUPED: length and UTF-8)
GROUP: Final = struct.Struct("<i")
EXPIRY: Final = struct.Struct("<q")
NOT_BEFORE: Final = struct.Struct("<q")
SIZE: Final = struct.Struct("<q")
SORT_NUMBER: Final = struct.Struct("<Bd")
SORT_TEXT: Final = struct.Struct("<Bi")
AVAILABLE_CODE: Final = 0  # the first of broker.engine.states.MessageState


def message_head(data: bytes) -> tuple[int, int, int, float | None, bool] | None:
    """(seq, timestamp_ms, state code, priority, is_barrier) of a packed message record
    without building the message; None for one to decode in full: in an earlier (Avro)
    or the wide layout, or with an expiry of its own, held, or sized (set from the message)."""
    if data[:2] != MESSAGE_TAG:
        return None
    _, seq, ts, state, _, _, _, priority, flags = MESSAGE.unpack_from(data)
    if flags & (HAS_EXPIRY | HELD | HAS_SIZE | SORTED):
        return None
    return seq, ts, state, priority if flags & HAS_PRIORITY else None, bool(flags & BARRIER)


# -- number columns ----------------------------------------------------------------------------
assert array("i").itemsize == 4 and array("q").itemsize == 8 and array("d").itemsize == 8


def pack_array(code: str, values: Iterable[Any]) -> bytes:
    """`code` "i" (int32), "q" (int64) or "d" (double), little endian. Packed by `struct`,
    which converts each number two to three times faster than `array` (whose constructor
    parses every item as a call's argument)."""
    items = values if isinstance(values, (list, tuple)) else list(values)
    return struct.pack(f"<{len(items)}{code}", *items)


def unpack_array(code: str, raw: bytes) -> array[Any]:
    a = array(code)
    a.frombytes(raw)
    if sys.byteorder == "big":
        a.byteswap()
    return a


# -- delivery envelopes ------------------------------------------------------------------------
def delivery_batch(bookmarks: list[str], delivery_counts: list[int], lease_deadlines: list[int],
                   seqs: list[int], barriers: list[int], payloads: list[bytes]) -> dict[str, Any]:
    """A `messages` envelope's packed columns (schemas/envelope.avsc, DeliveryBatch): a lease
    deadline of 0 is none, a barrier 1; the payloads packed (`pack_payload`)."""
    return {"count": len(bookmarks), "bookmarks": "\n".join(bookmarks),
            "delivery_counts": pack_array("i", delivery_counts),
            "lease_deadlines": pack_array("q", lease_deadlines),
            "seqs": pack_array("q", seqs), "barriers": bytes(barriers),
            "payload_sizes": pack_array("i", [len(p) for p in payloads]),
            "payloads": b"".join(payloads)}

