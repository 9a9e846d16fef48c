"""`kq journal ...`: dump, grep, replay, report and audit, from Kafka alone (they work while
`kq serve` is down). Report, audit and `replay --engine spark` run on Spark."""

from __future__ import annotations

import json as jsonlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from broker.config import Config
from broker.errors import ExpressionError, KqError
from broker.expr import compile_expression
from broker.history import reading
from broker.history.journal import RowFilter
from broker.history.replay import ReplayCounts, replay
from broker.history.times import moment_ms
from broker.kafka import clients
from broker.kafka.fetch import fetch_records
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
    "--since", help="From this time: ISO-8601 (UTC unless a zone is given) or relative, "
                    "e.g. -15m, -2h, -1d.")]
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
        return moment_ms(since, now), moment_ms(until, now)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


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


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


DUMP_COLUMNS = (Col("batch", number=True), Col("offset", number=True, drop=2),
                Col("at (UTC)", key=True), Col("kind"), Col("queue", key=True),
                Col("bookmark", key=True), Col("client", drop=3), Col("dlv", number=True),
                Col("cxl", number=True, drop=4), Col("reason", drop=1))


@app.command()
def dump(
    queue: Annotated[str | None, typer.Option(help="Only this queue's transitions.")] = None,
    kind: Annotated[list[str] | None, typer.Option(
        help="Only this kind (repeatable): enqueued, leased, sent, acked, returned, removed, "
             "released, subscribed, unsubscribed, configured, remembered, browsed.")] = None,
    bookmark: Annotated[str | None, typer.Option(help="Only this message's transitions.")] = None,
    since: SinceOpt = None, until: UntilOpt = None,
    limit: Annotated[int | None, typer.Option(help="At most this many rows.")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Committed journal transitions, oldest first.

    A batch a crash cut between its parts is not shown (recovery ignores it too)."""
    since_ms, until_ms = _times(since, until)
    if bookmark is not None:
        _bookmark(bookmark)
    src = Source(config, bootstrap_servers)
    wanted = RowFilter(queue, frozenset(kind or ()), bookmark, since_ms, until_ms)
    c = src.consumer()
    rows = []
    with errors_to_exit_codes():
        spans = reading.journal_spans(c, src.bootstrap, src.kafka, src.journal_topic)
        with _progress(spans, "reading the journal") as progress:
            for shown, row in enumerate(reading.journal_rows(c, spans, wanted, progress)):
                if limit is not None and shown >= limit:
                    break
                if json:
                    sys.stdout.write(jsonlib.dumps(row) + "\n")
                else:
                    rows.append(row)
    c.close()
    if not json:
        render(console, DUMP_COLUMNS, [
            (str(r["batch"]), str(r["offset"]), _when(r["at_ms"]), r["kind"], r["queue"],
             r["bookmark"] or "-", r["client"] or "-", str(r["delivery_count"]),
             str(r["cancel_count"]), r["reason"] or "") for r in rows])


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
    rows: list[dict[str, Any]] = []
    with errors_to_exit_codes():
        names = reading.matching_topics(src.bootstrap, src.kafka, topics or "")
        spans = reading.spans(c, src.bootstrap, src.kafka, names)
        with _progress(spans, "searching") as progress:
            for rec in reading.topic_records(c, spans, since_ms, until_ms, expr, progress):
                found = reading.message_json(rec)
                if json:
                    sys.stdout.write(jsonlib.dumps(found) + "\n")
                else:
                    rows.append(found)
    c.close()
    if not json:
        render(console, (Col("bookmark", key=True), Col("time (UTC)", key=True),
                         Col("key", drop=1), Col("value")),
               [(r["bookmark"], _when(r["timestamp_ms"]), str(r.get("key") or "-"),
                 str(r.get("value", r.get("value_b64")))) for r in rows])
        console.print(f"{len(rows)} record(s) matched in {len(names)} topic(s)")


def _life(bm: Bookmark, src: Source, json: bool) -> None:
    c = src.consumer()
    with errors_to_exit_codes():
        spans = reading.journal_spans(c, src.bootstrap, src.kafka, src.journal_topic)
        with _progress(spans, "reading the journal") as progress:
            life = list(reading.journal_rows(c, spans, RowFilter(bookmark=str(bm)), progress))
        found = fetch_records(c, [bm], timeout=10).get(bm)
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
            console.print(f"[yellow]{bm}: the record is not in Kafka (deleted by retention?)")
        else:
            console.print(f"[bold]{bm}[/] at {_when(record['timestamp_ms'])} UTC, key "
                          f"{record.get('key')!r}, headers "
                          f"{[(h['key'], h.get('value')) for h in record['headers']]}")
            console.print(record.get("value", record.get("value_b64")), highlight=False,
                          markup=False)
        render(console, DUMP_COLUMNS, [
            (str(r["batch"]), str(r["offset"]), _when(r["at_ms"]), r["kind"], r["queue"],
             r["bookmark"] or "-", r["client"] or "-", str(r["delivery_count"]),
             str(r["cancel_count"]), r["reason"] or "") for r in life])
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
        raise KqError(f"--to {to} is one of the topics being replayed")
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
                                    clients.headers_of(r)) for r in found),
                        to, to_partitions, dry_run)
    c.close()
    return counts


MasterOpt = Annotated[str | None, typer.Option(
    help="Spark master URL, e.g. spark://host:7077 (default local[*]: this machine's cores).")]


@app.command()
def report(
    out: Annotated[str, typer.Option(help="Directory for summary.json, messages/, "
                                          "per_minute/ and report.png.")],
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    since: SinceOpt = None, until: UntilOpt = None, master: MasterOpt = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """What happened to each queue's messages, computed on Spark from the journal.

    Per queue: enqueued, acked, removed by reason, redelivered, a histogram of deliveries,
    enqueue-to-ack latency p50/p90/p99, and per subscriber acks and mean processing time.
    Writes OUT/summary.json, Parquet OUT/messages/ and OUT/per_minute/, and OUT/report.png."""
    _times(since, until)  # refuse a bad time before starting Spark
    src = Source(config, bootstrap_servers)
    with errors_to_exit_codes():
        from pathlib import Path

        from broker.pipeline.report import REPORT_COLUMNS, journal_frame, run_report
        from broker.pipeline.session import spark_session

        with _spinner("starting Spark and reading the journal"):
            spark = spark_session(master, "kq journal report")
            frame = journal_frame(spark, src.bootstrap, src.config.service.topic_prefix,
                                  src.kafka, queue, since, until, REPORT_COLUMNS)
            summary = run_report(spark, frame, Path(out))
    if json:
        sys.stdout.write(jsonlib.dumps(summary) + "\n")
        return
    _show_summary(summary, out)


@contextmanager
def _spinner(what: str) -> Iterator[None]:
    if not err_console.is_terminal:
        yield
        return
    with err_console.status(what):
        yield


def _show_summary(summary: dict[str, Any], out: str) -> None:
    console.print(f"[bold]{summary['records']:,}[/] transitions in {summary['seconds']:.1f} s; "
                  f"written to {out}/ (summary.json, messages/, per_minute/, report.png)")
    rows = []
    for name, q in sorted(summary["queues"].items()):
        lat = q["latency_ms"]
        removed = ", ".join(f"{r} {n}" for r, n in sorted(q["removed"].items())) or "-"
        rows.append((name, str(q["enqueued"]), str(q["acked"]), removed, str(q["redelivered"]),
                     "/".join("-" if lat[k] is None else f"{lat[k]:.0f}"
                              for k in ("p50", "p90", "p99"))))
    render(console, (Col("queue", key=True), Col("enq", number=True), Col("acked", number=True),
                     Col("removed"), Col("redlv", number=True),
                     Col("ms p50/p90/p99", number=True)), rows)
    for name, q in sorted(summary["queues"].items()):
        hist = " ".join(f"{k}x:{v}" for k, v in q["deliveries_histogram"].items())
        subs = ", ".join(f"{c} {s['acked']} acks ({s['mean_processing_ms'] or 0:.0f} ms)"
                         for c, s in sorted(q["subscribers"].items()))
        console.print(f"[bold]{name}[/] deliveries {hist or '-'}; subscribers: {subs or '-'}")


@app.command()
def audit(
    master: MasterOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the service's "
                                                "snapshot.")] = 120.0,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Rebuild every queue's state from the journal on Spark and compare it with the live
    service.

    The service answers with its state between two batches and says which journal batch it
    reflects; the journal is replayed up to that batch, so the audit of a busy service is
    exact. Each difference names queue, bookmark, field, the journal's value and the
    service's. Exit 0 when there is none, 1 otherwise."""
    from broker.client import QueueClient

    src = Source(config, bootstrap_servers)
    with errors_to_exit_codes():
        with QueueClient(src.bootstrap, name="kq-cli", kafka_config=src.kafka,
                         topic_prefix=src.config.service.topic_prefix,
                         request_timeout=timeout) as client:
            snapshot = client.query(what="snapshot")
        from broker.pipeline.audit import audit as run_audit
        from broker.pipeline.report import journal_frame
        from broker.pipeline.session import spark_session

        with _spinner(f"rebuilding the state at batch {snapshot['batch']} on Spark"):
            spark = spark_session(master, "kq journal audit")
            frame = journal_frame(spark, src.bootstrap, src.config.service.topic_prefix,
                                  src.kafka, None, None, None)
            result = run_audit(spark, frame, snapshot)
    if json:
        sys.stdout.write(jsonlib.dumps(result) + "\n")
    elif not result["differences"]:
        console.print(f"no differences: {result['queues']} queue(s), {result['messages']} "
                      f"message(s), as of journal batch {result['batch']}")
    else:
        render(console, (Col("queue", key=True), Col("bookmark", key=True), Col("field"),
                         Col("journal"), Col("service")),
               [(d["queue"], d["bookmark"] or "-", d["field"], str(d["journal"]),
                 str(d["service"])) for d in result["differences"]])
        console.print(f"[red]{len(result['differences'])} difference(s)[/] "
                      f"({result['differing_messages']} message(s)) as of journal batch "
                      f"{result['batch']}")
    if result["differences"]:
        raise typer.Exit(1)
