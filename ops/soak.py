"""Soak: kill -9 the service at random moments under load, then account for every message.

    python ops/soak.py [--messages 100000] [--kills 50] [--instances 1] [--bootstrap HOST:PORT]

Publishes the messages to 2 queues while 4 subscriber processes work them (one cancels 10%,
one lets 5% of its leases lapse, two ack everything) and the service is SIGKILLed and
restarted `--kills` times. Then it waits until the queues are empty and checks, from the
journal and the subscribers' own logs: every published message was enqueued once and ended
acked or removed with a reason; no delivery count went back; no message was delivered after
the lease it was acked under.

With `--instances N` (N > 1), N `kq serve` instances share N shards (one queue per shard, at
least 2 queues; standby_replicas = 1), and each of the `--kills` events picks an instance at
random and either kills it (-9, then restarts it) or freezes it (SIGSTOP past the session
timeout, then SIGCONT: it must wake fenced). The check adds: an owner writes at most one
batch after a later owner's takeover marker (frozen between its fence's look and its write;
every reader ignores the batch, and the fence stops the owner after it), none with
`--exactly-once` (the broker refuses it). `kq journal audit` (on Spark) runs mid-run, a
quarter of the way through the disturbances (every queued message's state, delivery and
cancel counts and holder are compared), and at the end (the counters): it must find no
difference between the journal and the live instances (`--no-audit` skips it). So that the
mid-run audit has queued messages to compare however fast the service drains, the publisher
keeps back a reserve of the messages until then, and the subscribers unsubscribe while it
is published and audited.
The crash tests `tests/crash/test_random_kills.py` run it small.

With `--journal-retention 3m --snapshot-interval 20s` (on Apache Kafka, which applies
retention; with `--rate` for a steady load) the journal's head is deleted during the run:
restores come from snapshots, the soak checks against its own copy of the journal, and the
journal's size on the broker is printed every 30 s (it must level off).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from broker.kafka import clients  # noqa: E402
from broker.kafka.started import BROKERS, given_or_started  # noqa: E402
from ops.soak_check import Report, check, committed_transitions, read_all  # noqa: E402
from ops.soak_journal import Retention  # noqa: E402
from ops.soak_worker import BACKLOG, BEHAVIOURS, hold_file_of  # noqa: E402

MID_AUDIT_DEPTH = 1000  # queued messages the mid-run audit waits for
MID_AUDIT_RESERVE = 5000  # messages published only at the mid-run audit (at most a fifth)
SESSION_S = 3.0  # [service] session_timeout of the soak's instances


# -- orchestration -----------------------------------------------------------------------------

def _config(tmp: Path, bootstrap: str, prefix: str, queues: list[str], dlq: str,
            shards: int = 1, exactly_once: bool = False, service: str = "") -> Path:
    lines = ["[service]", f'bootstrap_servers = "{bootstrap}"', f'topic_prefix = "{prefix}"',
             f'data_dir = "{tmp / "state"}"', "metrics_port = 0", 'heartbeat_timeout = "3s"',
             f'session_timeout = "{SESSION_S:.0f}s"', f"shards = {shards}",
             f"standby_replicas = {1 if shards > 1 else 0}",
             f"exactly_once = {str(exactly_once).lower()}", *service.splitlines()]
    for i, q in enumerate(queues):
        lines += ["[[queue]]", f'name = "{q}"', 'lease_period = "2s"', "max_deliveries = 10",
                  f"max_per_subscription_backlog = {BACKLOG}",
                  f'dead_letter_topic = "{dlq}"', f"shard = {i % shards}"]
    path = tmp / "kq.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Service:
    """One `kq serve` instance (named `name`, with its own data_dir when there are several)."""

    def __init__(self, cfg: Path, log: Path, name: str | None = None) -> None:
        self.cfg, self.log, self.name = cfg, log, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.data_dir = cfg.parent / name if name else cfg.parent / "state"

    def start(self, wait_ready: bool = True) -> None:
        before = self.log.read_text().count("ready:") if self.log.exists() else 0
        env = dict(os.environ)
        if self.name:
            env.update(KQ_INSTANCE=self.name, KQ_DATA_DIR=str(self.data_dir))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--config", str(self.cfg)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while wait_ready and self.log.read_text().count("ready:") <= before:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"kq serve did not start; see {self.log}")
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def freeze(self, seconds: float) -> None:
        """SIGSTOP for `seconds` (past the session timeout, its shards move), then SIGCONT."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(30)


