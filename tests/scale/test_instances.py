"""Several `kq serve` instances sharing the shards of one config, on the embedded broker:
shards move to an instance added, away from one killed (kill -9) or frozen (SIGSTOP past the
session timeout), and nothing is lost, acked twice or counted back."""

from __future__ import annotations

import gc
import json
import signal
import time
import weakref
from pathlib import Path

import ops.ledger
from broker import wire
from broker.client import QueueClient
from broker.config import load_config
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from tests.integration.kit import (
    ServeProcess,
    config,
    ensure_topic,
    kq,
    publish,
    running_service,
    uid,
    wait_for,
)

SESSION = 3.0  # [service] session_timeout of these tests


def _config(tmp: Path, prefix: str, q0: str, q1: str, bootstrap: str,
            protocol: str = "classic") -> Path:
    path = tmp / "kq.toml"
    path.write_text(f"""
[service.kafka]
"group.protocol" = "{protocol}"
[service]
topic_prefix = "{prefix}"
bootstrap_servers = "{bootstrap}"
metrics_port = 0
heartbeat_timeout = "30s"
shards = 2
session_timeout = "{SESSION:.0f}s"
standby_replicas = 1
[[queue]]
name = "{q0}"
shard = 0
lease_period = "60s"
[[queue]]
name = "{q1}"
shard = 1
lease_period = "60s"
""")
    return path


def _two_queues(bootstrap: str, tmp: Path, stem: str,
                protocol: str = "classic") -> tuple[Path, str, str]:
    """A config of two shards, one queue each (topics made): (config, queue 0, queue 1)."""
    u = uid()
    q0, q1 = f"{stem}0_{u}", f"{stem}1_{u}"
    for q in (q0, q1):
        ensure_topic(bootstrap, q)
    return _config(tmp, f"kq{u}", q0, q1, bootstrap, protocol), q0, q1


def _instance(cfg: Path, tmp: Path, name: str) -> ServeProcess:
    proc = ServeProcess(cfg, tmp / f"{name}.log")
    return proc.start(wait_ready=False, KQ_INSTANCE=name, KQ_DATA_DIR=str(tmp / name))


def _owners(cfg: Path) -> dict[str, str]:
    """Who owns each queue; {} while some shard has no owner to answer."""
    out = kq("queues", "--json", "--config", str(cfg))
    return {r["queue"]: r["owner"] for r in json.loads(out.stdout)} if out.returncode == 0 else {}


def _owned_by(cfg: Path, want: dict[str, str], timeout: float) -> float:
    """Seconds until `kq queues` names these owners."""
    started = time.monotonic()
    wait_for(lambda: _owners(cfg) == want, timeout, f"owners {want}")
    return time.monotonic() - started


class Ledger(ops.ledger.Ledger):
    def take(self, sub, limit: int = 200, timeout: float = 0.5) -> int:  # noqa: ANN001
        """Ack what comes, up to `limit` messages; how many came."""
        got = 0
        for msg in sub.messages(timeout=timeout):
            self.ack(msg)
            got += 1
            if got >= limit:
                break
        return got


def _journal_parts(bootstrap: str, topic: str, partition: int) -> list[tuple[int, dict]]:
    """Every part of a journal partition, with its offset."""
    c = clients.consumer(bootstrap)
    try:
        (lo, end), = real_ends(c, [(topic, partition)]).values()
        return [(rec.offset(), wire.decode("journal", rec.value()))
                for rec in records(c, topic, partition, lo, end)]
    finally:
        c.close()


def _writers_after_takeover(bootstrap: str, topic: str, partition: int) -> list[str]:
    """Journal parts that lie after a later owner's marker but name an earlier writer."""
    reign, stray = None, []
    for offset, part in _journal_parts(bootstrap, topic, partition):
        if part["marker"]:
            reign = part["marker"]
        elif part["writer"] and part["writer"] != reign:
            stray.append(f"offset {offset} by {part['writer']}")
    return stray


def test_shards_move_on_add_kill_and_freeze_and_nothing_is_lost(bootstrap, tmp_path):
    shards_move_on_add_kill_and_freeze(bootstrap, tmp_path, "classic")


