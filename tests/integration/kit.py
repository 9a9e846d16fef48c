"""Helpers for integration tests: a service in a thread, producers, readers, waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Producer, TopicPartition

from broker.config import parse_config
from broker.kafka import clients
from broker.service.instance import STOP_WITHIN_S
from broker.service.service import Service

T = TypeVar("T")


def uid() -> str:
    return uuid.uuid4().hex[:8]


def wait_for(condition: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def config(prefix: str, data_dir: str, queues: list[dict[str, Any]], **service: Any) -> Any:
    return parse_config({
        "service": {"topic_prefix": prefix, "data_dir": data_dir, "metrics_port": 0, **service},
        "queue": queues,
    })


@contextmanager
def running_service(bootstrap: str, cfg: Any) -> Iterator[Service]:
    service = Service(cfg, bootstrap)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # surfaced to the test below
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: service.ready.is_set() or failure, 30, "the service to start")
    if failure:
        raise failure[0]
    try:
        yield service
    finally:
        service.stop()
        thread.join(15)
    if failure:
        raise failure[0]


def publish(bootstrap: str, topic: str, values: list[bytes], key: bytes | None = None,
            headers: list[tuple[str, bytes]] | None = None) -> list[str]:
    """Produce with a plain confluent producer; return the bookmarks."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    out: list[str] = []
    for v in values:
        p.produce(topic, v, key, headers=headers,
                  on_delivery=lambda e, m: out.append(f"{m.topic()}/{m.partition()}/{m.offset()}"))
    assert p.flush(10) == 0
    return out


def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 10.0) -> list[Any]:
    """Read `count` records from every partition of `topic`, from the start."""
    c = clients.consumer(bootstrap)
    parts = wait_for(lambda: clients.topic_partitions(clients.admin(bootstrap)).get(topic),
                     timeout, f"topic {topic}")
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got.extend(r for r in c.consume(100, 0.1) if not r.error())
    c.close()
    return got


def drain(sub: Any, count: int, timeout: float = 10.0) -> list[Any]:
    """Take `count` messages from a subscription without acking them."""
    got: list[Any] = []
    for msg in sub.messages(timeout=timeout):
        got.append(msg)
        if len(got) >= count:
            break
    return got


def ensure_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    clients.ensure_topics(clients.admin(bootstrap), [topic], partitions)


# -- `kq serve` as a subprocess --------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
KQ = [sys.executable, "-m", "cli.main"]


def kq(*args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the `kq` CLI and capture what it prints."""
    return subprocess.run([*KQ, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200", **env})


def write_config(path: Path, prefix: str, queues: list[str], data_dir: Path,
                 bootstrap: str | None = None, extra: str = "", service: str = "") -> Path:
    """A config file with one line per queue; `extra` lines go into the last queue,
    `service` lines into [service]."""
    defaults = ["metrics_port = 0", 'heartbeat_timeout = "30s"',
                # a killed instance's shard returns after its group session expires: keep
                # the restarts of crash tests short
                'session_timeout = "3s"']
    given = {line.split("=")[0].strip() for line in service.splitlines()}
    lines = ["[service]", f'topic_prefix = "{prefix}"', f'data_dir = "{data_dir}"',
             *(d for d in defaults if d.split("=")[0].strip() not in given),
             *service.splitlines()]
    if bootstrap:
        lines.append(f'bootstrap_servers = "{bootstrap}"')
    for q in queues:
        lines += ["[[queue]]", f'name = "{q}"']
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class ServeProcess:
    """`kq serve --config CFG` in a subprocess, logging to LOG; started by `start()`."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path, self.log_path = config_path, log_path
        self.proc: subprocess.Popen[str] | None = None

    def _starts(self) -> int:
        return self.log_path.read_text().count("ready:") if self.log_path.exists() else 0

    def start(self, wait_ready: bool = True, **env: str) -> ServeProcess:
        before = self._starts()
        log = open(self.log_path, "a")  # noqa: SIM115
        self.proc = subprocess.Popen([*KQ, "serve", "--config", str(self.config_path)],
                                     cwd=ROOT, text=True, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        if wait_ready:
            wait_for(lambda: self._starts() > before or self.proc.poll() is not None, 30,
                     "kq serve to be ready")
            assert self.proc.poll() is None, self.log_path.read_text()
        return self

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:  # kq's own bound on a clean stop, and the interpreter's exit beyond it
            return self.proc.wait(STOP_WITHIN_S + 15)
        except subprocess.TimeoutExpired:  # never left running behind a test
            self.proc.kill()
            self.proc.wait()
            raise


@contextmanager
def serving_one_queue(bootstrap: str, tmp_path: Path, stem: str, extra: str = "",
                      service: str = "") -> Iterator[tuple[str, Path, str, ServeProcess]]:
    """A fresh topic and prefix, one queue on it (`extra` config lines), `kq serve` running:
    yields (queue name, config path, topic prefix, the service process)."""
    u = uid()
    name = f"{stem}_{u}"
    ensure_topic(bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap,
                       extra=extra, service=service)
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        yield name, cfg, f"kq{u}", serve
    finally:
        serve.stop()
