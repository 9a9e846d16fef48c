"""The `rss` phase of ops/bench.py: kq serve's memory per queued message, its restart with
them queued (some held leased across it), its rebuild with `data_dir` deleted, and how fast a
new browser is shown them."""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path

from broker.kafka import clients
from ops.bench import rss_kb, spawn, start_service, wait_stat, write_config
from ops.bench_roles import publish


def run_rss(bs: str, m: int, leased: int, tmp: Path) -> dict[str, float]:
    prefix = f"kqr{uuid.uuid4().hex[:6]}"
    queue = f"{prefix}_Q"
    clients.ensure_topics(clients.admin(bs), [queue])
    cfg = write_config(tmp, bs, prefix, queue, backlog=max(leased, 1))
    log = tmp / f"{prefix}.log"
    proc, _ = start_service(cfg, log)
    time.sleep(1)
    base = rss_kb(proc.pid)
    publish(bs, queue, m)
    wait_stat(bs, prefix, queue, "enqueued", m)
    loaded = settled_rss_kb(proc.pid)
    browse_s = browse_all(bs, prefix, queue, m)
    leaser = None
    if leased:  # leases held across the restart: they stay in memory, the rest is paged
        ready = tmp / f"{prefix}.leased"
        leaser = spawn("_leaser", bs, prefix, queue, str(leased), str(ready))
        while not ready.exists():
            time.sleep(0.1)
    proc.terminate()
    proc.wait()
    proc, restart_s = start_service(cfg, log)
    proc.terminate()
    proc.wait()
    # the local state lost: rebuilt from the journal (and the payloads from their topic)
    shutil.rmtree(tmp / prefix)
    proc, rebuild_s = start_service(cfg, log)
    proc.terminate()
    proc.wait()
    if leaser is not None:
        leaser.kill()
    # snapshots (SPEC 14): the one written at the clean stop with all of them queued, and
    # what it cost the shard's loop; the rebuild above loaded it
    snaps = re.findall(r"snapshot of shard 0 at journal offset \d+: (\d+) entries, ([\d.]+) MB "
                       r"in \d+ chunk\(s\), in ([\d.]+) s \(checkpoint taken in (\d+) ms; the "
                       r"loop's turns meanwhile: p99 (\d+) ms, max (\d+) ms", log.read_text())
    biggest = max(snaps, key=lambda m: int(m[0])) if snaps else ("0",) * 6
    snapshot = {"snapshot_entries": int(biggest[0]), "snapshot_mb": float(biggest[1]),
                "snapshot_s": float(biggest[2]), "snapshot_frozen_ms": int(biggest[3]),
                "snapshot_loop_p99_ms": int(biggest[4]), "snapshot_loop_max_ms": int(biggest[5]),
                "rebuilt_from_snapshot": "loaded snapshot" in log.read_text()}
    # the service's own figure: the replay, without the start around it
    rebuilt = re.findall(r"replayed \d+ journal batches \((\d+) transitions\) into the local "
                         r"state in ([\d.]+) s", log.read_text())
    transitions, replay_s = (int(rebuilt[-1][0]), float(rebuilt[-1][1])) if rebuilt else (0, 0.0)
    return {"rss_bytes_per_queued_msg": (loaded - base) * 1024 / m, "queued": m,
            "leased": leased, "restart_s": restart_s, "browse_msgs_per_s": m / browse_s,
            "rebuild_s": rebuild_s, "rebuild_transitions": transitions,
            "rebuild_transitions_per_s": transitions / max(replay_s, 0.05), **snapshot}


def settled_rss_kb(pid: int, limit_s: float = 30.0, quiet_s: int = 6) -> int:
    """What the queue costs as it waits, not the burst of loading it: the service hands
    freed memory back while it stays idle (broker.service.memory: at 0, 0.5, 1, 2, 4, 8 s
    and on), and RocksDB flushes its memtables, both later on a busy machine. The lowest
    reading, once none fell by 1% for `quiet_s` seconds: longer than the gaps between the
    service's trims (a rule of one quiet second read 45 bytes per message once, 29 after)."""
    time.sleep(2)
    low, quiet, give_up = rss_kb(pid), 0, time.monotonic() + limit_s
    while quiet < quiet_s and time.monotonic() < give_up:
        time.sleep(1)
        now = rss_kb(pid)
        quiet = 0 if now < low * 0.99 else quiet + 1
        low = min(low, now)
    return low


def browse_all(bs: str, prefix: str, queue: str, m: int) -> float:
    """Seconds a new browser takes to be shown every one of `m` queued messages."""
    from broker.client import QueueClient

    with QueueClient(bs, name="bench-browser", topic_prefix=prefix) as c:
        started = time.monotonic()
        seen = 0
        for _ in c.subscribe(queue, mode="browse").messages(timeout=30):
            seen += 1
            if seen == m:
                break
        if seen < m:
            raise SystemExit(f"the browser saw {seen} of {m} messages")
        return time.monotonic() - started