def shards_move_on_add_kill_and_freeze(bootstrap: str, tmp_path: Path, protocol: str) -> None:
    """Add an instance, kill -9 it, start it again and freeze it past the session timeout,
    with subscribers acking throughout: the shards follow, and nothing is lost or doubled.
    (Also run under the consumer group protocol, on Apache Kafka: tests/kafka.)"""
    cfg, q0, q1 = _two_queues(bootstrap, tmp_path, "scale", protocol)
    prefix = load_config(cfg).service.topic_prefix
    a = _instance(cfg, tmp_path, "a")
    b = None
    try:
        _owned_by(cfg, {q0: "a", q1: "a"}, 30)
        sent = publish(bootstrap, q0, [b'{"n": %d}' % i for i in range(100)])
        sent += publish(bootstrap, q1, [b'{"n": %d}' % i for i in range(100)])
        ledger = Ledger()
        with QueueClient(bootstrap, topic_prefix=prefix) as client:
            subs = [client.subscribe(q, max_backlog=20) for q in (q0, q1)]
            for sub in subs:
                ledger.take(sub, limit=30)
            # an instance added: one shard moves to it, without a stop
            b = _instance(cfg, tmp_path, "b")
            owners = wait_for(lambda: o if sorted((o := _owners(cfg)).values()) == ["a", "b"]
                              else None, 40, "a shard to move to the new instance")
            b_queue = next(q for q, who in owners.items() if who == "b")
            # kill -9 the instance b under load: its shard comes back to a
            sent += publish(bootstrap, b_queue, [b'{"n": %d}' % i for i in range(50)])
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait()
            took = _owned_by(cfg, {q0: "a", q1: "a"}, SESSION + 30)
            print(f"failover after kill -9: {took:.1f} s")  # noqa: T201
            # b again, then frozen past the session timeout: a takes over, b wakes fenced
            b = _instance(cfg, tmp_path, "b")
            owners = wait_for(lambda: o if sorted((o := _owners(cfg)).values()) == ["a", "b"]
                              else None, 40, "b back")
            frozen_queue = next(q for q, who in owners.items() if who == "b")
            b.proc.send_signal(signal.SIGSTOP)
            sent += publish(bootstrap, frozen_queue, [b'{"n": %d}' % i for i in range(50)])
            _owned_by(cfg, {q0: "a", q1: "a"}, SESSION + 30)
            for sub in subs:
                ledger.take(sub, limit=40)
            b.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: sorted(_owners(cfg).values()) == ["a", "b"], 40,
                     "the woken instance to rejoin and get a shard again")
            deadline = time.monotonic() + 60
            while len(ledger.acked) < len(sent) and time.monotonic() < deadline:
                for sub in subs:
                    ledger.take(sub, timeout=0.3)
            client.flush()
        assert ledger.problems == []
        assert set(sent) <= ledger.acked, f"{len(set(sent) - ledger.acked)} never delivered"
        journal = f"{prefix}.journal"
        assert _writers_after_takeover(bootstrap, journal, 0) == []
        assert _writers_after_takeover(bootstrap, journal, 1) == []
        woke = (tmp_path / "b.log").read_text()
        assert "lost shard" in woke or "took it over" in woke or "released shard" in woke
    finally:
        try:
            for proc in (a, b):
                if proc is not None and proc.proc is not None:
                    proc.proc.send_signal(signal.SIGCONT)
                    proc.stop()
        finally:
            for log in sorted(tmp_path.glob("*.log")):  # shown by pytest when the test fails
                print(f"--- {log.name} (last 40 lines)\n" + "\n".join(  # noqa: T201
                    log.read_text().splitlines()[-40:]))


def test_a_shard_count_other_than_the_journals_is_refused_with_exit_2(bootstrap, tmp_path):
    u = uid()
    ensure_topic(bootstrap, f"kq{u}.journal", partitions=1)  # made by a 1-shard service
    publish(bootstrap, f"kq{u}.journal", [b"its start-up marker"])
    cfg = _config(tmp_path, f"kq{u}", f"a_{u}", f"b_{u}", bootstrap)
    out = kq("serve", "--config", str(cfg), timeout=60)
    assert out.returncode == 2
    assert f"shards = 2, but the journal kq{u}.journal has 1 partition" in out.stderr


