"""`ops/bench.py --instances N`: the kq phase with N `kq serve` instances sharing N shards.

One queue per shard (queue i has `shard = i`), the messages and subscribers spread evenly over
the queues, and the instances started together; the drain starts once every shard has its
own instance (the group's rebalances are over). A shard runs in one thread, so one instance
uses about one core (the GIL): more instances add cores, as long as the broker keeps up and
the queues spread over the shards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from broker.kafka import clients
from ops.bench import collect, spawn
from ops.bench_roles import percentile, publish
from ops.bench_threads import cpu_seconds, machine_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent


def _config(tmp: Path, bs: str, prefix: str, queues: list[str], backlog: int) -> Path:
    cfg = tmp / f"{prefix}.toml"
    lines = ["[service]", f'bootstrap_servers = "{bs}"', f'topic_prefix = "{prefix}"',
             "metrics_port = 0", f"shards = {len(queues)}", 'session_timeout = "6s"']
    for i, q in enumerate(queues):
        lines += ["[[queue]]", f'name = "{q}"', f"shard = {i}", 'lease_period = "1h"',
                  f"max_per_subscription_backlog = {max(backlog, 100)}"]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def queue_rows(bs: str, prefix: str) -> list[dict]:
    from broker.client import QueueClient
    from broker.errors import KqError

    try:
        with QueueClient(bs, name="bench-cli", topic_prefix=prefix, request_timeout=5) as c:
            return list(c.query(what="queues")["queues"])
    except KqError:  # a shard between owners
        return []


def wait_until(what: str, ok, timeout: float = 600, hopeless=lambda: None) -> None:  # noqa: ANN001
    """Until ok(); give up after `timeout`, or at once when hopeless() says why."""
    deadline = time.monotonic() + timeout
    while not ok():
        why = hopeless()
        if why is None and time.monotonic() > deadline:
            why = "timed out"
        if why is not None:
            time.sleep(1)  # what was under way when it said so
            if ok():
                return
            raise TimeoutError(f"{why} waiting for {what}")
        time.sleep(0.2)


def keep_logs(tmp: Path, prefix: str) -> Path:
    """The instances' logs of a failed run, out of the temporary directory."""
    kept = Path(tempfile.mkdtemp(prefix="kq-bench-logs-"))
    for log in tmp.glob(f"{prefix}*.log"):
        shutil.copy(log, kept)
    return kept


def _spread(rows: list[dict], instances: int, n: int) -> bool:
    """Every shard owned by another instance, and all n messages enqueued."""
    return (len({r["owner"] for r in rows}) == instances
            and sum(r["enqueued"] for r in rows) >= n)


def _total(bs: str, prefix: str, key: str) -> int:
    return sum(r[key] for r in queue_rows(bs, prefix))


def _publish_all(bs: str, queues: list[str], n: int, rate: float = 0) -> None:
    """n messages spread evenly over the queues, published in parallel (rate split too)."""
    threads = [threading.Thread(target=publish, args=(bs, q, n // len(queues),
                                                      rate / len(queues)))
               for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_instances(bs: str, n: int, subs: int, rate: float, tmp: Path, backlog: int,
                  instances: int) -> dict[str, float]:
    prefix = f"kqb{uuid.uuid4().hex[:6]}"
    queues = [f"{prefix}_Q{i}" for i in range(instances)]
    clients.ensure_topics(clients.admin(bs), queues)
    n -= n % instances
    _publish_all(bs, queues, n)
    cfg = _config(tmp, bs, prefix, queues, backlog)
    procs = []
    for i in range(instances):
        log = open(tmp / f"{prefix}-{i}.log", "ab")  # noqa: SIM115
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--config", str(cfg)], cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "KQ_INSTANCE": f"bench{i}",
                 "KQ_DATA_DIR": str(tmp / f"{prefix}-{i}")}))

    def instance_gone() -> str | None:
        return next((f"instance bench{i} exited with {p.returncode};"
                     for i, p in enumerate(procs) if p.poll() is not None), None)

    try:
        wait_until("every shard to have an instance of its own", lambda: _spread(
            queue_rows(bs, prefix), instances, n), hopeless=instance_gone)
        outs = [tmp / f"{prefix}-{i}.json" for i in range(max(subs, instances))]
        cpu_before = sum(cpu_seconds(p.pid) for p in procs)
        machine_before = machine_cpu_seconds()
        start = time.monotonic()
        workers = [spawn("_kq_sub", bs, prefix, queues[i % instances], str(out), str(backlog))
                   for i, out in enumerate(outs)]
        acked = 0

        def all_acked() -> bool:
            nonlocal acked
            acked = _total(bs, prefix, "acked") or acked  # 0: no answer this time
            return acked >= n

        def subscribers_gone() -> str | None:  # each stops after 3 s without a message
            if any(w.poll() is None for w in workers):
                return instance_gone()
            return f"every subscriber stopped (3 s without a message) at {acked} acked,"

        wait_until(f"{n} acks", all_acked, hopeless=subscribers_gone)
        drain_s = time.monotonic() - start
        cpu_s = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
        machine_s = machine_cpu_seconds() - machine_before
        for w in workers:
            w.wait()
        outs2 = [tmp / f"{prefix}-p{i}.json" for i in range(len(outs))]
        workers = [spawn("_kq_sub", bs, prefix, queues[i % instances], str(out), str(backlog))
                   for i, out in enumerate(outs2)]
        time.sleep(2)
        _publish_all(bs, queues, int(rate * 5), rate)
        for w in workers:
            w.wait()
        lat = collect(outs2)
    except TimeoutError as exc:
        raise SystemExit(f"{exc}; the logs are kept in {keep_logs(tmp, prefix)}") from None
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    return {"instances": instances, "msgs_per_s": n / drain_s,
            "p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99),
            "service_cpu_us_per_msg": cpu_s / n * 1e6, "service_busy": cpu_s / drain_s,
            "machine_cpu_us_per_msg": machine_s / n * 1e6,
            "machine_busy_cores": machine_s / drain_s}