def _publish(bootstrap: str, topics: list[str], n: int, out: list[str],
             rate: float = 0, reserve: int = 0, go_on: threading.Event | None = None) -> None:
    """`n` messages over `topics`; the last `reserve` of them only once `go_on` is set."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def report(err: Any, msg: Any) -> None:
        if err is None:
            out.append(f"{msg.topic()}/{msg.partition()}/{msg.offset()}")

    began = time.monotonic()
    for i in range(n):
        if i == n - reserve and go_on is not None:
            p.flush(120)
            go_on.wait()
        if rate and (ahead := began + i / rate - time.monotonic()) > 0:
            time.sleep(ahead)  # a steady rate
        while True:
            try:
                p.produce(topics[i % len(topics)], json.dumps({"i": i}).encode(), partition=0,
                          on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
            time.sleep(0.01)  # spread the load over the kills
    p.flush(120)


def _queue_rows(bootstrap: str, prefix: str) -> dict[str, dict[str, Any]]:
    """The queues' rows; {} while some shard has no owner to answer (it is moving)."""
    from broker.client import QueueClient
    from broker.errors import KqError

    try:
        with QueueClient(bootstrap, name="soak-cli", topic_prefix=prefix,
                         request_timeout=5) as c:
            return {r["queue"]: r for r in c.query(what="queues")["queues"]}
    except KqError:
        return {}


