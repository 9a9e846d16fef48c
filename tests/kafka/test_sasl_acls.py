"""Entitlements on a cluster with SASL and ACLs, the part the embedded broker cannot show (its
SASL logins always fail and its ACL calls are stubs).

A single-node Apache Kafka whose client listener takes SASL/PLAIN logins and authorizes with
ACLs (StandardAuthorizer). `kq serve` logs in as `admin` (a super user); the worker logs in as
`worker` and holds only the ACLs the README prescribes: Write on the shared command topic and
on its own, Read and Create on its delivery topics, and Read on the group id kq's consumers
name. It never reads a queue's topic itself: its messages come on its delivery topic.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from broker.client import QueueClient
from broker.config import parse_config
from broker.errors import CommandError, KqError
from broker.kafka import clients
from tests.integration.kit import drain, running_service, uid
from tests.kafka.conftest import PASSWORDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def login(user: str, password: str | None = None) -> dict[str, str]:
    """librdkafka settings of a SASL/PLAIN login."""
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": password or PASSWORDS[user]}


def grant(bootstrap: str, principal: str, grants: list[tuple[ResourceType, str,
                                                              ResourcePatternType,
                                                              AclOperation]]) -> None:
    admin = clients.admin(bootstrap, login("admin"))
    bindings = [AclBinding(kind, name, pattern, f"User:{principal}", "*", op,
                           AclPermissionType.ALLOW) for kind, name, pattern, op in grants]
    for future in admin.create_acls(bindings).values():
        future.result(30)


def worker_acls(bootstrap: str, prefix: str, principal: str) -> None:
    """What the README tells operators to grant a worker, and nothing more."""
    grant(bootstrap, principal, [
        (ResourceType.TOPIC, f"{prefix}.commands", ResourcePatternType.LITERAL,
         AclOperation.WRITE),
        (ResourceType.TOPIC, f"{prefix}.commands.{principal}", ResourcePatternType.LITERAL,
         AclOperation.WRITE),
        (ResourceType.TOPIC, f"{prefix}.deliver.", ResourcePatternType.PREFIXED,
         AclOperation.READ),
        (ResourceType.TOPIC, f"{prefix}.deliver.", ResourcePatternType.PREFIXED,
         AclOperation.CREATE),
        (ResourceType.GROUP, "kq-unused", ResourcePatternType.LITERAL, AclOperation.READ),
    ])


def publish_as_admin(bootstrap: str, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **login("admin")})
    producer.produce(topic, value)
    assert producer.flush(30) == 0


def write_error(bootstrap: str, user: str, topic: str) -> KafkaError | None:
    """The error Kafka gives `user` writing one record to `topic` (None: it was written)."""
    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, **login(user),
                         "message.timeout.ms": 10_000, "allow.auto.create.topics": False})
    producer.produce(topic, b"{}", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert errors, "no delivery report within 30 s"
    return errors[0]


@pytest.fixture()
def served(sasl_kafka, tmp_path):
    """`kq serve` logged in as admin, with [auth] for worker and other; yields (u, prefix)."""
    u = uid()
    prefix, mine, theirs = f"kqs{u}", f"MINE_{u}", f"THEIRS_{u}"
    admin = clients.admin(sasl_kafka, login("admin"))
    clients.ensure_topics(admin, [mine, theirs])
    cfg = parse_config({
        "service": {"topic_prefix": prefix, "data_dir": str(tmp_path / "state"),
                    "metrics_port": 0, "kafka": login("admin")},
        "auth": {"worker": f"^{mine}$", "other": f"^{theirs}$"},
        "queue": [{"name": mine}, {"name": theirs}],
    })
    worker_acls(sasl_kafka, prefix, "worker")
    with running_service(sasl_kafka, cfg):
        yield u, prefix


def test_a_worker_with_only_its_acls_gets_acks_and_is_refused_the_rest(sasl_kafka, served):
    u, prefix = served
    publish_as_admin(sasl_kafka, f"MINE_{u}", b'{"n": 1}')
    with QueueClient(sasl_kafka, name=f"w-{u}", topic_prefix=prefix,
                     kafka_config=login("worker")) as w:  # the SASL user is the principal
        (msg,) = drain(w.subscribe(f"MINE_{u}"), 1, timeout=30)
        assert msg.value == b'{"n": 1}'
        msg.ack()
        with pytest.raises(CommandError, match="not entitled"):
            w.subscribe(f"THEIRS_{u}")
    # Kafka itself keeps the worker off another principal's command topic and off the queue's
    # topic: what makes "the topic says who sent a command" proof
    refused = write_error(sasl_kafka, "worker", f"{prefix}.commands.other")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    refused = write_error(sasl_kafka, "worker", f"MINE_{u}")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_wrong_password_is_an_error_naming_the_cluster(sasl_kafka):
    started = time.monotonic()
    with pytest.raises(KqError, match=sasl_kafka.split(":")[0]):
        QueueClient(sasl_kafka, name=f"w-{uid()}", topic_prefix="kqs-bad",
                    kafka_config=login("worker", "not-the-password"))
    assert time.monotonic() - started < 30
