"""A broker process run under the guard (`broker.kafka.guard`), so that it stops with its owner.

Both brokers kq starts itself, the embedded one and a single-node Apache Kafka, are started,
stopped and crashed the same way: this module is that way, written once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


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


class GuardedProcess:
    """One command under the guard, holding the write end of the guard's stdin: if this
    process dies, even by SIGKILL, the command stops too instead of keeping its port."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None,
                 log_path: Path | None = None, remove: Path | None = None):
        self.argv, self.env, self.log_path, self.remove = argv, env, log_path, remove
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out: Any = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        guard = [sys.executable, "-m", "broker.kafka.guard"]
        if self.remove is not None:
            guard += ["--remove", str(self.remove)]
        self._proc = subprocess.Popen(
            guard + self.argv, env=self.env, stdin=subprocess.PIPE, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
        if out is not subprocess.DEVNULL:
            out.close()  # the child has its own copy

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        """None while it runs (or was never started); its status once it has exited."""
        return self._proc.poll() if self._proc is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
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
        """SIGKILL to the guard and the command at once: a crash."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc.pid)
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()


def wait_listening(process: GuardedProcess, host: str, port: int, timeout: float,
                   what: str) -> str | None:
    """Wait until `port` accepts connections; the reason it did not, or None."""
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        code = process.exit_code()
        if code is not None:
            return f"{what} exited with {code}"
        if time.monotonic() > deadline:
            return f"{what} did not listen within {timeout:g}s"
        time.sleep(0.05)
    return None
