"""`kq journal ...`: dump, grep, replay, report and audit, from Kafka alone (they work while
`kq serve` is down). Report, audit and `replay --engine spark` run on Spark."""

from __future__ import annotations

import itertools
import json as jsonlib
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from broker.config import Config
from broker.engine.transitions import Kind
from broker.errors import ConfigError, ExpressionError, KqError
from broker.expr import compile_expression
from broker.history import reading
from broker.history.journal import RowFilter
from broker.history.replay import ReplayCounts, replay
from broker.history.times import moment_ms
from broker.kafka import clients
from broker.kafka.fetch import fetch_records
from broker.kafka.records import headers_of
from broker.values import Bookmark
from cli.common import (
    EXIT_USAGE,
    BootstrapOpt,
    ConfigOpt,
    JsonOpt,
    bootstrap_of,
    console,
    err_console,
    errors_to_exit_codes,
    fail,
    load,
)
from cli.tables import Col, render

app = typer.Typer(help="Journals and underlying topics, read from Kafka: dump, grep, replay, "
                       "and the Spark report and audit. Every command works while kq serve "
                       "is down.", no_args_is_help=True)

SinceOpt = Annotated[str | None, typer.Option(
    "--since", help="From this time: ISO-8601 (UTC unless a zone is given), relative "
                    "(e.g. -15m, -2h, -1d) or epoch milliseconds.")]
UntilOpt = Annotated[str | None, typer.Option(
    "--until", help="Before this time (ISO-8601 or relative, as --since).")]


class Source:
    """What every journal command resolves first: config, address, Kafka settings."""

    def __init__(self, config: str | None, bootstrap: str | None) -> None:
        self.config: Config = load(config)
        self.bootstrap = bootstrap_of(bootstrap, self.config)
        self.kafka = dict(self.config.service.kafka)
        self.journal_topic = f"{self.config.service.topic_prefix}.journal"
        with errors_to_exit_codes():
            clients.check_reachable(self.bootstrap, self.kafka)

    def consumer(self) -> Any:
        return clients.consumer(self.bootstrap, self.kafka, **{"fetch.wait.max.ms": 50})


def _times(since: str | None, until: str | None) -> tuple[int | None, int | None]:
    now = int(time.time() * 1000)
    try:
        since_ms, until_ms = moment_ms(since, now), moment_ms(until, now)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        fail(f"--since {since} is not before --until {until}: nothing is in between",
             EXIT_USAGE)
    return since_ms, until_ms


