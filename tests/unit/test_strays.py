"""A queue's state left in a shard that no longer serves it (its `shard` key changed, or it
left the configuration) is named when the shard starts: it was silent, and the queue's new
shard started it from its recovery point (acked messages delivered again)."""

import logging

from broker.config import parse_config
from broker.service.notices import say_strays
from broker.state.layout import queue_key
from broker.state.store import MemoryStore


def test_queues_whose_state_this_shard_no_longer_serves_are_named(caplog):
    config = parse_config({"service": {"shards": 2}, "queue": [
        {"name": "STAYS", "shard": 0}, {"name": "MOVED", "shard": 1}]})
    store = MemoryStore()
    store.write({queue_key(q): b"x" for q in ("STAYS", "MOVED", "GONE")}, [])
    with caplog.at_level(logging.INFO, logger="kq.service"):
        assert say_strays(store, config, 0) == ["GONE", "MOVED"]
    said = " ".join(caplog.messages)
    assert "queue MOVED has state in shard 0, but its `shard` key now places it in shard 1" in said
    assert "Set `shard = 0` on it" in said
    assert "queue GONE has state in shard 0 but is not in the configuration" in said
    assert "STAYS" not in said


def test_a_shard_serving_all_its_queues_says_nothing(caplog):
    config = parse_config({"queue": [{"name": "A"}, {"name": "B"}]})
    store = MemoryStore()
    store.write({queue_key("A"): b"x"}, [])
    with caplog.at_level(logging.INFO, logger="kq.service"):
        assert say_strays(store, config, 0) == []
    assert caplog.messages == []
