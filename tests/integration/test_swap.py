"""A deep queue across restarts: a clean stop keeps its pager and the next start uses it; a
kill -9 after that leaves no usable pager and the start after it rebuilds one. Either way each
message is delivered once, in order."""

import json
import signal

import pytest

from broker.client import QueueClient
from tests.integration.kit import kq, publish, serving_one_queue, wait_for

pytestmark = pytest.mark.integration

DEEP = 10_500  # past the window a queue holds in memory (broker.engine.window.WINDOW)


def row(cfg) -> dict:
    return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]


def take_in_order(bootstrap: str, prefix: str, name: str, count: int) -> list[int]:
    """Lease `count` messages, ack each, and return their numbers as delivered."""
    got: list[int] = []
    with QueueClient(bootstrap, topic_prefix=prefix) as c:
        for msg in c.subscribe(name, max_backlog=200).messages(timeout=20):
            got.append(msg.data["n"])
            msg.ack()
            if len(got) == count:
                break
        c.flush()
    return got


def test_a_deep_queue_keeps_its_pager_across_a_clean_stop_and_rebuilds_it_after_a_kill(
        bootstrap, tmp_path):
    extra = 'max_per_subscription_backlog = 200\nlease_period = "1h"\n'
    with serving_one_queue(bootstrap, tmp_path, "SWAP", extra) as (name, cfg, prefix, serve):
        publish(bootstrap, name, [b'{"n": %d}' % i for i in range(DEEP)], key=b"k")
        wait_for(lambda: row(cfg)["enqueued"] == DEEP, 60, "all enqueued")
        assert take_in_order(bootstrap, prefix, name, 500) == list(range(500))
        wait_for(lambda: row(cfg)["acked"] == 500, 20, "the first acks")

        assert serve.stop() == 0  # clean: the windows paged out, the pager marked
        serve.start()
        log = serve.log_path.read_text()
        assert log.count("used as it is") == 1, log[-2000:]
        assert row(cfg)["depth"] == DEEP - 500
        assert take_in_order(bootstrap, prefix, name, 500) == list(range(500, 1000))
        wait_for(lambda: row(cfg)["acked"] == 1000, 20, "the second acks")

        serve.proc.send_signal(signal.SIGKILL)  # the pager is not the state's any more
        serve.wait_exit()
        serve.start()
        assert serve.log_path.read_text().count("used as it is") == 1  # rebuilt this time
        assert row(cfg)["depth"] == DEEP - 1000
        assert take_in_order(bootstrap, prefix, name, DEEP - 1000) == list(range(1000, DEEP))
        wait_for(lambda: row(cfg)["depth"] == 0, 20, "the queue empty")
