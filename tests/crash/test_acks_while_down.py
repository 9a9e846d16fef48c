"""Commands sent while `kq serve` is down count as sent in time: after a kill -9 and a
restart, the service reads them before it lets any lease or heartbeat lapse.

On Apache Kafka a restarted service's first fetch of its commands takes up to a second; its
first timer tick came before it and returned leases that acks already waiting in Kafka had
settled in time (issue 31: acked messages delivered again 10 s after their ack)."""

import json
import random
import threading
import time

import pytest

from broker import wire
from broker.client import QueueClient
from tests.integration.kit import (
    ServeProcess,
    drain,
    ensure_topic,
    kq,
    publish,
    read_topic,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

ACK_MARGIN_S = 1.0


def test_acks_sent_while_the_service_was_down_settle_their_leases_after_the_deadline(
        bootstrap, tmp_path):
    u = uid()
    name = f"DOWN_{u}"
    ensure_topic(bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap,
                       extra='lease_period = "2s"\n')
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    with QueueClient(bootstrap, topic_prefix=f"kq{u}", name=f"w-{u}") as worker:
        sub = worker.subscribe(name, max_backlog=5)
        publish(bootstrap, name, [b'{"n": %d}' % i for i in range(5)], key=b"k")
        got = drain(sub, 5)
        serve.proc.kill()  # kill -9 with the five leased
        serve.proc.wait()
        for m in got:  # acked in time, while nobody reads the commands
            m.ack()
        worker.flush()
        deadline = max(m.lease_deadline for m in got)
        assert time.time() < deadline, "the acks must go out before the leases' deadline"
        time.sleep(max(0.0, deadline - time.time()) + 0.5)  # the leases' deadline passes
        serve.start()
        try:
            wait_for(lambda: queue_row_of(cfg, name)["acked"] == 5, 30, "the five acks to count")
            row = queue_row_of(cfg, name)
            assert (row["depth"], row["delivered"]) == (0, 5)  # none was leased again
            assert list(sub.messages(timeout=1)) == []
            assert worker.errors == []  # no ack was refused
        finally:
            serve.stop()


def test_workers_acking_through_six_kills_never_get_an_acked_message_again(bootstrap, tmp_path):
    """Issue 31's scenario, smaller: two queues, three workers each taking 0.1 s per message
    and acking it, 3 s leases and heartbeats, kq serve killed six times 2-6 s apart."""
    u = uid()
    queues = [f"KA_{u}", f"KB_{u}"]
    for q in queues:
        ensure_topic(bootstrap, q)
    lines = "".join(f'[[queue]]\nname = "{q}"\nlease_period = "3s"\n' for q in queues[1:])
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", queues[:1], tmp_path / "state",
                       bootstrap, extra='lease_period = "3s"\n' + lines,
                       service='heartbeat_timeout = "3s"')
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    per_queue = 300
    for q in queues:
        publish(bootstrap, q, [b'{"n": %d}' % i for i in range(per_queue)], key=b"k")
    events: list[tuple[str, str, float, float | None]] = []  # (what, bookmark, at, deadline)
    lock = threading.Lock()
    done = threading.Event()
    refused: list[str] = []

    def work(queue: str, n: int) -> None:
        # (a name per client: two clients of one name share its delivery topic, and the
        # close of one ends the other's subscriptions)
        with QueueClient(bootstrap, topic_prefix=f"kq{u}", name=f"w{n}-{queue}") as c:
            sub = c.subscribe(queue, max_backlog=1)
            while not done.is_set():
                for m in sub.messages(timeout=0.5):
                    with lock:
                        events.append(("got", m.bookmark, time.time(), m.lease_deadline))
                    time.sleep(0.1)
                    sent = time.time()
                    m.ack()
                    with lock:
                        events.append(("ack", m.bookmark, sent, m.lease_deadline))
            refused.extend(c.errors)

    workers = [threading.Thread(target=work, args=(q, n), daemon=True)
               for q in queues for n in range(3)]
    for w in workers:
        w.start()
    rng = random.Random(31)
    try:
        for _ in range(6):
            time.sleep(rng.uniform(2, 6))
            serve.proc.kill()
            serve.proc.wait()
            serve.start()
        wait_for(lambda: sum(queue_row_of(cfg, q)["acked"] for q in queues) == 2 * per_queue,
                 120, "every message acked")
    finally:
        done.set()
        for w in workers:
            w.join(10)
        serve.stop()
    # In time: sent with a second of the 3 s lease left. An ack made just before the deadline
    # while the service runs may reach it after the lease lapsed, and is rightly too late.
    in_time = {}
    for what, bm, at, deadline in events:
        if what == "ack" and deadline is not None and at < deadline - ACK_MARGIN_S:
            in_time.setdefault(bm, at)
    again = [(bm, round(at - in_time[bm], 1)) for what, bm, at, _ in events
             if what == "got" and bm in in_time and at > in_time[bm]]
    story = [(what, bm, round(at, 2), deadline) for what, bm, at, deadline in events
             if bm in {b for b, _ in again[:3]}]
    assert again == [], (f"delivered again after an ack sent in time: {again[:5]}; {story}; "
                         f"refused: {refused}; {journal_around(cfg, again[0][0])}; "
                         f"commands: {commands_of(bootstrap, f'kq{u}', story)}")


