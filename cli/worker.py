"""`kq worker MODULE:FUNCTION`: run a handler per message of a queue (broker.client.worker)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType
from typing import Annotated

import typer

from broker.client import QueueClient
from broker.client.worker import Worker, load_handler
from broker.errors import ConfigError
from broker.values import Duration
from cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    BootstrapOpt,
    ConfigOpt,
    bootstrap_of,
    errors_to_exit_codes,
    fail,
    load,
)


class StoppedBeforeSubscribing(Exception):
    """SIGTERM or Ctrl-C while the worker waited for its subscription."""


def worker(
    handler: Annotated[str, typer.Argument(
        help="The handler, MODULE:FUNCTION (e.g. jobs:resize): a plain or async function "
             "taking a Message. Returning acks the message; raising cancels it.")],
    queue: Annotated[str, typer.Option("--queue", "-q", help="Queue to work on.")],
    concurrency: Annotated[int, typer.Option(min=1, help="Handlers running at once (threads).")
                           ] = 1,
    filter: Annotated[str | None, typer.Option(
        "--filter", help="Only messages this expression matches, e.g. \"/kind = 'resize'\".")
    ] = None,
    max_backlog: Annotated[int | None, typer.Option(
        min=1, help="Messages leased at once (default: --concurrency).")] = None,
    grace: Annotated[str, typer.Option(
        help="On SIGTERM or Ctrl-C: how long running handlers may take to finish.")] = "30s",
    name: Annotated[str | None, typer.Option(help="Client name (default: unique).")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None,
) -> None:
    """Run HANDLER for every message of a queue, CONCURRENCY at a time. On SIGTERM or Ctrl-C
    it takes nothing new, lets running handlers finish within --grace, and closes: messages
    not finished go back to the queue at once."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    cfg = load(config)
    try:
        grace_s = Duration.parse(grace).ms / 1000
        function = load_handler(handler)
    except (ValueError, ConfigError) as exc:
        fail(str(exc) if isinstance(exc, ConfigError) else f"--grace: {exc}", EXIT_USAGE)
    with errors_to_exit_codes():
        client = QueueClient(bootstrap_of(bootstrap_servers, cfg), name=name,
                             topic_prefix=cfg.service.topic_prefix,
                             kafka_config=dict(cfg.service.kafka))
        work = Worker(client, queue, function, concurrency, filter, max_backlog, grace_s)

        def stop(signum: int, frame: FrameType | None) -> None:
            if work._stop.is_set():  # asked twice: do not wait for the handlers
                os._exit(EXIT_FAILURE)
            logging.getLogger("kq.worker").info("%s: stopping", signal.Signals(signum).name)
            work.stop()
            if not work.subscribed:
                # still waiting for the service's answer (there may be none): nothing is
                # taken yet, so stop now, not at the request timeout (`run` closes the client)
                raise StoppedBeforeSubscribing

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            work.run()
        except StoppedBeforeSubscribing:
            logging.getLogger("kq.worker").info("stopped before the subscription was made")
    logging.getLogger("kq.worker").info("stopped: %d handled, %d failed", work.handled,
                                        work.failed)
    if work.unfinished:
        sys.stderr.flush()
        os._exit(EXIT_FAILURE)  # the handler threads still running cannot be waited for
