"""The tier's brokers: the worker's Apache Kafka, and one with SASL/PLAIN and ACLs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from broker.kafka.apache import ApacheKafka
from tests.conftest import REQUIRE_APACHE, Brokers, why_no_apache

PASSWORDS = {"admin": "admin-secret", "worker": "worker-secret", "other": "other-secret"}
TESTCONTAINERS = os.environ.get("KQ_TEST_TESTCONTAINERS") == "1"
# Confluent's image of Apache Kafka 3.9, the version of docker-compose.yml
IMAGE = "confluentinc/cp-kafka:7.9.1"


def _need_apache() -> None:
    why = why_no_apache()
    if why:
        (pytest.fail if REQUIRE_APACHE else pytest.skip)(why)


@pytest.fixture(scope="session")
def kafka_bootstrap(brokers: Brokers) -> Iterator[str]:
    """The bootstrap address of an Apache Kafka (never the embedded broker)."""
    if not TESTCONTAINERS:
        yield brokers.bootstrap("apache")
        return
    from testcontainers.kafka import KafkaContainer

    container = KafkaContainer(IMAGE).with_kraft()
    container.with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
    container.with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    container.start(timeout=120)
    try:
        yield container.get_bootstrap_server()
    finally:
        container.stop()


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The SASL/PLAIN listener of an Apache Kafka that authorizes with ACLs: `admin` is a
    super user, `worker` and `other` hold only the ACLs a test grants them."""
    _need_apache()
    log = tmp_path_factory.mktemp("sasl") / "apache-kafka.log"
    users = {u: p for u, p in PASSWORDS.items() if u != "admin"}
    broker = ApacheKafka(sasl_users=users, log_path=log).start(timeout=180)
    try:
        yield broker.sasl_bootstrap_servers
    finally:
        broker.stop(timeout=0)
