"""The pager's keys and rows (broker.state.pager): how a message's place in its queue becomes
a key that RocksDB sorts as the queue does, and what the row under it holds."""

from __future__ import annotations

import math
import struct
from typing import Any, Final

from broker.engine.queue import Message
from broker.state.layout import decode_message
from broker.values import Bookmark

SEQ: Final = struct.Struct(">q")
_LEN: Final = struct.Struct("<H")
_PAYLOAD_LEN: Final = struct.Struct("<I")  # 0: no payload in the row (read from the store)
# (a row: _LEN, the packed message, _PAYLOAD_LEN, the payload, the bookmark; see _bounds)
NO_PRIORITY: Final = b"\x01" + bytes(8)  # order_key's head for a message without a priority
_BITS: Final = struct.Struct(">Q")  # a double's 64 bits, big-endian


def order_key(order: tuple[Any, int]) -> bytes:
    """`Message.order` as bytes that sort the same way: (-priority or inf, seq), or in a
    sorted queue ((kind, number or string), seq)."""
    first, seq = order
    if first == math.inf:  # the usual order, (no priority, seq): first, without the tests
        return NO_PRIORITY + SEQ.pack(seq)
    if isinstance(first, tuple):
        kind, value = first
        body = (value.encode().replace(b"\x00", b"\x00\xff") + b"\x00\x00"
                if isinstance(value, str) else _double(value))
        return b"\x02" + bytes([kind]) + body + SEQ.pack(seq)
    return b"\x00" + _double(first) + SEQ.pack(seq)


def _double(value: float) -> bytes:
    """A float as 8 bytes that sort as it does (-0.0 as 0.0: they are equal, and their tie
    must be broken by seq, as in memory, not by the sign bit)."""
    (bits,) = _BITS.unpack(struct.pack(">d", value + 0.0))
    if bits >> 63:  # negative: flip every bit, so larger magnitudes sort first
        return _BITS.pack(bits ^ 0xFFFF_FFFF_FFFF_FFFF)
    return _BITS.pack(bits | 1 << 63)  # positive: above every negative


def row(packed: bytes, payload: bytes, bm: bytes) -> bytes:
    """An o key's value: the packed message, the packed payload (or none), the bookmark."""
    return b"".join((_LEN.pack(len(packed)), packed, _PAYLOAD_LEN.pack(len(payload)), payload,
                     bm))


def fields(data: bytes) -> tuple[bytes, bytes, bytes]:
    """An o key's value as (packed message, packed payload or b"", bookmark text)."""
    end, start, after = _bounds(data)
    return data[2:end], data[start:after], data[after:]


def row_message(data: bytes) -> Message:
    """An o key's value's message (its payload left where it is: not copied)."""
    end, _, after = _bounds(data)
    return decode_message(Bookmark.parse(data[after:].decode()), data[2:end])


def _bounds(data: bytes) -> tuple[int, int, int]:
    """Where a row's packed message ends, its payload starts and its bookmark starts. The
    lengths are read byte by byte: compiled, an index is a load, where `Struct.unpack_from`
    is a call through Python that builds a tuple."""
    end = 2 + (data[0] | data[1] << 8)
    plen = data[end] | data[end + 1] << 8 | data[end + 2] << 16 | data[end + 3] << 24
    return end, end + 4, end + 4 + plen
