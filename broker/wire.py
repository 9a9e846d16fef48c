"""Avro encoding of every record kq writes (schemas in `schemas/`), parsed once."""

from __future__ import annotations

import io
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import fastavro

_SOURCE_TREE = Path(__file__).resolve().parent.parent / "schemas"


def _schema_dir() -> Path:
    if _SOURCE_TREE.is_dir():
        return _SOURCE_TREE
    return Path(str(resources.files("broker") / "_schemas"))  # installed wheel


@cache
def schema(name: str) -> Any:
    """The parsed schema `schemas/<name>.avsc`."""
    with open(_schema_dir() / f"{name}.avsc") as f:
        return fastavro.parse_schema(json.load(f))


def encode(name: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema(name), record)
    return buf.getvalue()


def decode(name: str, data: bytes) -> dict[str, Any]:
    """Decode one record; raise ValueError on bytes that are not a valid record."""
    try:
        record = fastavro.schemaless_reader(io.BytesIO(data), schema(name), None)
    except Exception as exc:  # fastavro raises several unrelated types on bad input
        raise ValueError(f"not a valid {name} record: {exc}") from None
    assert isinstance(record, dict)
    return record
