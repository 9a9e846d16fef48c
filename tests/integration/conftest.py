"""Fixtures of the integration tier."""

import pytest

from broker.client import QueueClient
from tests.integration.kit import config, ensure_topic, running_service, uid


@pytest.fixture
def world(bootstrap, tmp_path):
    """A fresh prefix and topic per test; `start(**queue_keys)` runs a one-queue service."""
    u = uid()
    topic = f"T_{u}"
    ensure_topic(bootstrap, topic)
    state = {}

    def start(**keys):
        cfg = config(f"kq{u}", str(tmp_path), [{"name": topic, **keys}],
                     **state.pop("service", {}))
        return running_service(bootstrap, cfg)

    def client(**kw):
        return QueueClient(bootstrap, topic_prefix=f"kq{u}", **kw)

    class World:
        pass

    w = World()
    w.topic, w.start, w.client, w.state, w.prefix = topic, start, client, state, f"kq{u}"
    return w
