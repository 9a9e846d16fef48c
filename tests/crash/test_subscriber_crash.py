"""A subscriber process killed with SIGKILL: its leases return and go to the others."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from broker.client import QueueClient
from tests.integration.kit import (
    ROOT,
    config,
    drain,
    ensure_topic,
    publish,
    running_service,
    uid,
)

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT_S = 2.0

WORKER = textwrap.dedent("""
    import sys, time
    from broker.client import QueueClient
    bootstrap, prefix, queue = sys.argv[1:4]
    c = QueueClient(bootstrap, topic_prefix=prefix)
    sub = c.subscribe(queue, max_backlog=3)
    got = 0
    for msg in sub.messages(timeout=30):
        got += 1
        if got == 3:
            print("holding 3", flush=True)
            time.sleep(3600)  # never acks: killed while holding the leases
""")


def test_killed_subscriber_leases_go_to_another_within_heartbeat_timeout(bootstrap, tmp_path):
    u = uid()
    name = f"SUB_{u}"
    ensure_topic(bootstrap, name)
    cfg = config(f"kq{u}", str(tmp_path), [{"name": name, "lease_period": "1h"}],
                 heartbeat_timeout=f"{HEARTBEAT_TIMEOUT_S}s")
    with running_service(bootstrap, cfg):
        worker = subprocess.Popen([sys.executable, "-c", WORKER, bootstrap, f"kq{u}", name],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        bms = publish(bootstrap, name, [b'{"n": %d}' % i for i in range(3)])
        assert worker.stdout.readline().strip() == "holding 3"
        with QueueClient(bootstrap, topic_prefix=f"kq{u}") as other:
            sub = other.subscribe(name, max_backlog=5)
            assert drain(sub, 1, timeout=0.5) == []  # all three are leased to the worker
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            killed = time.monotonic()
            got = drain(sub, 3, timeout=10)
            elapsed = time.monotonic() - killed
        assert sorted(m.bookmark for m in got) == sorted(bms)
        assert {m.delivery_count for m in got} == {2}
        # silent for heartbeat_timeout (from its last beat, <= 1 s before the kill) + a tick
        assert elapsed <= HEARTBEAT_TIMEOUT_S + 1.0
