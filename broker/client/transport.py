"""The Kafka side of a client, shared by `QueueClient` and `AsyncQueueClient`: the command
producer, the reader of the client's delivery topic, and who the client is."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

from confluent_kafka import TopicPartition

from broker.client.core import ClientCore, Outgoing
from broker.errors import KqError
from broker.kafka import clients


class Transport:
    """The Kafka side of a client: the command producer and the delivery topic's reader.
    Shared by `QueueClient` and `AsyncQueueClient` (which runs its blocking calls in a
    thread)."""

    def __init__(self, bootstrap_servers: str, name: str, topic_prefix: str, principal: str,
                 kafka_config: dict[str, Any] | None) -> None:
        self.prefix = topic_prefix
        extra = dict(kafka_config or {})
        clients.check_reachable(bootstrap_servers, extra)
        self.deliver_topic = f"{topic_prefix}.deliver.{name}"
        self.admin = clients.admin(bootstrap_servers, extra)
        clients.ensure_topics(self.admin, [self.deliver_topic], tuning=clients.SMALL_INDEXES)
        # Commands start on the shared topic; a service with [auth] refuses them there, and
        # the client moves to its principal's own topic (see use_own_command_topic).
        self.commands_topic = f"{topic_prefix}.commands"
        self.own_commands_topic = f"{topic_prefix}.commands.{principal}"
        # No idempotent producer: its start-up handshake costs ~0.5 s on some brokers, and one
        # request in flight keeps commands in order just as well. Never creates the command
        # topic by writing to it: the service makes it, one partition per shard.
        self.producer = clients.producer(bootstrap_servers, extra, **{
            "linger.ms": 1, "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1, "allow.auto.create.topics": False})
        self.consumer = clients.consumer(bootstrap_servers, extra, **{
            "fetch.wait.max.ms": clients.fetch_wait_ms(bootstrap_servers, extra)})
        start = clients.end_offset(self.consumer, self.deliver_topic, 0)
        self.consumer.assign([TopicPartition(self.deliver_topic, 0, start)])
        self.read_lock = threading.Lock()
        self.consumer_closed = False  # (under read_lock: no read is under way at the close)
        self.service_seen = False  # (its command topic exists: asked until it does)

    def shard_count(self) -> int:
        """The command topic's partitions (the service makes it with one per shard); 1 while
        no service has made it."""
        return clients.topic_partitions(self.admin).get(f"{self.prefix}.commands", 1)

    def check_service(self) -> None:
        """Refuse a request at once when no service has ever run with this prefix (it makes
        its command topic): nothing would answer it (it waited out the request timeout, and
        a close its flush). Asked of Kafka until the topic is seen (a client polling with
        queries costs it nothing more)."""
        if not self.service_seen:
            self.service_seen = f"{self.prefix}.commands" in clients.topic_partitions(self.admin)
        if not self.service_seen:
            raise KqError(f"no kq service has run with topic prefix {self.prefix!r} here (no "
                          f"topic {self.prefix}.commands): is the prefix (--config) right?")

    def no_answer(self, kind: str, timeout: float) -> KqError:
        return KqError(f"no answer from the kq service to {kind} within {timeout}s (is "
                       f"`kq serve` running with topic prefix {self.prefix!r}?)")

    def send(self, records: list[Outgoing]) -> None:
        for out in records:
            self.producer.produce(self.commands_topic, out.value, partition=out.shard)
        self.producer.poll(0)

    def read(self, core: ClientCore, timeout: float) -> int:
        """Give the core what the service sent within `timeout`; how many records came."""
        with self.read_lock:
            if self.consumer_closed:  # (the client was closed by another thread)
                return 0
            records = clients.take(self.consumer, 500, timeout)
        for rec in records:
            if not rec.error():
                core.receive(rec.value())
        return len(records)

    def read_if_idle(self, core: ClientCore) -> None:
        """Read what is there without waiting, unless another thread is reading: refusals
        and notices arrive while the application is busy in a long job."""
        if self.read_lock.acquire(blocking=False):
            try:
                records = [] if self.consumer_closed else clients.take(self.consumer, 500, 0)
            finally:
                self.read_lock.release()
            for rec in records:
                if not rec.error():
                    core.receive(rec.value())

    def close_consumer(self) -> None:
        """Close the delivery topic's reader once no thread is reading (closing it under a
        read made that read raise librdkafka's "Consumer closed")."""
        with self.read_lock:
            self.consumer_closed = True
            self.consumer.close()

    def use_own_command_topic(self) -> bool:
        """A service with [auth] keeps a command topic per principal (which Kafka ACLs can
        reserve for it) and believes the topic, not the record: once it says so, use ours if
        it exists. True when this switched to it."""
        own = self.own_commands_topic
        if self.commands_topic == own or own not in clients.topic_partitions(self.admin):
            return False
        self.commands_topic = own
        return True


def closed_while_waiting(name: str, kind: str) -> KqError:
    """Another thread or task closed the client while a call waited: no answer will be read."""
    return KqError(f"client {name} was closed while waiting for the answer to {kind}")


def client_name(name: str | None) -> str:
    return name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def principal_of(name: str, principal: str | None, kafka_config: dict[str, Any] | None) -> str:
    """Who the client is for entitlements: as given, else the SASL user the Kafka connection
    logs in as, else the client's name."""
    return principal or str((kafka_config or {}).get("sasl.username") or name)
