"""PySpark Python data sources: `kq-journal` (committed transitions) and `kq-topic`
(records of underlying topics).

Each Kafka partition is split into offset ranges read by Spark tasks in parallel, each with
its own consumer (consumers do not pickle). Ends are found by reading in the driver, never
taken from a high watermark. A journal range owns the batches whose first part lies in it
(`broker.history.journal`), so ranges read apart give exactly what one reader gets. Rows
leave the reader as Arrow record batches.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from broker import wire
from broker.history.journal import FIELDS, whole_batches
from broker.history.reading import doc_of
from broker.history.times import moment_ms
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from broker.kafka.records import headers_of
from broker.service.journal import COLUMNS

JOURNAL_TYPES = {
    "batch": pa.int64(), "offset": pa.int64(), "index": pa.int32(), "kind": pa.string(),
    "queue": pa.string(), "at_ms": pa.int64(), "bookmark": pa.string(), "client": pa.string(),
    "sub_id": pa.string(), "delivery_count": pa.int32(), "cancel_count": pa.int32(),
    "deadline_ms": pa.int64(), "reason": pa.string(), "seq": pa.int64(),
    "timestamp_ms": pa.int64()}
JOURNAL_SCHEMA = pa.schema([(f, JOURNAL_TYPES[f]) for f in FIELDS])
_SPARK_TYPE = {pa.int64(): "long", pa.int32(): "int", pa.string(): "string"}


def journal_ddl(columns: tuple[str, ...]) -> str:
    return ", ".join(f"{c} {_SPARK_TYPE[JOURNAL_TYPES[c]]}" for c in columns)


JOURNAL_DDL = journal_ddl(FIELDS)
TOPIC_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()), ("bookmark", pa.string()), ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])
TOPIC_DDL = ("topic string, partition int, offset long, timestamp_ms long, bookmark string, "
             "key binary, value binary, headers array<struct<key: string, value: binary>>")
ROWS_PER_ARROW_BATCH = 20_000


@dataclass(frozen=True)
class Settings:
    """A source's options, parsed once in the driver (picklable, shipped to tasks)."""

    bootstrap: str
    kafka: dict[str, str]
    since_ms: int | None
    until_ms: int | None
    queue: str | None
    columns: tuple[str, ...]  # the journal columns wanted (all by default)
    topics: str | None
    where: str | None
    per_partition: int
    min_partitions: int

    @classmethod
    def of(cls, options: dict[str, str], default_per_partition: int) -> Settings:
        now = int(time.time() * 1000)
        return cls(
            bootstrap=options.get("bootstrap.servers", "127.0.0.1:9092"),
            kafka={k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")},
            since_ms=moment_ms(options.get("since"), now),
            until_ms=moment_ms(options.get("until"), now),
            queue=options.get("queue"), topics=options.get("topics"),
            columns=_columns(options.get("columns")),
            where=options.get("where"),
            per_partition=int(options.get("records_per_partition", default_per_partition)),
            min_partitions=int(options.get("min_partitions", 2)))

    def consumer(self) -> Any:
        return clients.consumer(self.bootstrap, self.kafka, **{"fetch.wait.max.ms": 50})


def _columns(text: str | None) -> tuple[str, ...]:
    """The `columns` option: a comma-separated subset of the journal's columns (a Python
    data source gets no column pruning from Spark, so a job says what it reads)."""
    if not text:
        return FIELDS
    wanted = tuple(c.strip() for c in text.split(",") if c.strip())
    unknown = [c for c in wanted if c not in FIELDS]
    if unknown:
        raise ValueError(f"unknown journal column(s) {unknown}: choose from {list(FIELDS)}")
    return wanted


class Range(InputPartition):  # type: ignore[misc]
    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _plan(s: Settings, spans: dict[tuple[str, int], tuple[int, int]],
          whole: bool = False) -> list[Range]:
    """Offset ranges: each partition cut into pieces of at most `per_partition` records,
    and into at least `min_partitions` pieces overall (or, `whole`, one per partition)."""
    todo = [(t, p, lo, end) for (t, p), (lo, end) in sorted(spans.items()) if end > lo]
    if whole:
        return [Range(t, p, lo, end) for t, p, lo, end in todo]
    total = sum(end - lo for *_, lo, end in todo)
    size = min(s.per_partition, max(1, math.ceil(total / max(1, s.min_partitions))))
    return [Range(t, p, a, b) for t, p, lo, end in todo
            for a, b in ((x, min(x + size, end)) for x in range(lo, end, size))]


# -- kq-journal ----------------------------------------------------------------------------
class JournalSource(DataSource):  # type: ignore[misc]
    """`spark.read.format("kq-journal")`: one row per committed transition."""

    @classmethod
    def name(cls) -> str:
        return "kq-journal"

    def schema(self) -> str:
        return journal_ddl(_columns(self.options.get("columns")))

    def _settings(self) -> tuple[Settings, str]:
        s = Settings.of(dict(self.options), default_per_partition=5_000)
        topic = self.options.get("topic") or f"{self.options.get('topic_prefix', 'kq')}.journal"
        return s, topic

    def reader(self, schema: Any) -> DataSourceReader:
        return JournalReader(*self._settings())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return JournalStreamReader(*self._settings())


def _journal_spans(s: Settings, topic: str) -> dict[tuple[str, int], tuple[int, int]]:
    c = s.consumer()
    try:
        n = clients.topic_partitions(clients.admin(s.bootstrap, s.kafka)).get(topic, 0)
        return real_ends(c, [(topic, p) for p in range(n)])
    finally:
        c.close()


def read_journal_range(s: Settings, r: Range) -> Iterator[pa.RecordBatch]:
    c = s.consumer()
    pending: list[pa.RecordBatch] = []
    rows = 0
    schema = pa.schema([(f, JOURNAL_TYPES[f]) for f in s.columns])
    try:
        recs = ((rec.offset(), rec.value())
                for rec in records(c, r.topic, r.partition, r.start, settle_from=r.end))
        for batch in whole_batches(recs, r.end):
            for part in batch:
                arrow = _wanted(s, part_arrow(part, s.columns)).select(list(s.columns))
                if arrow.num_rows:
                    pending.append(arrow)
                    rows += arrow.num_rows
            if rows >= ROWS_PER_ARROW_BATCH:
                yield from pa.Table.from_batches(pending, schema).combine_chunks().to_batches()
                pending, rows = [], 0
        if pending:
            yield from pa.Table.from_batches(pending, schema).combine_chunks().to_batches()
    finally:
        c.close()


def part_arrow(part: dict[str, Any], columns: tuple[str, ...] = FIELDS) -> pa.RecordBatch:
    """A journal part's transitions as an Arrow batch of `columns` (and those the filters
    read). A version 2 part's packed columns go to Arrow as buffers, without a Python step
    per transition."""
    cols = part.get("columns")
    if not cols:  # version 1: one record per transition
        listed = [{"batch": part["batch"], "offset": part["offset"], "index": i, **t}
                  for i, t in enumerate(part["transitions"])]
        return pa.RecordBatch.from_pylist(listed, schema=JOURNAL_SCHEMA)
    n = cols["count"]
    strings = (pa.StringArray.from_buffers(  # (version 7: the table as Arrow lays it out)
        len(cols["string_offsets"]) // 4 - 1, pa.py_buffer(cols["string_offsets"]),
        pa.py_buffer(cols["string_data"])) if cols.get("string_offsets")
        else pa.array(cols["strings"], pa.string()))
    arrays: dict[str, pa.Array] = {
        "batch": pa.array(np.full(n, part["batch"], np.int64)),
        "offset": pa.array(np.full(n, part["offset"], np.int64)),
        "index": pa.array(np.arange(n, dtype=np.int32))}
    needed = {*columns, "queue", "at_ms"}
    for name, kind in COLUMNS:
        if name not in needed or name in arrays:
            continue
        if kind == "str":
            ix = np.frombuffer(cols[name], "<i4")
            arrays[name] = strings.take(pa.array(ix, mask=ix < 0))
        else:
            values = np.frombuffer(cols[name], _NUMPY[kind])
            unset = (np.frombuffer(cols[f"{name}_set"], np.uint8) == 0
                     if kind.endswith("?") else None)
            arrays[name] = pa.array(values, JOURNAL_TYPES[name], mask=unset)
    return pa.RecordBatch.from_pydict({f: arrays[f] for f in FIELDS if f in arrays})


_NUMPY = {"int32": "<i4", "int64": "<i8", "int64?": "<i8", "double?": "<f8"}


def _wanted(s: Settings, b: pa.RecordBatch) -> pa.RecordBatch:
    """The rows the source's `queue`, `since` and `until` options keep."""
    keep = None
    for cond in ((pc.equal(b["queue"], s.queue) if s.queue is not None else None),
                 (pc.greater_equal(b["at_ms"], s.since_ms) if s.since_ms is not None else None),
                 (pc.less(b["at_ms"], s.until_ms) if s.until_ms is not None else None)):
        if cond is not None:
            keep = cond if keep is None else pc.and_(keep, cond)
    return b if keep is None else b.filter(keep)


class JournalReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, settings: Settings, topic: str) -> None:
        self.s, self.topic = settings, topic

    def partitions(self) -> list[Range]:
        return _plan(self.s, _journal_spans(self.s, self.topic))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Range)
        return read_journal_range(self.s, partition)


class JournalStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    """Micro-batches end where a whole batch ends, so a batch never straddles two of them."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.s, self.topic = settings, topic

    def initialOffset(self) -> dict[str, int]:
        return {str(p): lo for (_, p), (lo, _) in _journal_spans(self.s, self.topic).items()}

    def latestOffset(self, start: dict[str, int] | None = None,
                     limit: Any = None) -> dict[str, int]:
        spans = _journal_spans(self.s, self.topic)
        return {str(p): _batch_aligned_end(self.s, self.topic, p, lo, end)
                for (_, p), (lo, end) in spans.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Range]:
        spans = {(self.topic, int(p)): (start.get(p, 0), e) for p, e in end.items()}
        return _plan(self.s, spans)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, Range)
        return read_journal_range(self.s, partition)

    def commit(self, end: dict[str, int]) -> None:
        pass  # Spark's checkpoint keeps the offsets; the journal is never trimmed by kq


def _batch_aligned_end(s: Settings, topic: str, partition: int, lo: int, end: int) -> int:
    """`end`, moved back to the first part of the last batch when that batch is not whole
    yet (it is being written): the next micro-batch reads it whole."""
    if end <= lo:
        return end
    c = s.consumer()
    try:
        last = next(iter(records(c, topic, partition, end - 1, end)), None)
    finally:
        c.close()
    if last is None:
        return end
    part = wire.decode("journal", last.value())
    if part["marker"] is not None or part["part"] == part["parts"] - 1:
        return end
    return max(lo, end - 1 - part["part"])


# -- kq-topic ------------------------------------------------------------------------------
class TopicSource(DataSource):  # type: ignore[misc]
    """`spark.read.format("kq-topic").option("topics", REGEX)`: records of underlying topics
    (`since`/`until` on record timestamps, `where` a kq expression; `whole_partitions`:
    one Spark partition per Kafka partition, for replays that keep order)."""

    @classmethod
    def name(cls) -> str:
        return "kq-topic"

    def schema(self) -> str:
        return TOPIC_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return TopicReader(Settings.of(dict(self.options), default_per_partition=50_000),
                           self.options.get("whole_partitions", "false") == "true")


class TopicReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, settings: Settings, whole: bool) -> None:
        self.s, self.whole = settings, whole

    def partitions(self) -> list[Range]:
        rx = re.compile(self.s.topics or "^$")
        counts = clients.topic_partitions(clients.admin(self.s.bootstrap, self.s.kafka))
        wanted = [(t, p) for t, n in sorted(counts.items()) if rx.search(t) for p in range(n)]
        c = self.s.consumer()
        try:
            return _plan(self.s, real_ends(c, wanted), self.whole)
        finally:
            c.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from broker.expr import compile_expression

        assert isinstance(partition, Range)
        s = self.s
        where = compile_expression(s.where) if s.where else None
        cols: dict[str, list[Any]] = {f: [] for f in TOPIC_SCHEMA.names}
        c = s.consumer()
        try:
            for rec in records(c, partition.topic, partition.partition, partition.start,
                               partition.end):
                ts = rec.timestamp()[1]
                if (s.since_ms is not None and ts < s.since_ms
                        or s.until_ms is not None and ts >= s.until_ms):
                    continue
                headers = headers_of(rec)
                if where is not None and not where.matches(doc_of(rec.value(), headers)):
                    continue
                for f, v in zip(TOPIC_SCHEMA.names, (
                        rec.topic(), rec.partition(), rec.offset(), ts,
                        f"{rec.topic()}/{rec.partition()}/{rec.offset()}", rec.key(),
                        rec.value(), [{"key": k, "value": v} for k, v in headers]),
                        strict=True):
                    cols[f].append(v)
                if len(cols["offset"]) >= ROWS_PER_ARROW_BATCH:
                    yield pa.RecordBatch.from_pydict(cols, schema=TOPIC_SCHEMA)
                    cols = {f: [] for f in TOPIC_SCHEMA.names}
            if cols["offset"]:
                yield pa.RecordBatch.from_pydict(cols, schema=TOPIC_SCHEMA)
        finally:
            c.close()
