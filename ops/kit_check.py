"""The operators' kit against the real thing, without Docker: what `docker compose up` runs.

    python ops/kit_check.py [--seconds 20]

Starts a single-node Apache Kafka with the compose file's settings (stock group rules: the
6 s minimum session), two `kq serve` instances the way compose does (ops/compose.queues.toml,
`KQ_INSTANCE` kq-a and kq-b, a data directory each; only the metrics port differs, as the
two share this host), puts some work through the queues, and scrapes both with Prometheus
(Debian's `prometheus`, with ops/prometheus/alerts.yml) when it is installed. Then it checks
that every series the Grafana dashboard and the alert rules query is present (in Prometheus,
or in both instances' /metrics without it), that both instances are up and own shards, and
that the alert rules load. Exit 0 when all hold, 1 otherwise, naming what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.client import QueueClient  # noqa: E402
from broker.kafka import clients  # noqa: E402
from broker.kafka.apache import ApacheKafka  # noqa: E402
from broker.kafka.guarded import free_port, port_open  # noqa: E402

OPS = ROOT / "ops"
INSTANCES = ("kq-a", "kq-b")


def queried_series() -> set[str]:
    """The kq series the dashboard's panels and the alert rules name."""
    texts = re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"',
                       (OPS / "grafana/dashboards/kq.json").read_text())
    texts.append((OPS / "prometheus/alerts.yml").read_text())
    return {m for t in texts for m in re.findall(r"\bkq_[a-z_]+\b", t)}


def shared_out(bootstrap: str, shards: int) -> bool:
    """Both instances own shards, every shard is owned, and kq instances says so."""
    from broker.service.status import read_statuses

    reader = clients.consumer(bootstrap)
    try:
        statuses = read_statuses(reader, "kq.instances", bootstrap)
    finally:
        reader.close()
    now = int(time.time() * 1000)
    owned = {name: set(s.owned) for name, s in statuses.items() if s.live(now, 10_000)}
    return (all(owned.get(n) for n in INSTANCES)
            and set().union(*owned.values()) == set(range(shards)))


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - localhost only
        return str(answer.read().decode())


