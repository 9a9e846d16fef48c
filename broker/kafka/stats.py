"""Kafka requests counted per process, for the benchmark's "where the cost goes".

With the environment variable KQ_KAFKA_STATS=DIR, every Kafka client a process makes through
`broker.kafka.clients` (and the benchmark's own relay) reports librdkafka's statistics every
second, and the process keeps the totals of all its clients in DIR/<pid>.json:
requests sent by type (Produce, Fetch, ...), records and bytes sent and received. The
figures are cumulative; a reader takes the difference between two readings. Without the
variable nothing is added to any client.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ENV = "KQ_KAFKA_STATS"
INTERVAL_MS = 1000

WRITE_EVERY_S = 0.5  # a process's clients report at different moments: one file write
_latest: dict[str, dict[str, Any]] = {}  # per client (librdkafka's name): its last report
_lock = threading.Lock()
_written = 0.0  # when the totals were last written (monotonic)


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def settings() -> dict[str, Any]:
    """Client settings that make it report, when KQ_KAFKA_STATS is set (else none)."""
    if not enabled():
        return {}
    return {"statistics.interval.ms": INTERVAL_MS, "stats_cb": _on_stats}


def settle(*clients: Any) -> None:
    """Before a process ends: one more report from each client, with its last requests."""
    if enabled():
        for _ in range(2):
            for c in clients:
                c.poll(INTERVAL_MS / 1000)
        with _lock:
            _write()


def _on_stats(text: str) -> None:
    """Called by librdkafka in whichever thread polls the client: a lock keeps the threads'
    writes apart, and a failure to write is dropped (counting must never stop a client)."""
    try:
        with _lock:
            _record(json.loads(text))
    except (OSError, ValueError, KeyError):
        pass


def _record(report: dict[str, Any]) -> None:
    requests: Counter[str] = Counter()
    for broker in report.get("brokers", {}).values():
        requests.update({kind: n for kind, n in broker.get("req", {}).items() if n})
    _latest[report["name"]] = {"requests": dict(requests), "records_out": report["txmsgs"],
                               "records_in": report["rxmsgs"], "bytes_out": report["tx_bytes"],
                               "bytes_in": report["rx_bytes"]}
    if time.monotonic() - _written >= WRITE_EVERY_S:  # writing is what costs: not per client
        _write()


def _write() -> None:
    global _written
    _written = time.monotonic()
    folder = Path(os.environ[ENV])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    kept = {**totals(_latest.values()),
            "clients": {name: sum(r["requests"].values()) for name, r in _latest.items()}}
    tmp.write_text(json.dumps(kept))
    tmp.replace(path)  # a reader never sees half a file


def totals(reports: Any) -> dict[str, Any]:
    """The sum of several clients' (or processes') reports."""
    out: dict[str, Any] = {"requests": Counter(), "records_out": 0, "records_in": 0,
                           "bytes_out": 0, "bytes_in": 0}
    for r in reports:
        out["requests"].update(r["requests"])
        for key in ("records_out", "records_in", "bytes_out", "bytes_in"):
            out[key] += r[key]
    out["requests"] = dict(out["requests"])
    return out


def read(folder: Path) -> dict[str, Any]:
    """The totals of every process that reported into `folder` so far."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # replaced while read: the next reading has it
            continue
    return totals(found)


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What happened between two readings."""
    kinds = set(after["requests"]) | set(before["requests"])
    out: dict[str, Any] = {"requests": {k: after["requests"].get(k, 0)
                                        - before["requests"].get(k, 0) for k in sorted(kinds)}}
    for key in ("records_out", "records_in", "bytes_out", "bytes_in"):
        out[key] = after[key] - before[key]
    return out
