"""Start `kq serve` many times in a row on a freshly formatted Apache Kafka: none may crash.

    python ops/starts.py [--starts 100] [--bootstrap HOST:PORT]

Each start uses a topic prefix nobody used, so it creates its topics and reads them at once
(what crashed about one start in ten before kq waited for new topics' leaders). A start
counts as clean when the service logs "ready:" and stops with exit 0 on SIGTERM. Without
--bootstrap, a single-node Apache Kafka is started (`kq broker --apache`) and formatted fresh.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.kafka import clients  # noqa: E402
from broker.kafka.apache import ApacheKafka  # noqa: E402


@contextlib.contextmanager
def apache_or(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with ApacheKafka() as kafka:
        print(f"Apache Kafka {kafka.version} formatted and started in "
              f"{kafka.started_in_s:.1f} s at {kafka.bootstrap_servers}", flush=True)
        yield kafka.bootstrap_servers


def one_start(bootstrap: str, tmp: Path, n: int) -> tuple[bool, float, str]:
    """(clean, seconds to ready, the log's tail when not clean)."""
    u = uuid.uuid4().hex[:8]
    clients.ensure_topics(clients.admin(bootstrap), [f"ST_{u}"])
    cfg = tmp / f"kq{n}.toml"
    cfg.write_text(f'[service]\nbootstrap_servers = "{bootstrap}"\ndata_dir = "{tmp}/d{n}"\n'
                   f'topic_prefix = "st{u}"\nmetrics_port = 0\n[[queue]]\nname = "ST_{u}"\n')
    log = tmp / f"serve{n}.log"
    began = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--config",
                                 str(cfg)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    ready = None
    while time.monotonic() - began < 60 and proc.poll() is None:
        if "ready:" in log.read_text():
            ready = time.monotonic() - began
            break
        time.sleep(0.05)
    proc.terminate()
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    clean = ready is not None and code == 0
    return clean, ready or 0.0, "" if clean else log.read_text()[-3000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--bootstrap")
    args = ap.parse_args()
    failed = 0
    times: list[float] = []
    with apache_or(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        for n in range(args.starts):
            clean, took, tail = one_start(bootstrap, Path(tmp), n)
            if clean:
                times.append(took)
            else:
                failed += 1
                print(f"start {n + 1}: NOT CLEAN\n{tail}", flush=True)
            if (n + 1) % 10 == 0:
                print(f"{n + 1} starts, {failed} not clean", flush=True)
    times.sort()
    median = times[len(times) // 2] if times else 0.0
    print(f"{args.starts} starts of kq serve, {args.starts - failed} clean, {failed} not; "
          f"to ready: median {median:.1f} s, max {max(times, default=0):.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
