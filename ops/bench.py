"""kq benchmark: a raw pass-through baseline against kq end to end, on one broker.

    python ops/bench.py [--messages 20000] [--subscribers 4] [--instances N] [--bootstrap HOST:PORT]

(a) raw: a stateless Python relay moves each record topic -> per-subscriber delivery topic;
    subscribers "ack" by producing to an ack topic the relay reads back. The same hops as kq,
    with no state: about what Kafka and Python allow on this machine.
(s) share (Apache Kafka only): Kafka share groups (KIP-932), the queue built into the broker:
    as many share consumers of one group as subscribers, acknowledging every record
    explicitly. `msgs_per_s_steady` leaves out the seconds a new group takes to hand out its
    first record.
(b) kq: `kq serve` in a subprocess, subscribers with the real client, acking every message.

Each runs a drain phase (N records already published, time until all are acked: msgs/s) and
a paced phase (records published at --rate msgs/s once every subscriber has had a warm-up
record: publish -> deliver p50/p90/p99/max of the paced records), and
reports per message by role (broker, service (the relay for raw), subscribers, machine) the
CPU of each (`cpu_us_per_msg`, `cpu_us_per_msg_paced`) and the Kafka requests and records of
the clients (`kafka_per_msg`, `kafka_per_msg_paced`). A subscriber's CPU counts from its
first record to its last: the start of Python and of its client is not a cost per message.
Then kq's RSS per queued message (M records, no subscribers) and its restart time with them
queued. Without --bootstrap a broker is started on free ports (--broker embedded or apache).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARE_RECORD_LOCKS = 2000  # Kafka's group.share.partition.max.record.locks default (4.x)
sys.path.insert(0, str(ROOT))

from broker.kafka import stats as kafka_stats  # noqa: E402
from broker.kafka.started import BROKERS, given_or_started  # noqa: E402
from ops.bench_kafka import counters_now, grown_per_msg, make_topics, stats_env  # noqa: E402
from ops.bench_roles import Figures, percentile, publish, warm_up  # noqa: E402
from ops.bench_threads import (  # noqa: E402
    cpu_by_thread,
    cpu_seconds,
    machine_cpu_seconds,
    paced_cpu,
    paced_start,
    per_msg,
    threads_per_msg,
    wait_cpu,
)
from ops.bench_watch import bystander, profiler, slowed, stop_profiler  # noqa: E402
from ops.broker_gc import broker_gc  # noqa: E402

# -- orchestration -----------------------------------------------------------------------------

def spawn(*args: str, stats_dir: Path | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(ROOT / "ops" / "bench_roles.py"), *args],
                            cwd=ROOT, env=stats_env(stats_dir))


def collect(files: list[Path]) -> list[float]:
    """The latencies the subscribers wrote."""
    return [x for f in files for x in json.loads(f.read_text())["lat"]]


def subscribers_cpu(files: list[Path]) -> float:
    return sum(json.loads(f.read_text())["cpu_s"] for f in files)


def steady(files: list[Path], n: int, end_wall: float) -> float:
    """msgs/s from the first delivery to the last ack."""
    firsts = [json.loads(f.read_text())["first"] for f in files]
    first = min((t for t in firsts if t), default=0.0)
    return n / (end_wall - first) if first and end_wall > first else float("nan")


def run_raw(bs: str, n: int, subs: int, rate: float, tmp: Path) -> Figures:
    run = f"raw{uuid.uuid4().hex[:6]}"
    make_topics(bs, [f"{run}.src"] + [f"{run}.{k}{i}" for i in range(subs) for k in ("d", "ack")])
    publish(bs, f"{run}.src", n)
    outs = [tmp / f"{run}-{i}.json" for i in range(subs)]
    machine_before, broker_before = machine_cpu_seconds(), broker_cpu(bs)
    broker_threads = cpu_by_thread(broker := broker_pid(bs))
    counted = {role: tmp / f"{run}-kafka-{role}" for role in ("service", "subscribers")}
    start = time.monotonic()
    workers = [spawn("_raw_sub", bs, run, str(i), str(outs[i]),
                     stats_dir=counted["subscribers"]) for i in range(subs)]
    relay = spawn("_relay", bs, run, str(n), str(subs), stats_dir=counted["service"])
    relay_s = wait_cpu(relay)
    drain_s, end_wall = time.monotonic() - start, time.time()
    machine_s = machine_cpu_seconds() - machine_before
    broker_s = broker_cpu(bs) - broker_before
    by_thread = {"broker": threads_per_msg(broker_threads, cpu_by_thread(broker), n)}
    kafka = grown_per_msg(counted, {}, n)
    for w in workers:
        w.wait()
    cpu = {"broker": broker_s, "service": relay_s, "subscribers": subscribers_cpu(outs),
           "machine": machine_s}
    # paced phase for latency
    run2 = f"{run}p"
    make_topics(bs, [f"{run2}.src"] + [f"{run2}.{k}{i}" for i in range(subs) for k in ("d", "ack")])
    outs2 = [tmp / f"{run2}-{i}.json" for i in range(subs)]
    ready = [tmp / f"{run2}-{i}.ready" for i in range(subs)]
    counted = {role: tmp / f"{run2}-kafka-{role}" for role in ("service", "subscribers")}
    workers = [spawn("_raw_sub", bs, run2, str(i), str(outs2[i]), str(ready[i]),
                     stats_dir=counted["subscribers"]) for i in range(subs)]
    relay = spawn("_relay", bs, run2, str(int(rate * 5)), str(subs), "marked",
                  stats_dir=counted["service"])
    watch = bystander()
    warm_up(bs, f"{run2}.src", ready)
    paced_from, paced_wall = paced_start(relay.pid, broker_cpu(bs)), time.time()
    publish(bs, f"{run2}.src", int(rate * 5), rate, paced=True)
    relay_paced_s = wait_cpu(relay)  # (it exits once it has read the last ack)
    hiccups, gc = slowed(watch, paced_wall), broker_gc(broker_pid(bs), paced_wall)
    paced = paced_cpu(paced_from, relay_paced_s, broker_cpu(bs), int(rate * 5))
    for w in workers:
        w.wait()
    paced.update(per_msg({"subscribers": subscribers_cpu(outs2)}, int(rate * 5)))
    kafka_paced = grown_per_msg(counted, {}, int(rate * 5))
    lat = collect(outs2)
    return {"msgs_per_s": n / drain_s, "msgs_per_s_steady": steady(outs, n, end_wall),
            **latency(lat),
            "cpu_us_per_msg": per_msg(cpu, n), "machine_cpu_us_per_msg": machine_s / n * 1e6,
            "machine_busy_cores": machine_s / drain_s, "kafka_per_msg": kafka,
            "kafka_per_msg_paced": kafka_paced, "paced_hiccups": hiccups,
            "paced_broker_gc": gc,
            "cpu_us_per_msg_by_thread": by_thread, "cpu_us_per_msg_paced": paced}


def latency(lat: list[float]) -> dict[str, float]:
    return {"p50_ms": percentile(lat, 0.5), "p90_ms": percentile(lat, 0.9),
            "p99_ms": percentile(lat, 0.99), "max_ms": max(lat, default=float("nan"))}


def broker_pid(bs: str) -> int | None:
    """The process listening on the bootstrap port (None when not on this machine)."""
    import psutil

    port = int(bs.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def broker_cpu(bs: str) -> float:
    """CPU seconds of the broker's process (0 when not on this machine)."""
    pid = broker_pid(bs)
    return 0.0 if pid is None else cpu_seconds(pid)


