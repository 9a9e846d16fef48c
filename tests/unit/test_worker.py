"""`kq worker`'s handling of one message (broker/client/worker.py), without Kafka."""

import threading

import pytest

from broker.client.message import Message
from broker.client.worker import Worker


class Answers:
    """The client side a Message calls: keeps the answers."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def _cancel(self, msg, delay) -> None:
        self.cancelled.append(msg.bookmark)

    def _expire(self, msg) -> None:
        raise AssertionError("not expected")


def worker(handler) -> Worker:
    w = Worker.__new__(Worker)  # no client: `_handle` is what is tried
    w.handler, w.is_async, w.handled, w.failed = handler, False, 0, 0
    w._count_lock, w._slots = threading.Lock(), threading.BoundedSemaphore(1)
    w._slots.acquire()
    return w


def message(client: Answers, barrier: bool = False) -> Message:
    return Message("Q", "T/0/1", None, None, [], 1, None, barrier, 0, client)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, ValueError])
def test_a_handler_that_raises_anything_has_its_message_cancelled_and_counted(raised):
    """KeyboardInterrupt and SystemExit went past `except Exception` into the pool's future:
    the message was neither cancelled nor logged and waited out its lease."""
    def handler(msg):
        raise raised("no")

    client = Answers()
    w = worker(handler)
    w._handle(message(client))
    assert client.cancelled == ["T/0/1"] and w.failed == 1


def test_a_barrier_is_not_cancelled_or_expired_it_needs_no_answer():
    """Sent, both were refused by the service ("not in queue") into client.errors."""
    client = Answers()
    barrier = message(client, barrier=True)
    barrier.cancel()
    barrier.expire()
    assert client.cancelled == [] and not barrier.answered