@contextmanager
def _progress(spans: list[reading.Span], what: str) -> Iterator[reading.Progress | None]:
    """A progress bar on a terminal (on stderr: stdout stays clean for --json)."""
    if not err_console.is_terminal:
        yield None
        return
    total = sum(end - lo for _, _, lo, end in spans)
    with Progress(TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda topic, partition, n: bar.advance(task, n)


def _say_retained(c: Any, spans: list[reading.Span]) -> None:
    """On stderr (stdout stays clean for --json): from when the journal can answer."""
    note = reading.retained_from(c, spans)
    if note:
        err_console.print(f"[yellow]{note}", highlight=False)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


DUMP_COLUMNS = (Col("batch", number=True), Col("offset", number=True, drop=2),
                Col("at (UTC)", key=True), Col("kind"), Col("queue", key=True),
                Col("bookmark", key=True), Col("client", drop=3), Col("dlv", number=True),
                Col("cxl", number=True, drop=4), Col("reason", drop=1))


def _print_or_keep(items: Iterable[dict[str, Any]], json: bool) -> list[dict[str, Any]]:
    """With --json, print each item as a JSON line as it comes (nothing kept); otherwise
    keep them for the table."""
    if not json:
        return list(items)
    for item in items:
        sys.stdout.write(jsonlib.dumps(item) + "\n")
    return []


def _transition_cells(r: dict[str, Any]) -> tuple[str, ...]:
    return (str(r["batch"]), str(r["offset"]), _when(r["at_ms"]), r["kind"], r["queue"],
            r["bookmark"] or "-", r["client"] or "-", str(r["delivery_count"]),
            str(r["cancel_count"]), r["reason"] or "")


@app.command()
def dump(
    queue: Annotated[str | None, typer.Option(help="Only this queue's transitions.")] = None,
    kind: Annotated[list[str] | None, typer.Option(
        help="Only this kind (repeatable): enqueued, leased, sent, acked, returned, removed, "
             "released, subscribed, unsubscribed, configured, remembered, browsed, "
             "extended.")] = None,
    bookmark: Annotated[str | None, typer.Option(help="Only this message's transitions.")] = None,
    since: SinceOpt = None, until: UntilOpt = None,
    limit: Annotated[int | None, typer.Option(min=0, help="At most this many rows.")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Committed journal transitions, oldest first.

    A batch a crash cut between its parts is not shown (recovery ignores it too)."""
    since_ms, until_ms = _times(since, until)
    unknown = sorted(set(kind or ()) - {k.value for k in Kind})
    if unknown:
        fail(f"no kind {', '.join(unknown)}: the kinds are "
             f"{', '.join(k.value for k in Kind)}", EXIT_USAGE)
    if bookmark is not None:
        _bookmark(bookmark)
    src = Source(config, bootstrap_servers)
    if queue is not None and src.config.queue and queue not in {q.name for q in src.config.queue}:
        # not refused: the journal keeps the transitions of queues removed from the config
        err_console.print(f"kq: no queue {queue!r} in the config; showing what the journal "
                          "holds of it, if anything")
    wanted = RowFilter(queue, frozenset(kind or ()), bookmark, since_ms, until_ms)
    c = src.consumer()
    with errors_to_exit_codes():
        spans = reading.journal_spans(c, src.bootstrap, src.kafka, src.journal_topic)
        _say_retained(c, spans)
        with _progress(spans, "reading the journal") as progress:
            found = reading.journal_rows(c, spans, wanted, progress)
            rows = _print_or_keep(itertools.islice(found, limit), json)
    c.close()
    if not json:
        render(console, DUMP_COLUMNS, [_transition_cells(r) for r in rows])


def _bookmark(text: str) -> Bookmark:
    try:
        return Bookmark.parse(text)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


def _where(text: str | None) -> Any:
    try:
        return compile_expression(text) if text else None
    except ExpressionError as exc:
        fail(str(exc), EXIT_USAGE)


@app.command()
def grep(
    bookmark: Annotated[str | None, typer.Argument(
        help="TOPIC/PARTITION/OFFSET: show that record and its whole life in every queue.")]
    = None,
    where: Annotated[str | None, typer.Option(
        help="Without a bookmark: the records of --topics this expression matches, e.g. "
             "\"/sym = 'IBM' AND header('region') = 'EU'\".")] = None,
    topics: Annotated[str | None, typer.Option(help="Regex of underlying topics to search.")]
    = None,
    since: SinceOpt = None, until: UntilOpt = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """A bookmark's record and its whole life; or records of topics matching --where.

    With a BOOKMARK: its source record and every transition of it, in every queue that held
    it. With --topics REGEX [--where EXPR] [--since] [--until]: the records of those
    underlying topics that match, partition by partition (the amps-grep of kq)."""
    if bookmark is None and topics is None:
        fail("give a BOOKMARK, or --topics REGEX (with --where EXPR)", EXIT_USAGE)
    if bookmark is not None and (topics or where):
        fail("a BOOKMARK cannot be combined with --topics/--where", EXIT_USAGE)
    if bookmark is not None:
        _life(_bookmark(bookmark), Source(config, bootstrap_servers), json)
        return
    expr = _where(where)
    since_ms, until_ms = _times(since, until)
    src = Source(config, bootstrap_servers)
    c = src.consumer()
    with errors_to_exit_codes():
        names = reading.matching_topics(src.bootstrap, src.kafka, topics or "")
        if not names:  # (a typo, most likely: said, as replay says it)
            raise KqError(f"no topic matches --topics {topics!r}")
        spans = reading.spans(c, src.bootstrap, src.kafka, names)
        with _progress(spans, "searching") as progress:
            found = reading.topic_records(c, spans, since_ms, until_ms, expr, progress)
            rows = _print_or_keep((reading.message_json(rec) for rec in found), json)
    c.close()
    if not json:
        render(console, (Col("bookmark", key=True), Col("time (UTC)", key=True),
                         Col("key", drop=1), Col("value")),
               [(r["bookmark"], _when(r["timestamp_ms"]), str(r.get("key") or "-"),
                 str(r.get("value", r.get("value_b64")))) for r in rows])
        console.print(f"{len(rows)} record(s) matched in {len(names)} topic(s)")


def _fetch_one(bm: Bookmark, src: Source, c: Any) -> tuple[Any, str | None]:
    """`bm`'s record, or None and why Kafka cannot have it when its topic, partition or
    offsets say so (asked first: a fetch of what is not there waits for its whole timeout)."""
    partitions = clients.topic_partitions(clients.admin(src.bootstrap, src.kafka))
    if bm.topic not in partitions:
        return None, f"there is no topic {bm.topic}"
    if bm.partition >= partitions[bm.topic]:
        return None, f"{bm.topic} has {partitions[bm.topic]} partition(s), numbered from 0"
    low, high = clients.watermarks(c, bm.topic, bm.partition, src.bootstrap)
    if bm.offset < low:
        return None, f"deleted by retention: {bm.topic}/{bm.partition} holds offsets from {low}"
    # Past the end, looked for briefly all the same: some brokers (the embedded one) report
    # an end below the last records of a batch.
    found = fetch_records(c, [bm], timeout=10 if bm.offset < high else 2).get(bm)
    if found is None and bm.offset >= high:
        return None, f"past the end of {bm.topic}/{bm.partition}: its next offset is {high}"
    return found, None


def _life(bm: Bookmark, src: Source, json: bool) -> None:
    c = src.consumer()
    with errors_to_exit_codes():
        spans = reading.journal_spans(c, src.bootstrap, src.kafka, src.journal_topic)
        _say_retained(c, spans)
        with _progress(spans, "reading the journal") as progress:
            life = list(reading.journal_rows(c, spans, RowFilter(bookmark=str(bm)), progress))
        found, missing = _fetch_one(bm, src, c)
    c.close()
    record = None
    if found is not None:
        record = reading.message_json(found)
        del record["bookmark"]
    if json:
        sys.stdout.write(jsonlib.dumps({"bookmark": str(bm), "record": record,
                                        "life": life}) + "\n")
    else:
        if record is None:
            console.print(f"[yellow]{bm}: the record is not in Kafka "
                          f"({missing or 'deleted by retention?'})")
        else:
            console.print(f"[bold]{bm}[/] at {_when(record['timestamp_ms'])} UTC, key "
                          f"{record.get('key')!r}, headers "
                          f"{[(h['key'], h.get('value')) for h in record['headers']]}")
            console.print(record.get("value", record.get("value_b64")), highlight=False,
                          markup=False)
        # one bookmark's life: the bookmark is in the heading, not in every row
        bookmark_col = DUMP_COLUMNS.index(next(c for c in DUMP_COLUMNS if c.header == "bookmark"))
        render(console, [c for i, c in enumerate(DUMP_COLUMNS) if i != bookmark_col],
               [[x for i, x in enumerate(_transition_cells(r)) if i != bookmark_col]
                for r in life])
    if record is None and not life:
        raise typer.Exit(1)


@app.command("replay")
def replay_command(
    topics: Annotated[str, typer.Option(help="Regex of the underlying topics to replay.")],
    to: Annotated[str, typer.Option(help="The topic to publish into (created if missing, "
                                         "with as many partitions as the widest source).")],
    where: Annotated[str | None, typer.Option(help="Only records this expression matches.")]
    = None,
    since: SinceOpt = None, until: UntilOpt = None,
    dry_run: Annotated[bool, typer.Option(help="Count what would be published; publish "
                                               "nothing.")] = False,
    engine: Annotated[str, typer.Option(help="local (this process) or spark (Spark tasks, "
                                             "one per source partition).")] = "local",
    master: Annotated[str | None, typer.Option(help="Spark master URL (default local[*]).")]
    = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Re-publish records of underlying topics into another topic.

    Each record keeps its key, value and headers and gains kq-replayed-from:
    TOPIC/PARTITION/OFFSET; source partition P goes to partition P of --to, in order. Ends
    with {"matched", "published", "failed"} and exits 1 if anything failed."""
    if engine not in ("local", "spark"):
        fail(f"--engine must be local or spark, not {engine!r}", EXIT_USAGE)
    expr = _where(where)
    since_ms, until_ms = _times(since, until)
    src = Source(config, bootstrap_servers)
    with errors_to_exit_codes():
        names = reading.matching_topics(src.bootstrap, src.kafka, topics)
        if not names:
            raise KqError(f"no topic matches --topics {topics!r}")
        to_partitions = _destination(src, names, to, dry_run)
        if engine == "spark":
            from broker.pipeline.replay import replay_on_spark
            counts = replay_on_spark(src.bootstrap, src.kafka, topics, to, to_partitions,
                                     where, since_ms, until_ms, dry_run, master)
        else:
            counts = _replay_here(src, names, to, to_partitions, expr, since_ms, until_ms,
                                  dry_run, json)
    if json:
        sys.stdout.write(jsonlib.dumps(counts.as_dict()) + "\n")
    else:
        verb = "would publish" if dry_run else "published"
        console.print(f"matched {counts.matched}, {verb} "
                      f"{counts.matched if dry_run else counts.published}, failed "
                      f"{counts.failed} (into {to})")
    if counts.failed:
        raise typer.Exit(1)


def _destination(src: Source, names: list[str], to: str, dry_run: bool) -> int:
    counts = clients.topic_partitions(clients.admin(src.bootstrap, src.kafka))
    if to in names:
        raise ConfigError(f"--to {to} is one of the topics being replayed: choose another")
    if to not in counts:
        widest = max(counts[n] for n in names)
        if dry_run:
            return widest
        clients.ensure_topics(clients.admin(src.bootstrap, src.kafka), [to], widest)
        return widest
    return counts[to]


def _replay_here(src: Source, names: list[str], to: str, to_partitions: int, expr: Any,
                 since_ms: int | None, until_ms: int | None, dry_run: bool,
                 json: bool) -> ReplayCounts:
    c = src.consumer()
    spans = reading.spans(c, src.bootstrap, src.kafka, names)
    producer = clients.producer(src.bootstrap, src.kafka, **{"linger.ms": 20})
    with _progress(spans, "replaying") as progress:
        found = reading.topic_records(c, spans, since_ms, until_ms, expr, progress)
        counts = replay(producer, ((r.topic(), r.partition(), r.offset(), r.key(), r.value(),
                                    headers_of(r)) for r in found),
                        to, to_partitions, dry_run)
    c.close()
    return counts