# `--memory-budget` and `--service`: more [service] keys of every kq serve the benchmark
# starts; `--queue`: more keys for the benchmark's queue (its type)
SERVICE_EXTRA = ""
QUEUE_EXTRA = ""


def write_config(tmp: Path, bs: str, prefix: str, queue: str, backlog: int = 100) -> Path:
    cfg = tmp / f"{prefix}.toml"
    cfg.write_text(f'[service]\nbootstrap_servers = "{bs}"\ntopic_prefix = "{prefix}"\n'
                   f'{SERVICE_EXTRA}'
                   f'data_dir = "{tmp / prefix}"\nmetrics_port = 0\n'
                   f'[[queue]]\nname = "{queue}"\nmax_per_subscription_backlog = {backlog}\n'
                   f'lease_period = "1h"\n{QUEUE_EXTRA}')
    return cfg


def start_service(cfg: Path, log: Path,
                  stats_dir: Path | None = None) -> tuple[subprocess.Popen[bytes], float]:
    started = time.monotonic()
    f = open(log, "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--config", str(cfg)],
                            cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env=stats_env(stats_dir))
    before = log.read_text().count("ready:") if log.exists() else 0
    while log.read_text().count("ready:") <= before:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text().splitlines()[-15:])
            raise SystemExit(f"kq serve exited; the end of its log:\n{tail}")
        time.sleep(0.02)
    return proc, time.monotonic() - started


