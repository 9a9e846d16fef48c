"""Pass-through Kafka settings ([service.kafka], a client's kafka_config): an operator's
tuning wins over kq's defaults; what kq's guarantees rest on is refused, by name."""

from __future__ import annotations

import pytest

from broker.errors import ConfigError
from broker.kafka import clients


def test_an_operators_tuning_wins_over_kqs_defaults():
    cfg = clients.base_config("k:9092", {"fetch.wait.max.ms": 100, "linger.ms": 20},
                              {"fetch.wait.max.ms": 5, "linger.ms": 2, "acks": "all"})
    assert (cfg["fetch.wait.max.ms"], cfg["linger.ms"], cfg["acks"]) == (100, 20, "all")


def test_kqs_defaults_stand_where_the_operator_says_nothing():
    cfg = clients.base_config("k:9092", {"security.protocol": "SASL_SSL"},
                              {"fetch.wait.max.ms": 5})
    assert cfg["fetch.wait.max.ms"] == 5 and cfg["security.protocol"] == "SASL_SSL"
    assert cfg["bootstrap.servers"] == "k:9092"


@pytest.mark.parametrize("key, words", [
    ("enable.auto.commit", "read positions in its own state"),
    ("group.id", "PREFIX.service"),
    ("group.instance.id", "fence each other"),
    ("acks", "every in-sync replica"),
    ("session.timeout.ms", "[service] session_timeout"),
    ("bootstrap.servers", "[service] bootstrap_servers"),
    ("request.required.acks", "every in-sync replica"),  # librdkafka's other name for acks
])
def test_a_setting_kq_decides_is_refused_naming_it_and_why(key, words):
    with pytest.raises(ConfigError) as refused:
        clients.base_config("k:9092", {key: "1"})
    text = str(refused.value)
    assert "[service.kafka]" in text and repr(key) in text and words in text


def test_every_client_kq_builds_checks_the_settings():
    for build in (clients.producer, clients.consumer, clients.admin):
        with pytest.raises(ConfigError, match="'enable.auto.commit' is kq's to set"):
            build("127.0.0.1:1", {"enable.auto.commit": True})


def test_the_group_protocol_is_classic_unless_the_config_says_consumer():
    from broker.config import Config
    from broker.service import joining

    assert joining.protocol(Config()) == "classic"
    chosen = Config.model_validate({"service": {"kafka": {"group.protocol": "consumer"}}})
    assert joining.protocol(chosen) == "consumer"
    # classic asks for the session itself; consumer must not (librdkafka refuses it)
    settings = joining.member_settings(Config(), admin=None)
    assert settings["session.timeout.ms"] == 10_000
    assert settings["partition.assignment.strategy"] == "cooperative-sticky"


def test_an_unknown_group_protocol_is_refused_naming_the_choices():
    from pydantic import ValidationError

    from broker.config import Config

    with pytest.raises(ValidationError, match="'classic' .* or 'consumer'"):
        Config.model_validate({"service": {"kafka": {"group.protocol": "consumr"}}})
