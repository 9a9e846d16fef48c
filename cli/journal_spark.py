"""`kq journal report` and `kq journal audit`: the journal commands that run on Spark."""

from __future__ import annotations

import json as jsonlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from broker.errors import KqError
from broker.history import reading
from cli.common import (
    BootstrapOpt,
    ConfigOpt,
    JsonOpt,
    console,
    err_console,
    errors_to_exit_codes,
)
from cli.journal import SinceOpt, Source, UntilOpt, _say_retained, _times, app
from cli.tables import Col, render

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
        c = src.consumer()
        _say_retained(c, reading.journal_spans(c, src.bootstrap, src.kafka, src.journal_topic))
        c.close()
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
                  f"written to {out.rstrip('/')}/ (summary.json, messages/, per_minute/, "
                  "report.png)")
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
    exact. With several shards, each shard answers as of a batch of its own partition and
    is compared with its own queues' journal. Where retention deleted the journal's head, a
    shard's state is continued from its newest stored snapshot instead of rebuilt from
    nothing (as a restore does). Each difference names queue, bookmark, field, the
    journal's value and the service's. Exit 0 when there is none, 1 otherwise."""
    from broker.client import QueueClient

    src = Source(config, bootstrap_servers)
    with errors_to_exit_codes():
        bases = _bases(src)
        with QueueClient(src.bootstrap, name="kq-cli", kafka_config=src.kafka,
                         topic_prefix=src.config.service.topic_prefix,
                         request_timeout=timeout) as client:
            snapshot = client.query(what="snapshot")
        _behind(snapshot, bases)
        from broker.pipeline.audit import audit as run_audit
        from broker.pipeline.report import journal_frame
        from broker.pipeline.session import spark_session

        with _spinner("rebuilding the state on Spark, as of the service's snapshot"):
            spark = spark_session(master, "kq journal audit")
            frame = journal_frame(spark, src.bootstrap, src.config.service.topic_prefix,
                                  src.kafka, None, None, None)
            result = run_audit(spark, frame, snapshot, bases)
        _still_there(src, snapshot, bases)
    if json:
        sys.stdout.write(jsonlib.dumps(result) + "\n")
    elif not result["differences"]:
        console.print(f"no differences: {result['queues']} queue(s), {result['messages']} "
                      f"message(s), as of {_as_of(result['batches'])}")
    else:
        render(console, (Col("queue", key=True), Col("bookmark", key=True), Col("field"),
                         Col("journal"), Col("service")),
               [(d["queue"], d["bookmark"] or "-", d["field"], str(d["journal"]),
                 str(d["service"])) for d in result["differences"]])
        console.print(f"[red]{len(result['differences'])} difference(s)[/] "
                      f"({result['differing_messages']} message(s)) as of "
                      f"{_as_of(result['batches'])}")
    if result["differences"]:
        raise typer.Exit(1)


def _bases(src: Source) -> dict[int, dict[str, Any]]:
    """Per shard whose journal's head is gone: the stored snapshot to continue from."""
    from broker.history.snapshot_base import audit_base, journal_start

    c = src.consumer()
    try:
        bases = {}
        for n in range(src.config.service.shards):
            start = journal_start(c, src.config, n)
            if start > 0:
                bases[n] = audit_base(c, src.config, n)
                err_console.print(
                    f"shard {n}: the journal starts at offset {start} (retention deleted the "
                    f"records before): audited from snapshot {bases[n]['snapshot']} (journal "
                    f"offset {bases[n]['after_offset']}) and the journal after it")
        return bases
    finally:
        c.close()


def _behind(answer: dict[str, Any], bases: dict[int, dict[str, Any]]) -> None:
    """A service whose state is older than a stored snapshot (it restored from an older
    one meanwhile?) cannot be compared with it."""
    for shard in answer.get("shards", [answer]):
        n = int(shard.get("shard", 0))
        if n in bases and bases[n]["batch"] > int(shard["batch"]):
            raise KqError(f"shard {n}: the service's state (journal batch {shard['batch']}) is "
                          f"older than snapshot {bases[n]['snapshot']} (batch "
                          f"{bases[n]['batch']}): run the audit again")


def _still_there(src: Source, answer: dict[str, Any], bases: dict[int, dict[str, Any]]) -> None:
    """Fail when retention deleted journal records the audit needed while it read them (a
    journal kept for less than the audit takes): its comparison would be of a part."""
    from broker.history.snapshot_base import deleted_while_read

    c = src.consumer()
    try:
        shards = [int(s.get("shard", 0)) for s in answer.get("shards", [answer])]
        problem = deleted_while_read(c, src.config, shards, bases)
    finally:
        c.close()
    if problem:
        raise KqError(problem)


def _as_of(batches: list[dict[str, int]]) -> str:
    if len(batches) == 1:
        return f"journal batch {batches[0]['batch']}"
    return "journal batches " + ", ".join(f"{b['batch']} (shard {b['shard']})" for b in batches)
