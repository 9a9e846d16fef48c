"""The `kq` command line against a running service (SPEC section 8)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.client import QueueClient
from broker.config import load_config
from tests.integration.kit import (
    KQ,
    ROOT,
    ServeProcess,
    config,
    drain,
    ensure_topic,
    kq,
    publish,
    running_service,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

@pytest.fixture
def served(bootstrap, tmp_path):
    u = uid()
    name = f"CLI_{u}"
    ensure_topic(bootstrap, name)
    cfg = config(f"kq{u}", str(tmp_path / "state"), [{"name": name}])
    path = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap)
    with running_service(bootstrap, cfg) as service:
        yield name, str(path), service


def test_publish_queues_inspect_consume_subscribers(bootstrap, served):
    name, cfg, _ = served
    out = kq("publish", name, '{"n": 1}', "--config", cfg, "--json")
    assert out.returncode == 0, out.stderr
    bookmark = json.loads(out.stdout)["bookmark"]
    assert bookmark.startswith(f"{name}/")
    rows = wait_for(lambda: [r for r in json.loads(kq("queues", "--config", cfg, "--json").stdout)
                             if r["depth"] == 1], what="the message in kq queues")
    assert rows[0]["queue"] == name and rows[0]["available"] == 1
    inspected = json.loads(kq("inspect", name, "--config", cfg, "--json").stdout)
    assert [(m["bookmark"], m["state"]) for m in inspected["messages"]] == [(bookmark, "available")]
    table = kq("queues", "--config", cfg)
    assert name in table.stdout and table.returncode == 0
    for command in (["queues"], ["inspect", name]):  # an 80-column terminal: nothing cut
        narrow = kq(*command, "--config", cfg, COLUMNS="80")
        assert narrow.returncode == 0 and "…" not in narrow.stdout, narrow.stdout
        assert name in narrow.stdout and all(len(li) <= 80 for li in narrow.stdout.splitlines())
    consumed = kq("consume", name, "--config", cfg, "--json", "--count", "1", "--timeout", "5")
    assert consumed.returncode == 0, consumed.stderr
    assert json.loads(consumed.stdout.splitlines()[0])["data"] == {"n": 1}
    after = json.loads(kq("queues", "--config", cfg, "--json").stdout)[0]
    assert (after["depth"], after["acked"]) == (0, 1)
    subs = kq("subscribers", name, "--config", cfg, "--json")
    assert json.loads(subs.stdout) == []  # the consumer closed its subscription


def test_inspect_of_unknown_queue_fails_with_the_services_message(served):
    _, cfg, _ = served
    out = kq("inspect", "NOPE", "--config", cfg)
    assert out.returncode == 2 and "unknown queue 'NOPE'" in out.stderr


def test_publish_refuses_a_payload_that_is_not_json(served):
    name, cfg, _ = served
    out = kq("publish", name, "{not json", "--config", cfg)
    assert out.returncode == 2 and "not JSON" in out.stderr


def test_publish_reads_a_large_payload_from_a_file_or_standard_input(bootstrap, served,
                                                                    tmp_path):
    name, cfg, _ = served
    big = json.dumps({"blob": "x" * 300_000})  # over what a shell passes as an argument
    (tmp_path / "big.json").write_text(big)
    by_file = kq("publish", name, f"@{tmp_path / 'big.json'}", "--config", cfg, "--json")
    by_stdin = subprocess.run([*KQ, "publish", name, "-", "--config", cfg, "--json"],
                              input='{"n": 2}', capture_output=True, text=True, cwd=ROOT,
                              timeout=30)
    assert by_file.returncode == 0 and by_stdin.returncode == 0, by_file.stderr
    with QueueClient(bootstrap, topic_prefix=load_config(cfg).service.topic_prefix) as c:
        got = [m.data for m in drain(c.subscribe(name, max_backlog=2), 2)]
    assert got == [json.loads(big), {"n": 2}]
    missing = kq("publish", name, "@/no/such/file", "--config", cfg)
    assert missing.returncode == 2 and "/no/such/file" in missing.stderr
    (tmp_path / "huge.json").write_text(json.dumps({"blob": "x" * 2_000_000}))
    huge = kq("publish", name, f"@{tmp_path / 'huge.json'}", "--config", cfg)
    assert huge.returncode == 2, huge.stderr  # the producer's limit named, no traceback
    assert "cannot publish 2,000,012 bytes" in huge.stderr and "message.max.bytes" in huge.stderr


def test_what_the_user_typed_wrong_is_exit_2_whichever_side_finds_it(served):
    name, cfg, _ = served
    for args, said in [(("consume", name, "--filter", "sym = 'IBM'"), "/sym, not sym"),
                       (("inspect", name, "--state", "leasd"), "leasd"),
                       (("ack", name, "--where", "/a = "), "column"),
                       (("journal", "grep", "--topics", name, "--where", "/a = "), "column"),
                       (("journal", "grep", "--topics", "^(ORD"), "bad --topics regex"),
                       (("journal", "replay", "--topics", name, "--to", name),
                        "one of the topics being replayed")]:
        out = kq(*args, "--config", cfg, timeout=60)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr)


def test_version_names_the_distribution():
    out = kq("--version")
    assert out.returncode == 0 and "kafka-queues" in out.stdout


def test_unreachable_kafka_exits_3_naming_the_address_after_the_connection_timeout(tmp_path):
    """Each command gives up after its 10 s connection timeout, not hanging; the seven start
    at once, and on two busy cores starting seven Pythons takes seconds too (20 s in all)."""
    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state")
    commands = [["queues"], ["inspect", "Q"], ["subscribers"], ["recovery-points"],
                ["publish", "T", "{}"],
                ["consume", "Q"], ["serve"]]
    started = time.monotonic()
    procs = [subprocess.Popen([*KQ, *c, "--config", str(cfg), "-b", "127.0.0.1:1"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]  # all at once: each may take the full connection timeout
    for command, proc in zip(commands, procs, strict=True):
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 3, (command, err)
        assert "127.0.0.1:1" in err
    assert time.monotonic() - started < 20


def test_a_refused_login_is_named_not_just_a_timeout(bootstrap, tmp_path):
    """The embedded broker refuses every SASL login: the error says that, not only that
    metadata did not come."""
    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state", bootstrap)
    cfg.write_text(cfg.read_text().replace("[[queue]]", (
        '[service.kafka]\n"security.protocol" = "SASL_PLAINTEXT"\n'
        '"sasl.mechanisms" = "PLAIN"\n"sasl.username" = "u"\n"sasl.password" = "p"\n'
        "[[queue]]"), 1))
    out = kq("queues", "--config", str(cfg))
    assert out.returncode == 3, out.stderr
    assert bootstrap in out.stderr and "SASL" in out.stderr


@pytest.mark.parametrize(("extra", "words"), [
    ('lease_period = "forever"\n', "'lease_period'"),
    ("colour = 1\n", "'colour': unknown key"),
    ('semantics = "at-most-once"\nfairness = "proportional"\n', "fairness"),
    ('group_mode = "shared"\n', "group_mode = 'shared' needs group_key"),
])
def test_serve_refuses_a_bad_config_with_exit_2(tmp_path, extra, words):
    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state", extra=extra)
    out = kq("serve", "--config", str(cfg))
    assert out.returncode == 2
    assert "queue 'Q'" in out.stderr and words in out.stderr


def test_a_query_with_a_prefix_no_service_used_says_so_at_once(bootstrap, tmp_path):
    cfg = write_config(tmp_path / "kq.toml", f"none{uid()}", ["Q"], tmp_path / "s", bootstrap)
    started = time.monotonic()
    out = kq("queues", "--config", str(cfg))
    assert out.returncode == 1 and "no kq service has run with topic prefix" in out.stderr
    assert time.monotonic() - started < 8  # not the 10 s answer wait (and a flush before it)


def test_serve_restart_keeps_messages_delivery_counts_and_positions(bootstrap, tmp_path):
    u = uid()
    name = f"R_{u}"
    ensure_topic(bootstrap, name)
    cfg = str(write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state",
                           bootstrap, extra='lease_period = "1h"\n'))

    def serve() -> ServeProcess:
        return ServeProcess(Path(cfg), tmp_path / "serve.log").start()

    proc = serve()
    publish(bootstrap, name, [b'{"n": %d}' % i for i in range(3)])
    with QueueClient(bootstrap, name=f"c-{u}", topic_prefix=f"kq{u}") as c:
        next(c.subscribe(name, max_backlog=1).messages(timeout=30)).cancel()
    before = json.loads(kq("inspect", name, "--config", cfg, "--json").stdout)
    assert before["summary"]["depth"] == 3
    assert proc.stop() == 0
    proc = serve()
    try:
        after = json.loads(kq("inspect", name, "--config", cfg, "--json").stdout)
        strip = lambda d: [(m["bookmark"], m["state"], m["delivery_count"], m["cancel_count"])  # noqa: E731
                           for m in d["messages"]]
        assert strip(after) == strip(before)
        # the cancelled message was delivered (and maybe redelivered before the close)
        assert sorted(m["cancel_count"] for m in after["messages"]) == [0, 0, 1]
        assert max(m["delivery_count"] for m in after["messages"]) >= 1
        assert after["recovery_points"] == before["recovery_points"]
        assert after["summary"]["enqueued"] == 3  # not read twice from the topic
    finally:
        proc.stop()


def test_consume_no_ack_shows_each_message_once_and_gives_them_all_back(bootstrap, served):
    name, cfg, _ = served
    publish(bootstrap, name, [b'{"n": %d}' % i for i in range(3)], key=b"k")
    wait_for(lambda: json.loads(kq("queues", "--config", cfg, "--json").stdout)[0]["depth"]
             == 3, what="3 messages queued")
    got = kq("consume", name, "--config", cfg, "--json", "--count", "2", "--no-ack",
             "--timeout", "10")
    assert got.returncode == 0, got.stderr
    rows = [json.loads(line) for line in got.stdout.splitlines()]
    # two messages, each shown once at its first delivery (a cancelled one would have come
    # straight back, a delivery more each time)
    assert [(r["data"], r["delivery_count"]) for r in rows] == [({"n": 0}, 1), ({"n": 1}, 1)]

    def states() -> list[tuple[str, int, int]]:
        after = json.loads(kq("inspect", name, "--config", cfg, "--json").stdout)["messages"]
        return sorted((m["state"], m["delivery_count"], m["cancel_count"]) for m in after)

    wait_for(lambda: states() == [("available", 0, 0), ("available", 1, 0),
                                  ("available", 1, 0)], what="both given back, unanswered")


def test_kq_broker_serves_and_stops_on_sigterm(tmp_path):
    from broker.kafka.embedded import free_port, port_open

    port = free_port()
    proc = subprocess.Popen([*KQ, "broker", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: port_open("127.0.0.1", port), 15, "the broker port")
    assert kq("publish", "T", "{}", "-b", f"127.0.0.1:{port}").returncode == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert not port_open("127.0.0.1", port)


def test_serve_on_the_embedded_broker_starts_again_after_a_stop(tmp_path):
    """`make run` twice: the second embedded broker is empty, the old state must not block."""
    from broker.kafka.embedded import free_port

    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state")
    port = free_port()
    for _ in range(2):
        log = tmp_path / "serve.log"
        serve = ServeProcess(cfg, log)
        serve.proc = None
        before = log.read_text().count("ready:") if log.exists() else 0
        with open(log, "a") as out:
            proc = subprocess.Popen([*KQ, "serve", "--config", str(cfg), "--broker-port",
                                     str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: log.read_text().count("ready:") > before or proc.poll() is not None,  # noqa: B023
                 30, "kq serve on the embedded broker")
        assert proc.poll() is None, log.read_text()
        assert f"127.0.0.1:{port}" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "cleared" in log.read_text()


def test_a_killed_serve_does_not_leave_its_embedded_broker_behind(tmp_path):
    from broker.kafka.embedded import free_port, port_open

    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state")
    port = free_port()
    log = tmp_path / "serve.log"
    for attempt in range(2):  # the second start finds the port free again
        with open(log, "a") as out:
            proc = subprocess.Popen([*KQ, "serve", "--config", str(cfg), "--broker-port",
                                     str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: log.read_text().count("ready:") > attempt  # noqa: B023
                 or proc.poll() is not None, 30, "kq serve on the embedded broker")  # noqa: B023
        assert proc.poll() is None, log.read_text()
        proc.kill()  # SIGKILL: no chance to stop the broker itself
        proc.wait()
        wait_for(lambda: not port_open("127.0.0.1", port), 15, "the orphaned broker to stop")


def test_the_guard_passes_signals_on_and_follows_its_command(tmp_path):
    guard = [sys.executable, "-m", "broker.kafka.guard"]
    ended = subprocess.Popen([*guard, sys.executable, "-c", "raise SystemExit(3)"], cwd=ROOT,
                             stdin=subprocess.PIPE)  # held open: we are alive
    assert ended.wait(15) == 3  # the command ended by itself: so does the guard
    marker = tmp_path / "stopped"
    script = ("import signal, sys, time, pathlib\n"
              "def bye(*_):\n"
              f"    pathlib.Path({str(marker)!r}).write_text('TERM'); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('up', flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([*guard, sys.executable, "-c", script], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert marker.read_text() == "TERM"  # the command was asked to stop, and did


@pytest.mark.parametrize("setting", ['"bogus.setting" = "1"',  # librdkafka refuses it
                                     '"enable.auto.commit" = true'])  # kq's to set
def test_a_kafka_setting_librdkafka_or_kq_refuses_is_a_config_error(tmp_path, setting):
    cfg = write_config(tmp_path / "kq.toml", "kq", ["Q"], tmp_path / "state", "127.0.0.1:1")
    text = cfg.read_text().replace("[[queue]]", f"[service.kafka]\n{setting}\n[[queue]]", 1)
    cfg.write_text(text)
    key = setting.split('"')[1]
    for command in (["serve"], ["queues"]):
        out = kq(*command, "--config", str(cfg))
        assert out.returncode == 2, out.stderr
        assert "[service.kafka]" in out.stderr and key in out.stderr


def test_consume_exits_1_when_the_service_refused_its_acks(bootstrap, tmp_path):
    """Every lease of this queue lapses at once, so each ack comes too late and is refused:
    kq consume printed the messages and "N message(s)" and exited 0, none acked."""
    u = uid()
    name = f"CLILATE_{u}"
    ensure_topic(bootstrap, name)
    cfg = config(f"kq{u}", str(tmp_path / "state"), [{"name": name, "lease_period": "1ms"}])
    path = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap,
                        extra='lease_period = "1ms"\n')
    with running_service(bootstrap, cfg):
        publish(bootstrap, name, [b'{"n": 1}'])
        got = kq("consume", name, "--config", str(path), "--count", "1", "--timeout", "10")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "1 message(s)" in got.stdout and "ack(s) refused" in got.stderr