def wait_stat(bs: str, prefix: str, queue: str, key: str, value: int, timeout: float = 600,
              gave_up: Callable[[], bool] = lambda: False) -> None:
    """Wait until the queue's `key` count reaches `value` (or `gave_up()`), asking five times
    a second with one client (one per question cost the broker about 0.2 of a core, charged
    to the drain)."""
    from broker.client import QueueClient

    deadline = time.monotonic() + timeout
    with QueueClient(bs, name=f"bench-wait-{uuid.uuid4().hex[:6]}", topic_prefix=prefix) as c:
        while next(r for r in c.query(what="queues")["queues"] if r["queue"] == queue)[key] < value:
            if gave_up():
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {key} >= {value}")
            time.sleep(0.2)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_kq(bs: str, n: int, subs: int, rate: float, tmp: Path, backlog: int,
           profile: Path | None = None) -> Figures:
    prefix = f"kqb{uuid.uuid4().hex[:6]}"
    queue = f"{prefix}_Q"
    make_topics(bs, [queue])
    publish(bs, queue, n)
    counted = {role: tmp / f"{prefix}-kafka-{role}" for role in ("service", "subscribers")}
    proc, _ = start_service(write_config(tmp, bs, prefix, queue, max(backlog, 100)),
                            tmp / f"{prefix}.log",
                            stats_dir=counted["service"])
    try:
        wait_stat(bs, prefix, queue, "enqueued", n)
        time.sleep(kafka_stats.INTERVAL_MS / 1000 * 2)  # the loading's last Kafka statistics
        outs = [tmp / f"{prefix}-{i}.json" for i in range(subs)]
        spy = profiler(proc.pid, profile)
        cpu_before, machine_before = cpu_seconds(proc.pid), machine_cpu_seconds()
        broker_before = broker_cpu(bs)
        pids = {"broker": broker_pid(bs), "service": proc.pid}
        threads_before = {role: cpu_by_thread(pid) for role, pid in pids.items()}
        before = counters_now(counted)
        start = time.monotonic()
        workers = [spawn("_kq_sub", bs, prefix, queue, str(outs[i]), str(backlog),
                         stats_dir=counted["subscribers"]) for i in range(subs)]
        wait_stat(bs, prefix, queue, "acked", n)
        drain_s, end_wall = time.monotonic() - start, time.time()
        cpu_s = cpu_seconds(proc.pid) - cpu_before
        machine_s = machine_cpu_seconds() - machine_before
        broker_s = broker_cpu(bs) - broker_before
        by_thread = {role: threads_per_msg(threads_before[role], cpu_by_thread(pid), n)
                     for role, pid in pids.items()}
        time.sleep(kafka_stats.INTERVAL_MS / 1000 * 2)  # the last reports of the drain
        kafka = grown_per_msg(counted, before, n)
        stop_profiler(spy)
        for w in workers:
            w.wait()
        cpu = {"broker": broker_s, "service": cpu_s, "subscribers": subscribers_cpu(outs),
               "machine": machine_s}
        outs2 = [tmp / f"{prefix}-p{i}.json" for i in range(subs)]
        ready = [tmp / f"{prefix}-p{i}.ready" for i in range(subs)]
        counted["subscribers"] = tmp / f"{prefix}-kafka-paced"
        workers = [spawn("_kq_sub", bs, prefix, queue, str(outs2[i]), str(backlog),
                         str(ready[i]), stats_dir=counted["subscribers"]) for i in range(subs)]
        watch = bystander()
        warmed = warm_up(bs, queue, ready)
        before = counters_now(counted)
        paced_from, paced_wall = paced_start(proc.pid, broker_cpu(bs)), time.time()
        publish(bs, queue, int(rate * 5), rate, paced=True)
        # to the last ack (the workers idle 3 s more), or the workers' end if they gave up
        wait_stat(bs, prefix, queue, "acked", n + warmed + int(rate * 5),
                  gave_up=lambda: all(w.poll() is not None for w in workers))
        paced = paced_cpu(paced_from, cpu_seconds(proc.pid), broker_cpu(bs), int(rate * 5))
        hiccups, gc = slowed(watch, paced_wall), broker_gc(broker_pid(bs), paced_wall)
        time.sleep(kafka_stats.INTERVAL_MS / 1000 * 2)  # (the workers idle 3 s before exiting)
        kafka_paced = grown_per_msg(counted, before, int(rate * 5))
        for w in workers:
            w.wait()
        paced.update(per_msg({"subscribers": subscribers_cpu(outs2)}, int(rate * 5)))
        lat = collect(outs2)
    finally:
        proc.terminate()
        proc.wait()
    return {"msgs_per_s": n / drain_s, "msgs_per_s_steady": steady(outs, n, end_wall),
            **latency(lat),
            "cpu_us_per_msg": per_msg(cpu, n), "service_cpu_us_per_msg": cpu_s / n * 1e6,
            "service_busy": cpu_s / drain_s, "machine_cpu_us_per_msg": machine_s / n * 1e6,
            "machine_busy_cores": machine_s / drain_s, "kafka_per_msg": kafka,
            "kafka_per_msg_paced": kafka_paced, "paced_hiccups": hiccups,
            "paced_broker_gc": gc,
            "cpu_us_per_msg_by_thread": by_thread, "cpu_us_per_msg_paced": paced}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=None,
                    help="records per throughput phase (default 20,000 on the embedded broker; "
                         "100,000 on Apache Kafka or a --bootstrap broker, so that a share "
                         "group's start does not dominate its drain)")
    ap.add_argument("--subscribers", type=int, default=4)
    ap.add_argument("--backlog", type=int, default=None,
                    help=f"each kq worker's max_backlog (default {SHARE_RECORD_LOCKS:,} / "
                         "--subscribers: as many in flight as a share group holds acquired "
                         "per partition by default)")
    ap.add_argument("--rate", type=float, default=500.0, help="paced phase msgs/s")
    ap.add_argument("--rss-messages", type=int, default=50000)
    ap.add_argument("--rss-leased", type=int, default=10000,
                    help="of the --rss-messages, how many a subscriber holds leased while "
                         "the service restarts")
    ap.add_argument("--bootstrap")
    ap.add_argument("--broker", choices=BROKERS, default="embedded",
                    help="without --bootstrap: the broker to start for the run")
    ap.add_argument("--phases", default=None,
                    help="which parts to run (comma separated): raw, share (Apache Kafka "
                         "only), kq, rss (default: all that apply)")
    ap.add_argument("--memory-budget", help='[service] memory_budget of kq serve, e.g. "32MB" '
                    "(default: the service's own default)")
    ap.add_argument("--service", default="", metavar="TOML",
                    help='more [service] keys, one per line, e.g. "exactly_once = true"')
    ap.add_argument("--queue", default="", metavar="TOML",
                    help='more keys for the queue, one per line, e.g. "priority_levels = 3" '
                         "or 'barrier_expression = \"/flush = true\"' (its type)")
    ap.add_argument("--instances", type=int,
                    help="kq phase with N kq serve instances sharing N shards, one queue "
                         "each (ops/bench_instances.py); compare --instances 1 with 2, as "
                         "both run the same way")
    ap.add_argument("--warmup", type=int, default=None, metavar="N",
                    help="first run every kind of traffic measured (raw, share, kq) with N "
                         "messages, twice in turn, unmeasured, and wait for the JIT to "
                         "finish, so that no phase pays for the JVM's warm-up (default "
                         "--messages on Apache Kafka, 0 on the embedded broker)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", type=Path, metavar="FILE",
                    help="sample kq serve with py-spy during the drain phase; write the "
                         "collapsed stacks to FILE (summarise: ops/profile_top.py FILE)")
    ap.add_argument("--pipeline", action="store_true",
                    help="also time `kq journal report` on local[2] (ops/bench_pipeline.py)")
    ap.add_argument("--pipeline-transitions", type=int, default=1_000_000)
    a = ap.parse_args()
    global SERVICE_EXTRA, QUEUE_EXTRA
    if a.messages is None:
        a.messages = 100_000 if a.broker == "apache" or a.bootstrap else 20_000
    a.backlog = a.backlog or max(1, SHARE_RECORD_LOCKS // a.subscribers)
    SERVICE_EXTRA = "".join(f"{line}\n" for line in a.service.split("\\n") if line)
    if a.memory_budget:
        SERVICE_EXTRA += f'memory_budget = "{a.memory_budget}"\n'
    QUEUE_EXTRA = a.queue.replace("\\n", "\n") + ("\n" if a.queue else "")
    with given_or_started(a.bootstrap, a.broker) as bs, tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        apache = a.broker == "apache" or bool(a.bootstrap)
        phases = set((a.phases or ("raw,share,kq,rss" if apache else "raw,kq,rss")).split(","))
        nan = {"msgs_per_s": float("nan"), "p50_ms": float("nan"), "p99_ms": float("nan")}
        warmup = a.warmup if a.warmup is not None else a.messages if apache else 0
        warmed = None
        if warmup:  # a JVM compiles its hot paths over the first records: not measured
            from ops.bench_warmup import kinds_measured, warm_up
            warmed = warm_up(kinds_measured(bs, warmup, phases, a, tmp), broker_pid(bs))
        raw = run_raw(bs, a.messages, a.subscribers, a.rate, tmp) if "raw" in phases else nan
        share = None
        if "share" in phases:
            from ops.bench_share import run_share
            share = run_share(bs, a.messages, a.subscribers, a.rate, tmp)
        if "kq" not in phases:
            kq = nan
        elif a.instances is not None:
            from ops.bench_instances import run_instances
            kq = run_instances(bs, a.messages, a.subscribers, a.rate, tmp, a.backlog,
                               a.instances)
        else:
            kq = run_kq(bs, a.messages, a.subscribers, a.rate, tmp, a.backlog, a.profile)
        if "rss" in phases:
            from ops.bench_rss import run_rss
        rss = (run_rss(bs, a.rss_messages, a.rss_leased, tmp) if "rss" in phases else
               {"rss_bytes_per_queued_msg": float("nan"), "queued": 0, "leased": 0,
                "restart_s": float("nan"), "browse_msgs_per_s": float("nan"),
                "rebuild_s": float("nan"), "rebuild_transitions": 0,
                "rebuild_transitions_per_s": float("nan")})
        pipeline = None
        if a.pipeline:
            from ops.bench_pipeline import measure
            pipeline = measure(bs, a.pipeline_transitions)
    result = {"messages": a.messages, "subscribers": a.subscribers,
              "broker": "given" if a.bootstrap else a.broker,
              "raw": raw, "kq": kq,
              "ratio_kq_to_raw": kq["msgs_per_s"] / raw["msgs_per_s"], **rss}
    if warmed is not None:
        result["warmup"] = {"messages": warmup, **warmed}
    if share is not None:
        result["share"] = share
        result["ratio_kq_to_share"] = kq["msgs_per_s"] / share["msgs_per_s"]
        result["ratio_kq_to_share_steady"] = kq["msgs_per_s"] / share["msgs_per_s_steady"]
    if pipeline is not None:
        result["pipeline"] = pipeline
    if a.json:
        print(json.dumps(result, indent=2))
        return
    from ops.bench_print import print_result
    print_result(result, a)

if __name__ == "__main__":
    # the phases in other modules import this one: let them share its options (--service...)
    sys.modules.setdefault("ops.bench", sys.modules[__name__])
    main()
