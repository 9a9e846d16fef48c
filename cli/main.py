"""The `kq` Typer app: thin commands that parse, call broker code and render."""

from __future__ import annotations

from typing import Annotated

import typer

import broker

# journal_spark adds the Spark commands (report, audit) to journal.app
from cli import inspect, journal, journal_spark, manual, serve, worker  # noqa: F401

app = typer.Typer(
    name="kq",
    help="Message-queue semantics on Kafka: run the service, inspect queues, publish, consume.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"kq {broker.__version__} (kafka-queues)")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print kq's version and exit.")]
         = False) -> None:
    """Message-queue semantics on Kafka: run the service, inspect queues, publish, consume."""


app.command()(serve.serve)
app.command()(serve.broker)
app.command()(inspect.queues)
app.command()(inspect.inspect)
app.command()(inspect.subscribers)
app.command()(inspect.instances)
app.command("recovery-points")(inspect.recovery_points)
app.command()(manual.publish)
app.command()(manual.consume)
app.command()(manual.ack)
app.command()(worker.worker)
app.add_typer(journal.app, name="journal")

if __name__ == "__main__":
    app()