def test_an_empty_journal_of_another_shard_count_is_called_lost_data(bootstrap, tmp_path):
    # what a broker restarted empty leaves when a writer made the journal again on the fly
    u = uid()
    ensure_topic(bootstrap, f"kq{u}.journal", partitions=4)
    cfg = _config(tmp_path, f"kq{u}", f"a_{u}", f"b_{u}", bootstrap)
    out = kq("serve", "--config", str(cfg), timeout=60)
    assert out.returncode == 1
    assert "no record" in out.stderr and "Kafka lost data" in out.stderr


def test_kq_queues_shows_the_shards_that_answer_and_names_the_one_that_does_not(
        bootstrap, tmp_path):
    path, q0, q1 = _two_queues(bootstrap, tmp_path, "part")
    path.write_text(path.read_text().replace("[service]\n",
                                             f'[service]\ndata_dir = "{tmp_path / "state"}"\n'))
    with running_service(bootstrap, load_config(path)):  # shard 0 only: shard 1 has no owner
        out = kq("queues", "--json", "--config", str(path))
    assert out.returncode == 1
    assert [r["queue"] for r in json.loads(out.stdout)] == [q0]
    assert "shard 1 did not answer" in out.stderr and q1 in out.stderr


def test_a_second_process_with_an_instance_name_in_use_stops_with_exit_2(bootstrap, tmp_path):
    """A config copied with its `instance` line, started twice: the later started of two
    live processes with one name stops, naming the other, before it joins the group (no
    shard moves); the first goes on serving."""
    cfg, q0, q1 = _two_queues(bootstrap, tmp_path, "twin")
    first = _instance(cfg, tmp_path, "a")
    twin = ServeProcess(cfg, tmp_path / "twin.log")
    try:
        _owned_by(cfg, {q0: "a", q1: "a"}, 30)
        twin.start(wait_ready=False, KQ_INSTANCE="a", KQ_DATA_DIR=str(tmp_path / "twin"))
        assert twin.wait_exit(60) == 2
        said = " ".join(twin.log_path.read_text().split())
        assert "another kq serve already runs as instance 'a'" in said
        assert f"pid {first.proc.pid}" in said
        assert "joining group" not in said and "takes shard" not in said
        assert first.proc.poll() is None
        _owned_by(cfg, {q0: "a", q1: "a"}, 30)
        listed = json.loads(kq("instances", "--json", "--config", str(cfg)).stdout)
        assert [(i["instance"], i["live"], i["pid"]) for i in listed] == [
            ("a", True, first.proc.pid)]
        assert f"{listed[0]['host']}:{first.proc.pid}" in kq(
            "instances", "--config", str(cfg)).stdout
    finally:
        twin.stop()
        first.stop()


def test_a_config_with_other_queues_on_a_prefix_in_use_stops_with_exit_2(bootstrap, tmp_path):
    """Two configs on one topic prefix, each with queues of its own: the second instance
    used to wait at "joining group" saying nothing; it stops before joining, naming the
    instance and the queues that differ."""
    cfg, q0, q1 = _two_queues(bootstrap, tmp_path, "cfg")
    first = _instance(cfg, tmp_path, "a")
    other_cfg = tmp_path / "other.toml"
    other_cfg.write_text(cfg.read_text().replace(f'name = "{q1}"', 'name = "ELSEWHERE"'))
    other = ServeProcess(other_cfg, tmp_path / "other.log")
    try:
        _owned_by(cfg, {q0: "a", q1: "a"}, 30)
        other.start(wait_ready=False, KQ_INSTANCE="b", KQ_DATA_DIR=str(tmp_path / "b"))
        assert other.wait_exit(60) == 2
        said = " ".join(other.log_path.read_text().split())
        assert "instance a" in said and "queues only here: ELSEWHERE" in said
        assert f"queues only there: {q1}" in said and "joining group" not in said
        assert first.proc.poll() is None
    finally:
        other.stop()
        first.stop()


