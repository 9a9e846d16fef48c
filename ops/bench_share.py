"""The `share` phase of ops/bench.py: Kafka share groups (KIP-932), the queue built into
Apache Kafka 4.2+, measured the way kq is: as many share consumers of one group as kq has
subscribers, each acknowledging every record explicitly (ops/bench_roles.py `_share_sub`)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

from broker.kafka import clients
from ops.bench import broker_cpu, broker_pid, latency, spawn
from ops.bench_kafka import grown_per_msg, make_topics
from ops.bench_roles import publish, warm_up
from ops.bench_threads import machine_cpu_seconds, per_msg
from ops.bench_watch import bystander, slowed
from ops.broker_gc import broker_gc


def share_group(bs: str, group: str) -> None:
    """A share group reads from the end by default: this one starts at the beginning."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = clients.admin(bs)
    resource = ConfigResource("group", group, incremental_configs=[ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def share_members(bs: str, group: str, topic: str, subs: int, tmp: Path,
                  stats_dir: Path | None = None,
                  ) -> tuple[list[subprocess.Popen[bytes]], list[Path], list[Path]]:
    outs = [tmp / f"{group}-{i}.json" for i in range(subs)]
    ready = [tmp / f"{group}-{i}.ready" for i in range(subs)]
    return ([spawn("_share_sub", bs, group, topic, str(outs[i]), str(ready[i]),
                   stats_dir=stats_dir) for i in range(subs)], outs, ready)


def run_share(bs: str, n: int, subs: int, rate: float, tmp: Path) -> dict[str, float]:
    """Kafka share groups (KIP-932): `subs` share consumers of one group on the topic, each
    acknowledging every record explicitly, as kq's workers ack every message."""
    run = f"shr{uuid.uuid4().hex[:6]}"
    make_topics(bs, [run])
    share_group(bs, run)
    publish(bs, run, n)
    broker_before, machine_before = broker_cpu(bs), machine_cpu_seconds()
    start = time.time()
    counted = tmp / f"{run}-kafka-subscribers"
    members, outs, _ = share_members(bs, run, run, subs, tmp, counted)
    for m in members:  # (each idles 3 s at the end: its last Kafka statistics are written)
        m.wait()
    machine_s = machine_cpu_seconds() - machine_before
    broker_s = broker_cpu(bs) - broker_before
    kafka = grown_per_msg({"subscribers": counted}, {}, n)
    got = [json.loads(o.read_text()) for o in outs]
    delivered = sum(g["count"] for g in got)
    if delivered < n:
        raise SystemExit(f"share group: {delivered} of {n} records delivered")
    end = max(g["last"] for g in got)
    first = min(g["first"] for g in got if g["count"])
    # paced: warm-up records until every member has one, then --rate for 5 s
    paced = f"{run}p"
    make_topics(bs, [paced])
    share_group(bs, paced)
    members, outs, ready = share_members(bs, paced, paced, subs, tmp)
    watch = bystander()
    warm_up(bs, paced, ready)
    paced_wall = time.time()
    publish(bs, paced, int(rate * 5), rate, paced=True)
    hiccups = slowed(watch, paced_wall)  # to the last publish: the members idle a while more
    gc = broker_gc(broker_pid(bs), paced_wall)
    for m in members:
        m.wait()
    lat = [x for o in outs for x in json.loads(o.read_text())["lat"]]
    cpu = {"broker": broker_s, "subscribers": sum(g["cpu_s"] for g in got),
           "machine": machine_s}
    return {"msgs_per_s": n / (end - start), "msgs_per_s_steady": n / (end - first),
            "first_delivery_s": first - start, "redelivered": delivered - n,
            **latency(lat), "cpu_us_per_msg": per_msg(cpu, n), "kafka_per_msg": kafka,
            "paced_hiccups": hiccups, "paced_broker_gc": gc}
