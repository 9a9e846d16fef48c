"""Avro's binary encoding, written and read by kq's own code for the records of every batch:
the commands (every client sends one per batch of acks; the service reads each), the
delivery envelopes (the service writes one per subscription and batch; a worker reads it)
and the journal parts (one per batch). fastavro takes 10-30 µs a record whatever its size
(it walks the schema, filling in or reading every field generically), which at a steady
rate, a few messages to a batch, was a good part of each message's CPU; `FlatRecord` does
it in a few, built once from the same parsed schema (`broker.wire` uses it for those three).

The bytes are Avro's, field for field: the tests check them against fastavro's for every
record the schemas allow, and fastavro's reading of damaged records against `FlatRecord`'s,
so every reader, fastavro included, reads them with the documented schemas.
"""

from __future__ import annotations

import struct
from typing import Any, Final

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


# -- flat records, both ways -------------------------------------------------------------------
# A field's kind in a FlatRecord: (int and long are encoded alike)
STRING, BYTES, LONG, BOOL, DOUBLE, ENUM, STRINGS, LONGS, RECORD, RECORDS = range(10)
_PRIMITIVE: Final = {"string": STRING, "bytes": BYTES, "long": LONG, "int": LONG,
                     "boolean": BOOL, "double": DOUBLE}
_DOUBLE: Final = struct.Struct("<d")
_ARRAY: Final = {"string": STRINGS, "long": LONGS, "int": LONGS}
_REQUIRED: Final[Any] = object()  # a field without a default


class FlatRecord:
    """Avro's binary encoding of one record schema whose fields are strings, bytes, ints,
    longs, booleans, enums, records of such fields, ["null", one of those] unions and arrays
    of strings, longs or records (a command, which every client sends per batch of acks and
    the service reads; a delivery envelope, which the service sends per batch and a worker
    reads). Built from the parsed schema; ValueError for any other field, and for bytes that
    are not such a record."""

    def __init__(self, schema: dict[str, Any]) -> None:
        # (name, kind, nullable, default, enum symbols, their indexes, a record's own)
        self.fields: list[tuple[str, int, bool, Any, list[str], dict[str, int],
                                FlatRecord | None]] = []
        for f in schema["fields"]:
            t, nullable = f["type"], False
            if isinstance(t, list) and len(t) == 2 and t[0] == "null":
                t, nullable = t[1], True
            symbols: list[str] = []
            sub = None
            kind = _kind(t)
            if kind == ENUM:
                symbols = list(t["symbols"])
            elif kind == RECORD:
                sub = FlatRecord(t)
            elif kind == RECORDS:
                sub = FlatRecord(t["items"])
            elif kind < 0:
                raise ValueError(f"field {f['name']}: {t!r} is not in a flat record")
            self.fields.append((f["name"], kind, nullable, f.get("default", _REQUIRED),
                                symbols, {s: i for i, s in enumerate(symbols)}, sub))

    def encode(self, record: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        self._write(record, out)
        return b"".join(out)

    def _write(self, record: dict[str, Any], out: list[bytes]) -> None:
        for name, kind, nullable, default, _, index, sub in self.fields:
            value = record.get(name, default)
            if value is _REQUIRED:
                raise ValueError(f"no {name}")
            if nullable:
                if value is None:
                    out.append(NULL)
                    continue
                out.append(b"\x02")
            if kind == STRING:
                out.append(string(value))
            elif kind == BYTES:
                out.append(bytes_(value))
            elif kind == LONG:
                out.append(long_(value))
            elif kind == BOOL:
                out.append(b"\x01" if value else NULL)
            elif kind == DOUBLE:
                out.append(_DOUBLE.pack(value))
            elif kind == ENUM:
                if value not in index:
                    raise ValueError(f"{name}: {value!r} is not one of its symbols")
                out.append(long_(index[value]))
            elif kind == RECORD:
                assert sub is not None
                # (a union's branch may be named: (name, record))
                sub._write(value[1] if isinstance(value, tuple) else value, out)
            elif value:  # an array: one block, then the end
                out.append(long_(len(value)))
                if kind == STRINGS:
                    out += [string(v) for v in value]
                elif kind == LONGS:
                    out += [long_(v) for v in value]
                else:
                    assert sub is not None
                    for item in value:
                        sub._write(item, out)
                out.append(NULL)
            else:
                out.append(NULL)

    def decode(self, data: bytes, pos: int = 0) -> dict[str, Any]:
        """The record starting at `pos` (what follows it is not looked at)."""
        return self._read(data, pos)[0]

    def _read(self, data: bytes, pos: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        for name, kind, nullable, _, symbols, _, sub in self.fields:
            if nullable:
                branch, pos = _read_long(data, pos)
                if branch == 0:
                    out[name] = None
                    continue
                if branch != 1:
                    raise ValueError(f"{name}: no union branch {branch}")
            if kind == STRING:
                raw, pos = _read_bytes(data, pos)
                out[name] = raw.decode()
            elif kind == BYTES:
                out[name], pos = _read_bytes(data, pos)
            elif kind == LONG:
                out[name], pos = _read_long(data, pos)
            elif kind == BOOL:
                if pos >= len(data):
                    raise ValueError("the record ends inside a boolean")
                out[name] = data[pos] == 1
                pos += 1
            elif kind == DOUBLE:
                if pos + 8 > len(data):
                    raise ValueError("the record ends inside a double")
                out[name] = _DOUBLE.unpack_from(data, pos)[0]
                pos += 8
            elif kind == ENUM:
                i, pos = _read_long(data, pos)
                if not 0 <= i < len(symbols):
                    raise ValueError(f"{name}: no symbol {i}")
                out[name] = symbols[i]
            elif kind == RECORD:
                assert sub is not None
                out[name], pos = sub._read(data, pos)
            else:
                out[name], pos = _read_array(data, pos, kind, sub)
        return out, pos


def _kind(t: Any) -> int:
    """A field type's kind, or -1."""
    if isinstance(t, str):
        return _PRIMITIVE.get(t, -1)
    if not isinstance(t, dict):
        return -1
    if t.get("type") == "enum":
        return ENUM
    if t.get("type") == "record":
        return RECORD
    if t.get("type") == "array":
        items = t["items"]
        if isinstance(items, dict) and items.get("type") == "record":
            return RECORDS
        return _ARRAY.get(items, -1) if isinstance(items, str) else -1
    return -1


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    z = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("the record ends inside a number")
        b = data[pos]
        pos += 1
        z |= (b & 127) << shift
        if b < 128:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("a number longer than 10 bytes")


def _read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _read_long(data, pos)
    if n < 0 or pos + n > len(data):
        raise ValueError(f"a length of {n} with {len(data) - pos} bytes left")
    return data[pos:pos + n], pos + n


def _read_array(data: bytes, pos: int, kind: int,
                sub: FlatRecord | None) -> tuple[list[Any], int]:
    """An array of strings, longs or records (in blocks, as Avro writes one)."""
    items: list[Any] = []
    while True:
        count, pos = _read_long(data, pos)
        if count == 0:
            return items, pos
        if count < 0:  # a block that says its size in bytes too
            count = -count
            _, pos = _read_long(data, pos)
        if count > len(data) - pos:  # (each item takes a byte at least)
            raise ValueError(f"{count} items with {len(data) - pos} bytes left")
        for _ in range(count):
            if kind == STRINGS:
                raw, pos = _read_bytes(data, pos)
                items.append(raw.decode())
            elif kind == LONGS:
                n, pos = _read_long(data, pos)
                items.append(n)
            else:
                assert sub is not None
                item, pos = sub._read(data, pos)
                items.append(item)
