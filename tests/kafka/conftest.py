"""One single-node Apache Kafka (KRaft) in a container for the whole tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kafka import kafka_container_class

# Confluent's image of Apache Kafka 3.9, the version of docker-compose.yml: testcontainers'
# KafkaContainer starts Kafka through this image's own scripts, not apache/kafka's.
IMAGE = "confluentinc/cp-kafka:7.9.1"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The container's bootstrap address on this host."""
    container = kafka_container_class()(IMAGE).with_kraft()
    # Transactions keep their state in a topic that wants 3 replicas by default; one broker here.
    container.with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
    container.with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    container.start(timeout=120)  # a first start formats the KRaft log: slower than a restart
    try:
        yield container.get_bootstrap_server()
    finally:
        container.stop()
