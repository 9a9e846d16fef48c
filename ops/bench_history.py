"""A cold restore after a long history (SPEC 14): does it take longer than with a fresh journal?

    python ops/bench_history.py [--queued 1000000] [--history 10000000] [--broker apache]
                                [--bootstrap HOST:PORT] [--json]

A queue QUEUED gets `--queued` messages that stay; a second queue HISTORY, whose messages
expire 10 ms after they arrive, makes the journal long: each of its messages adds two
transitions (enqueued, removed), until `--history` transitions are in. Snapshots are written
every 30 s meanwhile, and the loop's turns during each are logged. Then `kq serve` is killed
with SIGKILL (no snapshot at a clean stop), its data_dir deleted, and started again: the time
to ready is the cold restore, from the newest snapshot and the journal after it. The same is
then measured on a fresh prefix with only the `--queued` messages (a fresh journal). A few
more messages arrive meanwhile (a trickle, so that snapshots keep being written, and a tail
after the last).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.kafka import clients  # noqa: E402
from broker.kafka.apache import ApacheKafka  # noqa: E402
from ops.bench import start_service, wait_stat  # noqa: E402
from ops.bench_roles import publish  # noqa: E402

SNAPSHOT = re.compile(r"snapshot of shard 0 at journal offset (\d+): (\d+) entries, ([\d.]+) MB "
                      r"in \d+ chunk\(s\), in ([\d.]+) s \(checkpoint taken in (\d+) ms; "
                      r"the loop's turns meanwhile: p99 (\d+) ms, max (\d+) ms of \d+; "
                      r"before: p99 (\d+) ms")


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with ApacheKafka() as kafka:
        yield kafka.bootstrap_servers


def config(tmp: Path, bs: str, prefix: str) -> Path:
    cfg = tmp / f"{prefix}.toml"
    cfg.write_text(
        f'[service]\nbootstrap_servers = "{bs}"\ntopic_prefix = "{prefix}"\n'
        f'data_dir = "{tmp / prefix}"\nmetrics_port = 0\nsnapshot_interval = "30s"\n'
        f'journal_retention = "1d"\n'
        f'[[queue]]\nname = "{prefix}_QUEUED"\n'
        f'[[queue]]\nname = "{prefix}_HISTORY"\nexpiration = "10ms"\n')
    return cfg


def snapshots(log: Path) -> list[dict[str, float]]:
    return [{"journal_offset": int(m[0]), "entries": int(m[1]), "mb": float(m[2]),
             "seconds": float(m[3]), "frozen_ms": int(m[4]), "loop_p99_ms": int(m[5]),
             "loop_max_ms": int(m[6]), "loop_p99_before_ms": int(m[7])}
            for m in SNAPSHOT.findall(log.read_text())]


def cold_restore(bs: str, tmp: Path, queued: int, history: int) -> dict[str, float]:
    prefix = f"kqh{uuid.uuid4().hex[:6]}"
    clients.ensure_topics(clients.admin(bs), [f"{prefix}_QUEUED", f"{prefix}_HISTORY"])
    cfg, log = config(tmp, bs, prefix), tmp / f"{prefix}.log"
    proc, _ = start_service(cfg, log)
    publish(bs, f"{prefix}_QUEUED", queued)
    wait_stat(bs, prefix, f"{prefix}_QUEUED", "enqueued", queued, timeout=3600)
    started = time.monotonic()
    publish(bs, f"{prefix}_HISTORY", history // 2)
    wait_stat(bs, prefix, f"{prefix}_HISTORY", "enqueued", history // 2, timeout=7200)
    history_s = time.monotonic() - started
    # a periodic snapshot with everything queued in it, then a tail after it, then the
    # crash (a shard with nothing new writes no snapshot: a trickle keeps them coming)
    taken = len(snapshots(log))
    while len(snapshots(log)) <= taken + 1:
        publish(bs, f"{prefix}_QUEUED", 10)
        time.sleep(2)
    publish(bs, f"{prefix}_QUEUED", 100)
    time.sleep(2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    journal_end = clients.end_offset(clients.consumer(bs), f"{prefix}.journal", 0)
    shutil.rmtree(tmp / prefix)
    proc, start_to_ready_s = start_service(cfg, log)
    proc.terminate()
    proc.wait()
    text = log.read_text()
    # the restore itself: from the shard given to this process to ready (before it: the
    # process starting, and the group waiting out the killed member's session)
    took = [datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f") for t in re.findall(
        r"^(\S+ \S+) INFO kq\.(?:instance: instance \S+ takes shard 0|service: ready:)",
        text, re.M)]
    restore_s = (took[-1] - took[-2]).total_seconds() if len(took) >= 2 else float("nan")
    replayed = re.findall(r"ready: shard 0, \d+ queue\(s\), (\d+) batch", text)
    taken_all = snapshots(log)
    big = [s for s in taken_all if s["entries"] >= queued]
    return {"queued": queued, "history_transitions": history, "history_s": history_s,
            "journal_records": journal_end, "restore_s": restore_s,
            "start_to_ready_s": start_to_ready_s,
            "loaded_snapshot": "loaded snapshot" in text,
            "replayed_batches": int(replayed[-1]) if replayed else -1,
            "snapshots": len(taken_all),
            "snapshot_s_max": max((s["seconds"] for s in big), default=0.0),
            "snapshot_mb": max((s["mb"] for s in big), default=0.0),
            "snapshot_frozen_ms_max": max((s["frozen_ms"] for s in big), default=0),
            "snapshot_loop_p99_ms_max": max((s["loop_p99_ms"] for s in big), default=0),
            "snapshot_loop_max_ms": max((s["loop_max_ms"] for s in big), default=0),
            "loop_p99_before_ms_max": max((s["loop_p99_before_ms"] for s in big), default=0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", type=int, default=1_000_000)
    ap.add_argument("--history", type=int, default=10_000_000)
    ap.add_argument("--bootstrap")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with broker(a.bootstrap) as bs, tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        long = cold_restore(bs, tmp, a.queued, a.history)
        fresh = cold_restore(bs, tmp, a.queued, 0)
    out = {"after_history": long, "fresh_journal": fresh,
           "ratio": long["restore_s"] / fresh["restore_s"]}
    if a.json:
        print(json.dumps(out))
        return
    for name, r in (("after history", long), ("fresh journal", fresh)):
        print(f"{name}: {r['queued']:,} queued, {r['journal_records']:,} journal records: "
              f"cold restore {r['restore_s']:.1f} s ({r['start_to_ready_s']:.1f} s from the "
              f"process start; snapshot loaded: "
              f"{r['loaded_snapshot']}, {r['replayed_batches']} batches replayed); "
              f"snapshots up to {r['snapshot_s_max']:.1f} s, {r['snapshot_mb']:.0f} MB, "
              f"frozen in <= {r['snapshot_frozen_ms_max']} ms, loop turns p99 <= "
              f"{r['snapshot_loop_p99_ms_max']} ms, max {r['snapshot_loop_max_ms']} ms")
    print(f"ratio: {out['ratio']:.2f}")


if __name__ == "__main__":
    main()