def instance_config(tmp: Path, name: str, metrics_port: int) -> Path:
    """compose.queues.toml as the container reads it; only the metrics port differs."""
    text = (OPS / "compose.queues.toml").read_text()
    text = re.sub(r"(?m)^metrics_port = \d+", f"metrics_port = {metrics_port}", text)
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def put_work_through(bootstrap: str, queues: list[str], topics: list[str]) -> None:
    """Messages into every topic, and a worker that takes, acks and cancels some of each
    queue's: the counters and gauges then have values, not only names."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for topic in topics:
        for i in range(20):
            producer.produce(topic, json.dumps({"n": i, "sym": "IBM", "qty": i}).encode())
    producer.flush(30)
    with QueueClient(bootstrap, name="kit-worker") as worker:
        for queue in queues:
            try:
                sub = worker.subscribe(queue, max_backlog=5)
            except Exception as exc:  # noqa: BLE001 - a queue kq refuses: say so, go on
                print(f"  subscribe {queue}: {exc}")
                continue
            for n, msg in enumerate(sub.messages(timeout=3)):
                (msg.cancel if n % 4 == 3 else msg.ack)()
                if n >= 12:
                    break
            sub.close()


def start_prometheus(tmp: Path, targets: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    shutil.copy(OPS / "prometheus/alerts.yml", tmp / "alerts.yml")
    scrape = (OPS / "prometheus/prometheus.yml").read_text()
    scrape = scrape.replace("/etc/prometheus/alerts.yml", str(tmp / "alerts.yml"))
    scrape = re.sub(r'targets: \[.*\]', "targets: [" + ", ".join(f'"{t}"' for t in targets)
                    + "]", scrape)
    (tmp / "prometheus.yml").write_text(scrape)
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=open(tmp / "prometheus.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.monotonic() + 30
    while not port_open("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("prometheus did not start:\n"
                             + (tmp / "prometheus.log").read_text()[-2000:])
        time.sleep(0.2)
    return proc, port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20, help="scraping time before the checks")
    args = ap.parse_args()
    cfg = tomllib.loads((OPS / "compose.queues.toml").read_text())
    queues = [q["name"] for q in cfg["queue"]]
    topics = sorted({t for q in cfg["queue"] for t in re.findall(
        r"[A-Z][A-Z0-9_]+", q.get("underlying_topic", f"^{q['name']}$"))})
    problems: list[str] = []
    wanted = queried_series()
    # the compose file's Kafka: stock group rules, one partition per new topic
    settings = {"group.min.session.timeout.ms": "6000", "num.partitions": "1"}
    with ApacheKafka(settings=settings) as kafka, tempfile.TemporaryDirectory() as d:
        tmp, bs = Path(d), kafka.bootstrap_servers
        print(f"Apache Kafka {kafka.version} at {bs} (started in {kafka.started_in_s:.1f} s)")
        clients.ensure_topics(clients.admin(bs), topics)
        ports = {name: free_port() for name in INSTANCES}
        serves = []
        for name in INSTANCES:
            env = {"KQ_INSTANCE": name, "KQ_DATA_DIR": str(tmp / name)}
            log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115
            serves.append(subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--config",
                 str(instance_config(tmp, name, ports[name])), "--bootstrap-servers", bs],
                cwd=ROOT, env={**os.environ, **env}, stdout=log,
                stderr=subprocess.STDOUT))
        prometheus = None
        try:
            deadline = time.monotonic() + 90
            while not shared_out(bs, cfg["service"]["shards"]):
                if time.monotonic() > deadline or any(s.poll() is not None for s in serves):
                    raise SystemExit("the instances did not share every shard:\n" + "\n".join(
                        (tmp / f"{n}.log").read_text()[-1500:] for n in INSTANCES))
                time.sleep(1)
            print("both instances serve; putting work through the queues")
            put_work_through(bs, queues, topics)
            targets = [f"127.0.0.1:{p}" for p in ports.values()]
            if shutil.which("prometheus"):
                prometheus, pport = start_prometheus(tmp, targets)
                print(f"Prometheus scraping {targets} at 127.0.0.1:{pport} for "
                      f"{args.seconds:.0f} s")
                time.sleep(args.seconds)
                api = f"http://127.0.0.1:{pport}/api/v1"
                up = json.loads(get(f"{api}/query?query=" + urllib.parse.quote('up{job="kq"}')))
                ups = {r["metric"]["instance"]: r["value"][1] for r in up["data"]["result"]}
                if sorted(ups) != sorted(targets) or set(ups.values()) != {"1"}:
                    problems.append(f"Prometheus targets not all up: {ups}")
                names = set(json.loads(get(f"{api}/label/__name__/values"))["data"])
                rules = json.loads(get(f"{api}/rules"))["data"]["groups"]
                bad = [r["name"] for g in rules for r in g["rules"] if r.get("health") == "err"]
                loaded = sum(len(g["rules"]) for g in rules)
                print(f"alert rules loaded: {loaded}, in error: {bad or 'none'}")
                if not loaded or bad:
                    problems.append(f"alert rules: {loaded} loaded, in error {bad}")
            else:
                print("prometheus is not installed: reading both instances' /metrics")
                names = set()
                for t in targets:
                    names |= set(re.findall(r"^(kq_[a-z_]+)", get(f"http://{t}/metrics"),
                                            re.MULTILINE))
            # a histogram is stored as NAME_bucket, NAME_sum and NAME_count
            present = {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in names} | names
            missing = sorted(w for w in wanted if w not in present)
            print(f"series the dashboard and alerts query: {len(wanted)}, missing: "
                  f"{missing or 'none'}")
            if missing:
                problems.append(f"series missing: {missing}")
        finally:
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait()
            for s in serves:
                s.terminate()
            for s in serves:
                s.wait(30)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
