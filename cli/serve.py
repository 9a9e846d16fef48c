"""`kq serve` and `kq broker`."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from broker.errors import StateError
from broker.kafka.apache import SUPER_USER, ApacheKafka, ApacheKafkaError
from broker.kafka.embedded import EmbeddedBroker, EmbeddedBrokerError
from broker.service_config import INSTANCE_NAME
from cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    BootstrapOpt,
    ConfigOpt,
    bootstrap_of,
    console,
    err_console,
    errors_to_exit_codes,
    fail,
    load,
)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
EMBEDDED_NOTE = "embedded broker (memory storage: its topics are gone when it stops)"


def _forget_stale_state(data_dir: Path) -> None:
    """A new embedded broker starts empty, so state kept for an earlier one describes topics
    that no longer exist; keeping it would only make the service refuse to start."""
    if any((d / "CURRENT").is_file() for d in [data_dir, *data_dir.glob("shard-*")]):
        shutil.rmtree(data_dir)
        console.print(f"kq: cleared {data_dir}: it held the state of an earlier embedded broker")


def _login(text: str) -> tuple[str, str]:
    name, sep, password = text.partition(":")
    if not sep or not name or not password:
        fail(f"--user {text!r}: expected NAME:PASSWORD", EXIT_USAGE)
    return name, password


def _on_signals(stop: threading.Event | None = None, action=None) -> None:  # noqa: ANN001
    def handler(signum: int, frame: object) -> None:
        if action is not None:
            action()
        if stop is not None:
            stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def serve(
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    broker_port: Annotated[int, typer.Option(min=1, max=65535, help=(
        "Port of the embedded broker, when one is started (no bootstrap servers given)."))
    ] = 9092,
    data_dir: Annotated[str | None, typer.Option(
        envvar="KQ_DATA_DIR", help="Where RocksDB keeps the state (overrides the config's "
                                   "data_dir).")] = None,
    instance: Annotated[str | None, typer.Option(
        envvar="KQ_INSTANCE", help="This instance's name among those sharing the shards "
                                   "(overrides the config's [service] instance).")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Run the queue service. With no bootstrap servers it starts the embedded broker.

    Several instances with one config (each with its own data_dir and instance name) share
    the shards: Kafka's group protocol gives each shard to one of them."""
    from broker import compiled
    from broker.service.instance import Instance
    from broker.service.memory import map_large_blocks

    if log_level.upper() not in LOG_LEVELS:
        fail(f"bad --log-level {log_level!r}: use one of {', '.join(LOG_LEVELS)}", 2)
    map_large_blocks()
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kq.serve").info("%s", compiled.describe())
    cfg = load(config)
    overrides = {k: v for k, v in (("data_dir", data_dir), ("instance", instance)) if v}
    if instance and not re.match(INSTANCE_NAME, instance):  # (model_copy checks nothing)
        fail(f"bad --instance {instance!r}: use 1-200 of A-Z a-z 0-9 . _ -", 2)
    if overrides:
        cfg = cfg.model_copy(update={"service": cfg.service.model_copy(update=overrides)})
    if not cfg.queue:
        fail("the config defines no [[queue]]; nothing to serve", 2)
    try:
        Path(cfg.service.data_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"[service] data_dir {cfg.service.data_dir}: cannot create it ({exc.strerror})", 2)
    bootstrap = (cfg.service.bootstrap_servers if bootstrap_servers is None
                 else bootstrap_of(bootstrap_servers, cfg))  # none: the embedded broker
    embedded: EmbeddedBroker | None = None
    if bootstrap is None:
        try:
            embedded = EmbeddedBroker(port=broker_port).start()
        except EmbeddedBrokerError as exc:
            fail(f"cannot start the embedded broker: {exc}")
        bootstrap = embedded.bootstrap_servers
        console.print(f"kq: started the {EMBEDDED_NOTE} at [bold]{bootstrap}[/]")
        _forget_stale_state(Path(cfg.service.data_dir))
    service = Instance(cfg, bootstrap)
    _on_signals(action=service.stop)
    svc = cfg.service
    # (said before Kafka is reached: an unreachable one is an error of its own, exit 3)
    console.print(f"kq: instance {svc.instance} starting: {len(cfg.queue)} queue(s) in "
                  f"{svc.shards} shard(s), Kafka at [bold]{bootstrap}[/], state in "
                  f"{svc.data_dir}", highlight=False)
    for q in cfg.queue:
        console.print(f"  {q.name:<24} shard {cfg.shard_of(q.name):<3} topics "
                      f"{q.topic_regex.pattern:<32} {q.semantics}, fairness "
                      f"{q.effective_fairness}", highlight=False)
    try:
        try:
            service.metrics.serve(cfg.service.metrics_port)
        except OSError as exc:
            fail(f"[service] metrics_port {cfg.service.metrics_port}: {exc.strerror}", 2)
        with errors_to_exit_codes():
            service.run()
    except StateError as exc:
        fail(str(exc), EXIT_FAILURE)
    finally:
        if embedded is not None:
            embedded.stop()
    if service.unfinished:
        # Their threads may still be inside Kafka or RocksDB calls: leave now, as a crash
        # would, rather than run the interpreter's teardown under them.
        err_console.print(f"kq: stopped without finishing shard(s) "
                          f"{', '.join(map(str, service.unfinished))}; a restart recovers "
                          "them from the journal")
        logging.shutdown()
        os._exit(EXIT_FAILURE)
    if not service.left_group:  # its close still runs in librdkafka: not under a teardown
        console.print("kq: stopped (still a member of the group: its shards move to the "
                      "other instances after session_timeout)")
        logging.shutdown()
        os._exit(0)
    console.print("kq: stopped")