def journal_around(cfg, bookmark: str) -> str:
    """Why a message came back (lapsed, its subscription dropped...), and which acks the
    service took meanwhile."""
    life = json.loads(kq("journal", "grep", bookmark, "--config", str(cfg), "--json").stdout)
    times = [t["at_ms"] for t in life["life"]]
    dump = kq("journal", "dump", "--kind", "acked", "--config", str(cfg), "--json").stdout
    acked = [json.loads(line) for line in dump.splitlines()]
    meanwhile = [(a["at_ms"], a["client"], a["bookmark"]) for a in acked
                 if times[1] <= a["at_ms"] <= times[-1]]
    return f"life: {life['life']}; acks taken meanwhile: {meanwhile}"


def commands_of(bootstrap: str, prefix: str, story: list) -> list:
    """The commands sent while the story went on, as Kafka has them: (offset, produced at,
    client, type, bookmarks); heartbeats left out."""
    start, end = story[0][2] - 1, story[-1][2] + 1
    found = []
    for r in read_topic(bootstrap, f"{prefix}.commands", 10**6, timeout=5):
        c = wire.decode("command", r.value())
        if start <= r.timestamp()[1] / 1000 <= end and c["type"] != "heartbeat":
            found.append((r.offset(), r.timestamp()[1] / 1000, c["client"], c["type"],
                          c["packed_bookmarks"] or c["bookmarks"]))
    return found


def queue_row_of(cfg, queue: str) -> dict:
    rows = json.loads(kq("queues", "--config", str(cfg), "--json").stdout)
    return next(r for r in rows if r["queue"] == queue)


def test_a_renewed_lease_outlives_a_kill_9_of_the_service(bootstrap, tmp_path):
    """`msg.extend` is journaled: a restarted service keeps the renewed deadline, instead of
    lapsing the lease at the queue's lease_period."""
    u = uid()
    name = f"EXT_{u}"
    ensure_topic(bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap,
                       extra='lease_period = "2s"\n')
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        with QueueClient(bootstrap, topic_prefix=f"kq{u}", name=f"w-{u}") as worker:
            sub = worker.subscribe(name)
            publish(bootstrap, name, [b'{"job": "long"}'])
            (msg,) = drain(sub, 1)
            renewed = msg.extend("60s")
            serve.proc.kill()  # kill -9 just after the renewal was answered
            serve.proc.wait()
            serve.start()
            time.sleep(max(0.0, msg.timestamp + 4 - time.time()))  # past the 2 s lease
            rows = json.loads(kq("inspect", name, "--json", "--config", str(cfg)).stdout)
            (row,) = rows["messages"]
            assert (row["state"], row["delivery_count"]) == ("leased", 1)
            assert abs(row["lease_deadline_ms"] / 1000 - renewed) < 1
            msg.ack(wait=True)
    finally:
        serve.stop()
