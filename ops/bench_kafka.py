"""The benchmark's Kafka request counts: each role's processes report their clients'
librdkafka statistics into a folder of their own (`broker.kafka.stats`), and a phase reads
the folders before and after its drain."""

from __future__ import annotations

import os
from pathlib import Path

from broker.kafka import clients
from broker.kafka import stats as kafka_stats


def make_topics(bs: str, names: list[str]) -> None:
    """The topics a phase measures, made as kq makes its own busiest ones (small segment
    indexes, `broker.kafka.clients.SMALL_INDEXES`): otherwise the raw relay's paced run, on
    nine new topics, paid for Kafka's first index write of each (25-180 ms on this machine,
    holding back a client's other writes) and kq's queue topic did not, which made the
    baseline's latency look worse than Kafka and Python make it."""
    clients.ensure_topics(clients.admin(bs), names, tuning=clients.SMALL_INDEXES)


def stats_env(folder: Path | None) -> dict[str, str]:
    """The environment of a role whose Kafka requests are counted into `folder`."""
    env = dict(os.environ)
    if folder is not None:
        env[kafka_stats.ENV] = str(folder)
    return env


def kafka_per_msg(readings: dict[str, tuple[dict, dict]], n: int) -> dict[str, dict]:
    """Per role: Kafka requests (all, and the main kinds) and records per message between
    two readings of its counters (librdkafka's statistics)."""
    out = {}
    for role, (before, after) in readings.items():
        d = kafka_stats.difference(after, before)
        kinds = {k: round(v / n, 3) for k, v in d["requests"].items() if v >= n / 1000}
        out[role] = {"requests": round(sum(d["requests"].values()) / n, 3), "by_kind": kinds,
                     "records_out": round(d["records_out"] / n, 3),
                     "records_in": round(d["records_in"] / n, 3),
                     "bytes_out": round(d["bytes_out"] / n), "bytes_in": round(d["bytes_in"] / n)}
    return out


def counters_now(folders: dict[str, Path]) -> dict[str, dict]:
    """Each role's counters now."""
    return {role: kafka_stats.read(d) for role, d in folders.items()}


def grown_per_msg(folders: dict[str, Path], before: dict[str, dict], n: int) -> dict[str, dict]:
    """Per role, what its counters grew by since `before` (from zero for a role not in it),
    per message."""
    zero = kafka_stats.totals([])
    return kafka_per_msg({role: (before.get(role, zero), kafka_stats.read(d))
                          for role, d in folders.items()}, n)
