"""Avro encoding of every record kq writes (schemas in `schemas/`), parsed once.

Each record starts with the Avro single-object marker and the fingerprint of the schema it was
written with, so a later kq whose schema gained fields still reads it: the writer's version is
looked up among the current schema and the released ones kept in `schemas/history/` (named
`NAME.*.avsc`), and fastavro resolves it to the current one (new fields take their defaults).
Records written before versions were marked (no marker) are read with the current schema.
"""

from __future__ import annotations

import io
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from broker.avro_binary import FlatRecord

_SOURCE_TREE = Path(__file__).resolve().parent.parent / "schemas"
MARKER = b"\xc3\x01"  # cannot start an unmarked kq record: all begin with a small enum/long
_HEADER = len(MARKER) + 8


def _schema_dir() -> Path:
    if _SOURCE_TREE.is_dir():
        return _SOURCE_TREE
    return Path(str(resources.files("broker") / "_schemas"))  # installed wheel


def _fingerprint_of(parsed: Any) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


@cache
def schema(name: str) -> Any:
    """The parsed schema `schemas/<name>.avsc`."""
    with open(_schema_dir() / f"{name}.avsc") as f:
        return fastavro.parse_schema(json.load(f))


@cache
def header(name: str) -> bytes:
    """What a record of `name` starts with: the marker and its schema's fingerprint."""
    return MARKER + _fingerprint_of(schema(name))


@cache
def versions(name: str) -> dict[bytes, Any]:
    """Every schema version of `name` this kq can read, by fingerprint."""
    known = {_fingerprint_of(schema(name)): schema(name)}
    for path in sorted((_schema_dir() / "history").glob(f"{name}.*.avsc")):
        with open(path) as f:
            old = fastavro.parse_schema(json.load(f))
        known.setdefault(_fingerprint_of(old), old)
    return known


# Read and written by kq's own code (broker.avro_binary), in a few µs where fastavro takes
# 10-30 whatever the record's size: every client sends a command per batch of acks, which
# the service reads, and reads an envelope per batch the service delivers it; the service
# writes a journal part per batch.
_FLAT = frozenset({"command", "envelope", "journal"})


@cache
def _flat(name: str) -> FlatRecord | None:
    return FlatRecord(schema(name)) if name in _FLAT else None


def encode(name: str, record: dict[str, Any]) -> bytes:
    flat = _flat(name)
    if flat is not None:
        return header(name) + flat.encode(record)
    buf = io.BytesIO()
    buf.write(header(name))
    fastavro.schemaless_writer(buf, schema(name), record)
    return buf.getvalue()


def decode(name: str, data: bytes) -> dict[str, Any]:
    """Decode one record; raise ValueError on bytes that are not a valid record."""
    flat = _flat(name)
    if flat is not None and data[:_HEADER] == header(name):  # (the current version)
        try:
            return flat.decode(data, _HEADER)
        except ValueError as exc:  # (UnicodeDecodeError included)
            raise ValueError(f"not a valid {name} record: {exc}") from None
    writer, body = schema(name), data
    if data[:len(MARKER)] == MARKER and len(data) >= _HEADER:
        found = versions(name).get(data[len(MARKER):_HEADER])
        if found is None:
            raise ValueError(f"not a {name} record this kq can read: written with a schema "
                             f"version it does not know (fingerprint "
                             f"{data[len(MARKER):_HEADER].hex()}; by a newer kq?)")
        writer, body = found, data[_HEADER:]
    reader = None if writer is schema(name) else schema(name)
    try:
        record = fastavro.schemaless_reader(io.BytesIO(body), writer, reader)
    except Exception as exc:  # fastavro raises several unrelated types on bad input
        raise ValueError(f"not a valid {name} record: {exc}") from None
    assert isinstance(record, dict)
    return record
