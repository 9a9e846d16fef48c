"""The sync client's own threads (broker/client/sync.py), without Kafka."""

import threading

import pytest

from broker.client.core import ClientCore, SubscriptionState
from broker.client.sync import QueueClient


def client_with_a_lost_subscription() -> QueueClient:
    client = QueueClient.__new__(QueueClient)  # no transport: `_subscribe` is replaced
    client.core = ClientCore("w", "w")
    client._closed = threading.Event()
    sub = SubscriptionState("Q", "s1", "queue", {})
    client.core.add(sub)
    sub.lost = "dropped by the service"
    return client


def test_subscribing_again_ends_quietly_when_the_client_is_closed_meanwhile():
    """Closing the client closes its consumer under the thread subscribing again, whose
    wait for the answer then fails: that is the close, not an error to print."""
    client = client_with_a_lost_subscription()

    def closed_midway(sub):
        client._closed.set()
        raise RuntimeError("Consumer closed")

    client._subscribe = closed_midway
    client._subscribe_again()


def test_subscribing_again_still_raises_what_a_close_does_not_explain():
    client = client_with_a_lost_subscription()

    def broken(sub):
        raise RuntimeError("something else")

    client._subscribe = broken
    with pytest.raises(RuntimeError, match="something else"):
        client._subscribe_again()