def broker(
    port: Annotated[int, typer.Option(min=1, max=65535,
                                      help="Port for Kafka clients (127.0.0.1).")] = 9092,
    apache: Annotated[bool, typer.Option(
        "--apache", help="Run a single-node Apache Kafka (KRaft) instead of the embedded "
        "broker: needs Java 17 and Maven; its jars are fetched once into KQ_KAFKA_HOME.")] = False,
    sasl: Annotated[bool, typer.Option(
        "--sasl", help="With --apache: add a SASL/PLAIN listener whose requests are checked "
        "against ACLs (user admin, a super user, password admin-secret; more with --user).")]
        = False,
    user: Annotated[list[str] | None, typer.Option(
        "--user", help="With --sasl: a SASL/PLAIN login NAME:PASSWORD (repeatable).")] = None,
) -> None:
    """Run only a broker until Ctrl-C or SIGTERM: the embedded Kafka-compatible one, or with
    --apache a single-node Apache Kafka whose data lives in a temporary directory."""
    if (sasl or user) and not apache:
        fail("--sasl and --user need --apache: the embedded broker has no SASL", EXIT_USAGE)
    stop = threading.Event()
    _on_signals(stop)
    running: EmbeddedBroker | ApacheKafka
    try:
        if apache:
            users = dict(_login(u) for u in user or []) if sasl or user else None
            running = ApacheKafka(port=port, sasl_users=users).start(
                say=lambda line: console.print(f"kq: {line}"))
        else:
            running = EmbeddedBroker(port=port).start()
    except (EmbeddedBrokerError, ApacheKafkaError) as exc:
        fail(f"cannot start the broker: {exc}")
    if isinstance(running, ApacheKafka):
        console.print(f"kq: Apache Kafka {running.version} listening at "
                      f"[bold]{running.bootstrap_servers}[/] (started in "
                      f"{running.started_in_s:.1f} s; data in {running.data_dir}, deleted when "
                      "it stops); Ctrl-C stops it")
        if running.sasl_port is not None:
            console.print(f"kq: SASL/PLAIN with ACLs at [bold]{running.sasl_bootstrap_servers}[/]"
                          f" (super user {SUPER_USER})")
    else:
        console.print(f"kq: {EMBEDDED_NOTE} listening at [bold]{running.bootstrap_servers}[/]; "
                      "Ctrl-C stops it")
    try:
        while not stop.wait(0.5):
            if running.exit_code() is not None:
                fail("the broker exited unexpectedly")
    finally:
        running.stop()
    console.print("kq: broker stopped")
