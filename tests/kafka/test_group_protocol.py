"""kq's instances under Kafka's consumer group protocol (KIP-848, `[service.kafka]
group.protocol = "consumer"`), which only Apache Kafka 4.x speaks: the broker assigns the
shards and keeps the session timeout, which kq sets on its group."""

from __future__ import annotations

import time

import pytest

from tests.integration.kit import kq, uid, write_config
from tests.scale.test_instances import shards_move_on_add_kill_and_freeze

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONSUMER = '[service.kafka]\n"group.protocol" = "consumer"\n'


def test_shards_move_on_add_kill_and_freeze_under_the_consumer_protocol(brokers, tmp_path):
    # kq's own Apache Kafka: it accepts the 3 s sessions of the test (a stock one: 45 s)
    shards_move_on_add_kill_and_freeze(brokers.bootstrap("apache"), tmp_path, "consumer")


def test_a_session_the_broker_refuses_for_consumer_groups_stops_the_start(brokers, tmp_path):
    u = uid()
    cfg = write_config(tmp_path / "kq.toml", f"kqp{u}", [f"P_{u}"], tmp_path / "state",
                       brokers.bootstrap("apache"), service='session_timeout = "2m"')
    cfg.write_text(cfg.read_text() + CONSUMER)
    started = time.monotonic()
    run = kq("serve", "--config", str(cfg), timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    said = " ".join((run.stdout + run.stderr).split())
    assert 'session_timeout = "2m"' in said
    assert "group.consumer.max.session.timeout.ms = 1m" in said  # the bound, from the broker
    assert time.monotonic() - started < 30