def _audit(cfg: Path, report: Report, mid_run: bool = False) -> None:
    """`kq journal audit` against the live instances: any difference is a problem. Mid-run
    (the queues deep, subscribers working) it compares every message still queued; at the end
    only the counters (enqueued, acked, removed), as nothing is left queued."""
    when = "mid-run" if mid_run else "at the end"
    out = subprocess.run([sys.executable, "-m", "cli.main", "journal", "audit", "--json",
                          "--config", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    (cfg.parent / f"audit-{when}.log").write_text(out.stdout + out.stderr)  # kept on problems
    try:
        result = json.loads(out.stdout)
    except ValueError:
        report.problems.append(f"kq journal audit {when} failed (exit {out.returncode}): "
                               f"{out.stderr.strip()[-500:]}")
        return
    if mid_run:
        report.audited_mid = result["messages"]
    else:
        report.audited = result["messages"]
    report.problems += [f"audit {when}: {d}" for d in result["differences"][:20]]
    if len(result["differences"]) > 20:
        report.problems.append(f"audit {when}: {len(result['differences'])} differences")


def _mid_run_audit(cfg: Path, report: Report, reserve: threading.Event, hold: Path,
                   bootstrap: str, prefix: str, topics: list[str]) -> None:
    """The audit with messages queued: the subscribers unsubscribe (the leases they hold
    return to the queue), the publisher's reserve goes out, and once MID_AUDIT_DEPTH
    are queued (or 60 s passed) the journal is audited against the instances."""
    hold.touch()
    reserve.set()
    try:
        if not _wait_all_served(bootstrap, prefix, topics, 60):
            report.problems.append("mid-run audit: some shard had no owner for 60 s")
            return
        deadline = time.monotonic() + 60
        while sum(r["depth"] for r in _queue_rows(bootstrap, prefix).values()) < \
                MID_AUDIT_DEPTH and time.monotonic() < deadline:
            time.sleep(0.2)
        _audit(cfg, report, mid_run=True)
    finally:
        hold.unlink()


def _wait_all_served(bootstrap: str, prefix: str, topics: list[str], seconds: float) -> bool:
    """Until every shard has an owner that answers (a shard moves after a kill)."""
    deadline = time.monotonic() + seconds
    while not set(topics) <= set(_queue_rows(bootstrap, prefix)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _disturb(instances: list[Service], rnd: random.Random, report: Report,
             lose_state: float = 0.0) -> None:
    """One event: one instance killed (-9, then restarted; with probability `lose_state`
    its data_dir deleted in between), or, with several, maybe frozen past the session
    timeout instead."""
    victim = rnd.choice(instances)
    if len(instances) > 1 and rnd.random() < 0.5:
        victim.freeze(SESSION_S + rnd.uniform(0.5, 2.0))
        report.freezes += 1
    else:
        victim.kill()
        report.kills += 1
        if rnd.random() < lose_state:
            shutil.rmtree(victim.data_dir, ignore_errors=True)
            report.states_lost += 1
        victim.start(wait_ready=len(instances) == 1)


def run(bootstrap: str, messages: int, kills: int, tmp: Path,
        min_gap: float = 0.5, max_gap: float = 2.5, seed: int | None = None,
        instances: int = 1, audit: bool = False, exactly_once: bool = False,
        retention: Retention | None = None, rate: float = 0,
        lose_state: float = 0.0) -> Report:
    rnd = random.Random(seed)
    u = uuid.uuid4().hex[:6]
    prefix, dlq = f"soak{u}", f"SOAK_{u}_DLQ"
    topics = [f"SOAK_{u}_{chr(65 + i)}" for i in range(max(2, instances))]
    clients.ensure_topics(clients.admin(bootstrap), [*topics, dlq])
    cfg = _config(tmp, bootstrap, prefix, topics, dlq, shards=instances,
                  exactly_once=exactly_once, service=retention.service if retention else "")
    several = instances > 1
    services = [Service(cfg, tmp / f"serve{i}.log", f"kq{i}" if several else None)
                for i in range(instances)]
    stop_file = tmp / "stop"
    logs = [tmp / f"sub{i}.jsonl" for i in range(len(BEHAVIOURS))]
    subs: list[subprocess.Popen[str]] = []
    stack = contextlib.ExitStack()  # the subscribers' log files
    sub_errs = [stack.enter_context(open(tmp / f"sub{i}.log", "w"))  # noqa: SIM115 - closed below
                for i in range(len(BEHAVIOURS))]
    try:
        for service in services:
            service.start(wait_ready=not several)
        if several and not _wait_all_served(bootstrap, prefix, topics, 120):
            raise SystemExit(f"the instances did not serve every shard; see {tmp}")
        if retention:
            retention.begin(bootstrap, f"{prefix}.journal", instances)
        subs = [subprocess.Popen([sys.executable, str(ROOT / "ops" / "soak_worker.py"),
                                  bootstrap, prefix,
                                  topics[i % len(topics)], BEHAVIOURS[i], str(logs[i]),
                                  str(stop_file)],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True, stderr=err)
                for i, err in enumerate(sub_errs)]
        for s in subs:
            assert s.stdout is not None and s.stdout.readline().strip() == "subscribed"
    except BaseException:  # nothing left running behind a failed start
        procs: list[subprocess.Popen[Any]] = [*subs, *(svc.proc for svc in services if svc.proc)]
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
        stack.close()
        raise
    report = Report()
    published: list[str] = []
    reserve = min(MID_AUDIT_RESERVE, messages // 5) if audit and not rate else 0
    mid_audit = threading.Event()  # the publisher's reserve goes out
    publisher = threading.Thread(target=_publish, daemon=True,  # (joined; not when stopped)
                                 args=(bootstrap, topics, messages, published, rate, reserve,
                                       mid_audit))
    publisher.start()
    try:
        for k in range(kills):
            time.sleep(rnd.uniform(min_gap, max_gap))
            _disturb(services, rnd, report, lose_state)
            if audit and k == kills // 4:
                _mid_run_audit(cfg, report, mid_audit, hold_file_of(stop_file),
                               bootstrap, prefix, topics)
        mid_audit.set()  # (without an audit, or with fewer than 4 disturbances)
        publisher.join()
        deadline = time.monotonic() + 300
        while True:
            rows = _queue_rows(bootstrap, prefix)
            if set(topics) <= set(rows) and sum(  # every shard answered
                    rows[t]["enqueued"] for t in topics) >= messages and all(
                    rows[t]["depth"] == 0 for t in topics):
                break
            if time.monotonic() > deadline:
                report.problems.append(f"queues did not drain: {rows}")
                break
            time.sleep(0.5)
        if audit:
            _audit(cfg, report)
    finally:
        stop_file.touch()
        for s in subs:
            try:
                s.wait(30)
            except subprocess.TimeoutExpired:
                s.kill()
        for service in services:
            service.stop()
        stack.close()
    report.published = len(published)
    queue_of = {bm: bm.rsplit("/", 2)[0] for bm in published}
    deliveries = [json.loads(line) for log in logs if log.exists()
                  for line in log.read_text().splitlines()]
    archive = retention.end(report) if retention else None
    transitions = committed_transitions(bootstrap, f"{prefix}.journal", instances, report,
                                        archive, exactly_once)
    check(report, published, queue_of, transitions, deliveries)
    report.dead_letter_records = len(read_all(bootstrap, dlq))
    if report.problems:  # the instances' logs outlive the run's temporary directory
        kept = Path(tempfile.mkdtemp(prefix="kq-soak-logs-"))
        for log in tmp.glob("*.log"):
            shutil.copy(log, kept)
        if archive:  # the journal as it was written: the broker deleted its head
            with open(kept / "journal.jsonl", "w") as out:
                for shard, recs in archive.items():
                    for rec in recs:
                        out.write(json.dumps([shard, rec.offset(), rec.value().hex()]) + "\n")
        report.problems.insert(0, f"the kq serve and subscriber logs are kept in {kept}")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--bootstrap")
    ap.add_argument("--broker", choices=BROKERS, default="embedded",
                    help="without --bootstrap: the broker to start for the run")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--instances", type=int, default=1,
                    help="kq serve instances sharing as many shards (kills become kills or "
                         "freezes)")
    ap.add_argument("--no-audit", dest="audit", action="store_false",
                    help="skip `kq journal audit` at the end")
    ap.add_argument("--exactly-once", action="store_true",
                    help="[service] exactly_once = true: commits are Kafka transactions, and "
                         "the broker fences a frozen owner's writes")
    ap.add_argument("--kill-gap", type=float, default=1.5,
                    help="mean seconds between two disturbances (uniform, 1/3 to 5/3 of it)")
    ap.add_argument("--lose-state", type=float, default=0.0,
                    help="the share of kills after which the instance's data_dir is deleted "
                         "(it restores from a snapshot, or the whole journal)")
    ap.add_argument("--rate", type=float, default=0,
                    help="publish at this many messages/s (default: as fast as it goes)")
    ap.add_argument("--snapshot-interval", help='[service] snapshot_interval, e.g. "20s"')
    ap.add_argument("--journal-retention",
                    help='[service] journal_retention, e.g. "2m": the journal\'s head is '
                         "deleted during the run (the soak keeps its own copy to check "
                         "against) and its size on the broker is printed")
    ap.add_argument("--journal-segment-ms", type=int, default=20_000,
                    help="with --journal-retention: the journal's segment.ms (Kafka deletes "
                         "whole segments only)")
    a = ap.parse_args()
    retention = (Retention(a.snapshot_interval, a.journal_retention, a.journal_segment_ms)
                 if a.journal_retention or a.snapshot_interval else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # its instances stop too
    started = time.monotonic()
    with given_or_started(a.bootstrap, a.broker) as bootstrap, tempfile.TemporaryDirectory() as d:
        report = run(bootstrap, a.messages, a.kills, Path(d), seed=a.seed,
                     min_gap=a.kill_gap / 3, max_gap=a.kill_gap * 5 / 3, lose_state=a.lose_state,
                     instances=a.instances, audit=a.audit, exactly_once=a.exactly_once,
                     retention=retention, rate=a.rate)
    print("\n".join(report.lines()))
    if retention and retention.sampler:
        print(retention.sampler.line())
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
