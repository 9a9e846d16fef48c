"""One of the soak's subscriber processes (ops/soak.py starts four): it works a queue in one of
BEHAVIOURS and logs every message it takes, with its delivery count and what it did, as a
JSON line; it stops once the stop file exists and its buffer is empty, and holds off (its
subscription closed) while a hold file beside the stop file exists.

    python ops/soak_worker.py BOOTSTRAP PREFIX QUEUE BEHAVIOUR LOG STOP_FILE
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BEHAVIOURS = ("ack", "cancel-10%", "lapse-5%", "ack")
BACKLOG = 100


def hold_file_of(stop_file: str | Path) -> Path:
    """Where the soak asks its subscribers to hold off: beside the stop file."""
    return Path(stop_file).with_name("hold")


def subscriber(bootstrap: str, prefix: str, queue: str, behaviour: str, log: str,
               stop_file: str) -> None:
    from broker.client import QueueClient

    # the client's warnings (a subscription dropped and made again) go to stderr: sub<i>.log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rnd = random.Random(log)
    with QueueClient(bootstrap, topic_prefix=prefix) as c, open(log, "w") as out:
        sub = c.subscribe(queue, max_backlog=BACKLOG)
        print("subscribed", flush=True)
        hold_file = hold_file_of(stop_file)
        while not (os.path.exists(stop_file) and not sub.buffer):
            if hold_file.exists():  # the mid-run audit: leave the messages queued
                sub = _held(c, sub, queue, hold_file)
                continue
            for msg in sub.messages(timeout=0.5):
                action = "ack"
                if behaviour == "cancel-10%" and rnd.random() < 0.10:
                    action = "cancel"
                elif behaviour == "lapse-5%" and rnd.random() < 0.05:
                    action = "lapse"
                out.write(json.dumps([msg.bookmark, msg.delivery_count, action]) + "\n")
                if action == "ack":
                    msg.ack()
                elif action == "cancel":
                    msg.cancel()
                if hold_file.exists():  # (under load the messages never stop coming)
                    break


def _held(c: Any, sub: Any, queue: str, hold_file: Path) -> Any:
    """Unsubscribed while `hold_file` exists (the leases held return to the queue), then
    subscribed again."""
    from broker.errors import KqError

    with contextlib.suppress(KqError):  # not heard: its leases lapse instead
        c.flush()  # the acks taken so far go before the leases return
        sub.close()
    while hold_file.exists():
        time.sleep(0.1)
    for _ in range(4):  # (a shard may be between owners: tried again a second later)
        with contextlib.suppress(KqError):
            return c.subscribe(queue, max_backlog=BACKLOG)
        time.sleep(1)
    return c.subscribe(queue, max_backlog=BACKLOG)


if __name__ == "__main__":
    subscriber(*sys.argv[1:7])
