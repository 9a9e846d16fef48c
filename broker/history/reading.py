"""Reading journals and underlying topics whole, in order, for the CLI (Spark reads the same
ranges in parallel through `broker.pipeline`)."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer

from broker.errors import ConfigError, KqError
from broker.expr import Doc, Expression
from broker.history.journal import Row, rows_in
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from broker.kafka.records import headers_of

# Told, as reading goes, how far it got: (topic, partition, records read so far).
Progress = Callable[[str, int, int], None]
Span = tuple[str, int, int, int]  # topic, partition, first offset, end


def spans(c: Consumer, bootstrap: str, kafka: dict[str, Any],
          topics: list[str]) -> list[Span]:
    """Every partition of `topics` with its first offset and real end."""
    counts = clients.topic_partitions(clients.admin(bootstrap, kafka))
    wanted = [(t, p) for t in topics for p in range(counts.get(t, 0))]
    return [(t, p, lo, end) for (t, p), (lo, end) in sorted(real_ends(c, wanted).items())]


def journal_spans(c: Consumer, bootstrap: str, kafka: dict[str, Any], topic: str) -> list[Span]:
    found = spans(c, bootstrap, kafka, [topic])
    if not found:
        raise KqError(f"there is no journal topic {topic} on {bootstrap}: has `kq serve` run "
                      "there with this topic prefix (--config)?")
    return found


def retained_from(c: Consumer, spans_: list[Span]) -> str | None:
    """Where retention deleted the head of some partitions: from when the answer is whole
    (the latest of those partitions' first records), in words; None if nothing is gone."""
    heads = [(t, p, lo) for t, p, lo, end in spans_ if lo > 0]
    if not heads:
        return None
    firsts = []
    for topic, p, lo in heads:
        first = next(records(c, topic, p, lo, lo + 1), None)
        if first is not None:
            firsts.append(first.timestamp()[1])
    since = (datetime.fromtimestamp(max(firsts) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
             if firsts else "its first record")
    where = ", ".join(f"partition {p} from offset {lo}" for _, p, lo in heads)
    return (f"{heads[0][0]} holds its records from {since} UTC on ({where}; retention "
            "deleted the earlier ones): what follows starts there")


def journal_rows(c: Consumer, spans_: list[Span], wanted: Callable[[Row], bool],
                 progress: Progress | None = None) -> Iterator[Row]:
    """Committed transitions of the journal, oldest first, filtered. Reading no record at
    all from a journal whose partitions hold some is an error, never an empty answer."""
    read = [0]

    def counted(recs: Iterator[Any]) -> Iterator[tuple[int, bytes]]:
        for rec in recs:
            read[0] += 1
            yield rec.offset(), rec.value()

    for topic, p, lo, end in spans_:
        recs = _counted(records(c, topic, p, lo, settle_from=end), topic, p, progress)
        yield from rows_in(counted(recs), end, wanted)
    held = sum(end - lo for _, _, lo, end in spans_)
    if read[0] == 0 and held > 0:
        raise KqError(f"read no record of the journal {spans_[0][0]}, whose partitions hold "
                      f"{held}: nothing was read, so nothing can be shown")


def topic_records(c: Consumer, spans_: list[Span], since_ms: int | None,
                  until_ms: int | None, where: Expression | None,
                  progress: Progress | None = None) -> Iterator[Any]:
    """Records of underlying topics in a time range that the expression matches, partition
    by partition, each in offset order. `NOW()` in the expression is the time the read
    began, the same for every record."""
    now_ms = int(time.time() * 1000)
    for topic, p, lo, end in spans_:
        for rec in _counted(records(c, topic, p, lo, end), topic, p, progress):
            ts = rec.timestamp()[1]
            if since_ms is not None and ts < since_ms or until_ms is not None and ts >= until_ms:
                continue
            if where is None or where.matches(doc_of(rec.value(), headers_of(rec), now_ms)):
                yield rec


def _counted(recs: Iterator[Any], topic: str, p: int,
             progress: Progress | None) -> Iterator[Any]:
    if progress is None:
        yield from recs
        return
    for n, rec in enumerate(recs, 1):
        if n % 500 == 0:
            progress(topic, p, 500)
        yield rec


def matching_topics(bootstrap: str, kafka: dict[str, Any], pattern: str) -> list[str]:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"bad --topics regex {pattern!r}: {exc}") from None
    names = clients.topic_partitions(clients.admin(bootstrap, kafka))
    return sorted(t for t in names if rx.search(t))


def doc_of(value: bytes | None, headers: list[tuple[str, bytes | None]],
           now_ms: int = 0) -> Doc:
    """What `--where` sees of a record: its JSON payload (paths are NULL when the value is
    not JSON) and its headers, which work on any payload."""
    data = None
    if value is not None:
        try:
            data = json.loads(value)
        except ValueError:
            data = None
    return Doc(data, dict(headers), now_ms)


def text_or_b64(name: str, raw: bytes | None) -> dict[str, Any]:
    """`{name: text}` for UTF-8 bytes (or None), else `{name_b64: base64}`."""
    if raw is None:
        return {name: None}
    try:
        return {name: raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(raw).decode("ascii")}


def record_json(topic: str, partition: int, offset: int, timestamp_ms: int,
                key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes | None]]) -> dict[str, Any]:
    """A source record as `kq journal grep --json` shows it."""
    return {"bookmark": f"{topic}/{partition}/{offset}", "topic": topic,
            "partition": partition, "offset": offset, "timestamp_ms": timestamp_ms,
            **text_or_b64("key", key), **text_or_b64("value", value),
            "headers": [{"key": k, **text_or_b64("value", v)} for k, v in headers]}


def message_json(rec: Any) -> dict[str, Any]:
    return record_json(rec.topic(), rec.partition(), rec.offset(), rec.timestamp()[1],
                       rec.key(), rec.value(), headers_of(rec))
