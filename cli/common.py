"""What every command shares: options, resolving the config and address, exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from broker.config import Config, load_config
from broker.config_fields import check_bootstrap
from broker.errors import CommandError, ConfigError, KafkaUnavailableError, KqError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

console = Console()
err_console = Console(stderr=True)

BootstrapOpt = Annotated[str | None, typer.Option(
    "--bootstrap-servers", "-b", envvar="KQ_BOOTSTRAP_SERVERS",
    help="Kafka bootstrap servers (host:port,...). Default: the config's, else "
         f"{DEFAULT_BOOTSTRAP}.")]
ConfigOpt = Annotated[str | None, typer.Option(
    "--config", "-c", envvar="KQ_CONFIG", help="Path of the kq TOML config file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def load(config_path: str | None) -> Config:
    if config_path is None:
        return Config()
    try:
        return load_config(config_path)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)


def bootstrap_of(option: str | None, config: Config) -> str:
    if option is not None:  # given, even empty: checked, not passed over for the config's
        try:
            return check_bootstrap(option)
        except ValueError as exc:
            fail(f"--bootstrap-servers: {exc}", EXIT_USAGE)
    return config.service.bootstrap_servers or DEFAULT_BOOTSTRAP


@contextmanager
def errors_to_exit_codes() -> Iterator[None]:
    """Map kq's errors onto the CLI's exit codes, with a message that names the cause."""
    try:
        yield
    except KafkaUnavailableError as exc:
        fail(str(exc), EXIT_UNREACHABLE)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except CommandError as exc:
        # what the CLI sends is what the user typed (a queue, an expression, a state name):
        # a refusal of it is a usage error, whichever side found it
        fail(f"the service refused: {exc}", EXIT_USAGE)
    except KqError as exc:
        fail(str(exc))
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SPARK_EXTRA:
            raise
        fail(f"this command runs on Spark, which is not installed here (no module "
             f"{exc.name!r}): pip install 'kafka-queues[spark]'")


# the modules of the [spark] extra (pyproject.toml), which `kq serve` never needs
SPARK_EXTRA = frozenset({"pyspark", "pyarrow", "pandas", "numpy", "matplotlib"})


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


T = TypeVar("T")


def age(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def call(fn: Callable[[], T]) -> T:
    with errors_to_exit_codes():
        return fn()
    raise AssertionError("unreachable")
