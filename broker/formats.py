"""How a queue's payloads are decoded for expressions and for `msg.data`.

`json` (the default): a JSON document. `bytes`: opaque, expressions see the headers only.
`avro`: Avro binary without a container or header (one record per Kafka record, as a plain
Avro producer writes it), decoded with the writer's schema named by the queue's `schema`
(an .avsc file; relative paths from where `kq serve` runs). The service sends the schema to
each subscriber in its subscribe reply, so the client decodes `msg.data` the same way.
"""

from __future__ import annotations

import io
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import fastavro
from fastavro.types import Schema


@lru_cache(maxsize=64)
def load_schema(path: str) -> str:
    """The schema file's text, checked: it must parse as an Avro schema (ValueError names
    what is wrong)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read schema {path}: {exc.strerror}") from None
    parsed_schema(text)
    return text


@lru_cache(maxsize=64)
def parsed_schema(text: str) -> Schema:
    try:
        return fastavro.parse_schema(json.loads(text))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ValueError(f"not an Avro schema: {exc}") from None


def decode(fmt: str, value: bytes | None, schema: str | None = None) -> Any:
    """The payload as expressions and `msg.data` see it; raise ValueError when it does not
    decode. None for `bytes` and for a NULL value."""
    if value is None or fmt == "bytes":
        return None
    if fmt == "avro":
        if schema is None:
            raise ValueError("an avro payload needs the queue's schema")
        try:
            return fastavro.schemaless_reader(io.BytesIO(value), parsed_schema(schema), None)
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
            raise ValueError(f"not Avro of the queue's schema: {exc}") from None
    return json.loads(value)
