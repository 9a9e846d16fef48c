"""Browsing a queue end to end: copies to the browser, the queue left as it was."""

import json
import time

import pytest

from broker.client import CommandError, QueueClient
from tests.integration.kit import drain, kq, publish, serving_one_queue

pytestmark = pytest.mark.integration

SIGKILLED = -9


def inspect(cfg, name):
    out = kq("inspect", name, "--config", str(cfg), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_browser_sees_queued_and_new_messages_and_consumers_still_get_them(
        bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "BROWSE") as (name, cfg, prefix, _):
        first = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}'])
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            browser = c.subscribe(name, mode="browse")
            assert browser.mode == "browse"
            seen = drain(browser, 2)
            later = publish(bootstrap, name, [b'{"n": 3}'])
            seen += drain(browser, 1)
            assert [m.bookmark for m in seen] == first + later
            assert [m.data["n"] for m in seen] == [1, 2, 3]
            assert {(m.browsed, m.lease_deadline) for m in seen} == {(True, None)}
            for m in seen:
                m.ack()  # a copy has nothing to ack: no error, no change
            c.flush()
            summary = inspect(cfg, name)["summary"]
            assert (summary["available"], summary["acked"]) == (3, 0)

            consumer = c.subscribe(name, max_backlog=10)
            got = drain(consumer, 3)
            assert sorted(m.bookmark for m in got) == sorted(first + later)
            assert {m.delivery_count for m in got} == {1}  # browsing counted no delivery
            c.ack(name, [m.bookmark for m in got])
            assert list(browser.messages(timeout=0.5)) == []  # nothing shown twice
            assert c.errors == []


def test_a_replay_period_starts_with_recent_messages_only(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "REPLAY") as (name, _, prefix, _):
        old = publish(bootstrap, name, [b'{"n": 1}'])
        time.sleep(1.2)  # the replay period below is measured against record timestamps
        recent = publish(bootstrap, name, [b'{"n": 2}'])
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            browser = c.subscribe(name, mode="browse", replay_period="1s")
            got = drain(browser, 2, timeout=2)
            assert [m.bookmark for m in got] == recent
            assert old[0] not in [m.bookmark for m in got]
            with pytest.raises(CommandError, match="bad replay_period"):
                c.subscribe(name, mode="browse", replay_period="soon")
            with pytest.raises(CommandError, match="browse"):
                c.subscribe(name, replay_period="1s")
            with pytest.raises(CommandError, match="unknown mode"):
                c.subscribe(name, mode="peek")


def test_a_browser_goes_on_where_it_stopped_after_the_service_restarts(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "BRESTART") as (name, _, prefix, serve):
        first = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}'])
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            browser = c.subscribe(name, mode="browse")
            assert [m.bookmark for m in drain(browser, 2)] == first
            serve.stop()
            later = publish(bootstrap, name, [b'{"n": 3}'])
            serve.start()
            got = drain(browser, 2, timeout=5)
            assert [m.bookmark for m in got] == later


def test_a_crash_before_copies_are_sent_shows_them_again(bootstrap, tmp_path):
    with (serving_one_queue(bootstrap, tmp_path, "BCRASH") as (name, _, prefix, serve),
          QueueClient(bootstrap, topic_prefix=prefix) as c):
        browser = c.subscribe(name, mode="browse")
        serve.stop()
        # the browser's cursor is journaled (step 2), then the process dies before the
        # copies go out (step 3)
        serve.start(KQ_CRASH_AFTER_STEP="2", KQ_CRASH_ON_KIND="browsed")
        bms = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}'])
        assert serve.wait_exit() == SIGKILLED
        serve.start()
        got = drain(browser, 2)
        assert [m.bookmark for m in got] == bms


def test_kq_consume_browse_prints_and_leaves_the_queue_alone(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "BCLI") as (name, cfg, _, _):
        bms = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}'])
        out = kq("consume", name, "--config", str(cfg), "--browse", "--count", "2", "--json")
        assert out.returncode == 0, out.stderr
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        assert [r["bookmark"] for r in rows] == [str(b) for b in bms]
        assert inspect(cfg, name)["summary"]["available"] == 2
