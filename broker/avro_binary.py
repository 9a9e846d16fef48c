"""Avro's binary encoding, written directly, for the two records kq writes for every batch: a
delivery envelope per subscription (`broker.service.envelopes`) and a journal part
(`broker.service.journal`). fastavro's writer costs about 20 µs a record whatever its size
(it walks the schema and fills in every default), which at a steady rate, a few messages to
a batch, was a good part of each message's CPU; laying out a fixed record costs a few.

The bytes are Avro's, field for field: the tests check them against fastavro's for the same
records, so every reader, fastavro included, reads them with the documented schemas.
Everything else kq writes goes through `broker.wire`.
"""

from __future__ import annotations

from typing import Final

# long 0..63 (zigzag 0..126): one byte, the common case (lengths, counts, small numbers)
_SMALL: Final = [bytes([z]) for z in range(128)]

NULL: Final = b"\x00"  # a union's first branch (null), an empty array, a 0, false, ""


def long_(n: int) -> bytes:
    """An Avro int or long: zigzag, then 7 bits a byte, low first."""
    z = (n << 1) ^ (n >> 63)
    if z < 128:
        return _SMALL[z]
    out = bytearray()
    while z >= 128:
        out.append((z & 127) | 128)
        z >>= 7
    out.append(z)
    return bytes(out)


def string(text: str) -> bytes:
    data = text.encode()
    return long_(len(data)) + data


def bytes_(data: bytes) -> bytes:
    return long_(len(data)) + data


def optional_string(text: str | None) -> bytes:
    """A ["null", "string"] union."""
    return NULL if text is None else b"\x02" + string(text)


def optional_long(n: int | None) -> bytes:
    """A ["null", "long"] union."""
    return NULL if n is None else b"\x02" + long_(n)