def _replayed_at_takeover(log: Path, shard: int) -> int:
    """Journal batches the last restore of `shard` replayed, as its "ready" line says."""
    said = [line for line in log.read_text().splitlines() if f"ready: shard {shard}," in line]
    assert said, f"{log.name} never says shard {shard} is ready"
    return int(said[-1].split("queue(s), ")[1].split(" batch")[0])


def test_a_standby_takes_over_a_long_journal_replaying_only_its_tail(bootstrap, tmp_path):
    """What standby_replicas = 1 is for: the instance that kept a shard warm, given it after
    its owner's kill -9, replays the last batches of the journal, not the whole of it."""
    cfg, q0, q1 = _two_queues(bootstrap, tmp_path, "warm")
    prefix = load_config(cfg).service.topic_prefix
    a, b = _instance(cfg, tmp_path, "a"), None
    try:
        _owned_by(cfg, {q0: "a", q1: "a"}, 30)
        b = _instance(cfg, tmp_path, "b")
        owners = wait_for(lambda: o if sorted((o := _owners(cfg)).values()) == ["a", "b"]
                          else None, 40, "a shard to move to b")
        queue = next(q for q, who in owners.items() if who == "a")
        shard = [q0, q1].index(queue)
        sent = publish(bootstrap, queue, [b'{"n": %d}' % i for i in range(600)])
        ledger = Ledger()
        with QueueClient(bootstrap, topic_prefix=prefix) as client:
            sub = client.subscribe(queue, max_backlog=5)  # many small batches
            while len(ledger.acked) < len(sent):
                assert ledger.take(sub, timeout=5), "the queue stopped delivering"
            client.flush()

        def warm() -> bool:
            listed = json.loads(kq("instances", "--json", "--config", str(cfg)).stdout or "[]")
            return any(i["instance"] == "b" and shard in i["standby"] and
                       all(v["records"] == 0 for v in i["lag"].values()) for i in listed)

        wait_for(warm, 30, f"b to keep shard {shard} warm and caught up")
        journal = len({part["batch"] for _, part in
                       _journal_parts(bootstrap, f"{prefix}.journal", shard)})
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        _owned_by(cfg, {q0: "b", q1: "b"}, SESSION + 30)
        replayed = _replayed_at_takeover(tmp_path / "b.log", shard)
        assert journal > 100, "the journal was meant to be long"
        assert replayed <= 5, f"b replayed {replayed} of {journal} journal batches"
        assert ledger.problems == []
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.stop()


def _kafka_client_threads() -> int:
    """librdkafka's threads in this process: each live client has a few."""
    tasks = Path("/proc/self/task")
    return sum(1 for t in tasks.iterdir() if (t / "comm").read_text().startswith("rdk:"))


def test_a_shard_that_stopped_in_a_process_frees_its_state_and_kafka_clients(
        bootstrap, tmp_path):
    """An instance runs shards one after another as they move to and from it: a stopped
    shard's service (its engine and queues, its Kafka clients and their threads) must go,
    or a long-lived instance grows with every move (and runs out of thread-local keys)."""
    u = uid()
    name = f"FREE_{u}"
    ensure_topic(bootstrap, name)
    publish(bootstrap, name, [b'{"n": %d}' % i for i in range(50)])
    threads_before = _kafka_client_threads()
    gone = []
    for _ in range(2):  # the second start must not keep the first one's service either
        cfg = config(f"kq{u}", str(tmp_path / "state"), [{"name": name}])
        with running_service(bootstrap, cfg) as service:
            wait_for(lambda s=service: s.engine.queues[name].stats.next_seq >= 50, 30,
                     "the messages to be queued")
        gone.append(weakref.ref(service))
        del service
    gc.collect()
    assert [ref() is None for ref in gone] == [True, True]
    wait_for(lambda: _kafka_client_threads() <= threads_before, 10,
             "the stopped services' Kafka client threads to end")
