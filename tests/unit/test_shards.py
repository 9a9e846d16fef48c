"""Shards: where a queue lives, and which journal parts count (the fencing rule)."""

from __future__ import annotations

import pytest

from broker.config import parse_config
from broker.errors import ConfigError
from broker.service.journal import BatchAssembler
from broker.shards import shard_by_name


def _part(batch: int, writer: str | None, part: int = 0, parts: int = 1) -> dict:
    return {"batch": batch, "part": part, "parts": parts, "marker": None, "writer": writer}


def _marker(nonce: str) -> dict:
    return {"batch": -1, "part": 0, "parts": 0, "marker": nonce, "writer": None}


def test_a_queue_lives_in_its_shard_key_else_by_a_stable_hash_of_its_name():
    cfg = parse_config({"service": {"shards": 4},
                        "queue": [{"name": "orders"}, {"name": "pinned", "shard": 3}]})
    assert cfg.shard_of("pinned") == 3
    # CRC-32: the same in every process, so the client finds the shard without the config
    assert cfg.shard_of("orders") == shard_by_name("orders", 4) == 0xE52FFDEE % 4 == 2
    assert {shard_by_name(f"q{i}", 4) for i in range(40)} == {0, 1, 2, 3}
    assert [q.name for q in cfg.queues_of_shard(3)] == ["pinned"]


def test_a_shard_key_outside_the_shards_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"queue 'x': shard = 2 but \[service\] shards = 2"):
        parse_config({"service": {"shards": 2}, "queue": [{"name": "x", "shard": 2}]})


def test_parts_of_an_owner_written_after_a_later_owners_marker_do_not_count():
    a = BatchAssembler()
    assert a.add(_marker("A")) is None
    assert a.add(_part(0, "A")) is not None
    assert a.add(_marker("B")) is None  # B took the shard over
    assert a.add(_part(1, "A")) is None  # A, frozen, woke and wrote on: ignored
    assert a.fenced == 1
    assert a.add(_part(1, "B")) is not None


def test_a_batch_interrupted_by_a_fenced_part_is_still_whole():
    a = BatchAssembler()
    a.add(_marker("B"))
    assert a.add(_part(5, "B", 0, 2)) is None
    assert a.add(_part(9, "A")) is None  # a fenced owner's part between two of ours
    assert [p["part"] for p in a.add(_part(5, "B", 1, 2)) or []] == [0, 1]


def test_parts_without_a_writer_count_as_before_version_5():
    a = BatchAssembler()
    a.add(_marker("B"))
    assert a.add(_part(0, None)) is not None
