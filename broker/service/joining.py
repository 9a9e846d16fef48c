"""The instance's group membership: its settings, why the group coordinator refused it
when asking again cannot mend it, and leaving the group within a stop's bound.

librdkafka retries a refused JoinGroup for ever and reports the refusal only as an error
event; an instance that did not look would wait at "joining group" with no word of why.
These answers end the start with a ConfigError (exit 2) that names the setting to change.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from broker.config import Config
from broker.errors import ConfigError
from broker.kafka import clients
from broker.values import Duration

log = logging.getLogger("kq.instance")

_SESSION_BOUNDS = ("group.min.session.timeout.ms", "group.max.session.timeout.ms")
# The consumer protocol (KIP-848) keeps a group's timing on the broker, within these bounds
_CONSUMER_BOUNDS = ("group.consumer.min.session.timeout.ms",
                    "group.consumer.max.session.timeout.ms",
                    "group.consumer.min.heartbeat.interval.ms",
                    "group.consumer.max.heartbeat.interval.ms")


def protocol(config: Config) -> str:
    """The group protocol kq's instances join with: `[service.kafka] group.protocol`,
    classic unless it says "consumer" (KIP-848; the config checks the value)."""
    return str(config.service.kafka.get("group.protocol", "classic"))


def member_settings(config: Config, admin: Any) -> dict[str, Any]:
    """The group member's settings that depend on the protocol.

    Classic: the member itself asks for `session_timeout` and cooperative-sticky assignment.
    Consumer (KIP-848): the broker assigns and keeps the session timeout; a client that sets
    either is refused by librdkafka. kq sets them on its own group instead (group configs,
    KIP-848), so `session_timeout` means the same under both protocols."""
    session_ms = config.service.session_timeout.ms
    heartbeat_ms = clients.group_heartbeat_ms(session_ms)
    if protocol(config) == "classic":
        return {"partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": session_ms, "heartbeat.interval.ms": heartbeat_ms}
    group = f"{config.service.topic_prefix}.service"
    resource = ConfigResource(ResourceType.GROUP, group)
    for name, ms in (("consumer.session.timeout.ms", session_ms),
                     ("consumer.heartbeat.interval.ms", heartbeat_ms)):
        resource.add_incremental_config(ConfigEntry(
            name, str(ms), incremental_operation=AlterConfigOpType.SET))
    try:
        admin.incremental_alter_configs([resource])[resource].result(30)
    except KafkaException as exc:
        bounds = _broker_setting(admin, _CONSUMER_BOUNDS)
        said = ", ".join(f"{k} = {_ms(v, v)}" for k, v in bounds.items())
        raise ConfigError(
            f"[service] session_timeout = \"{config.service.session_timeout}\" (heartbeats "
            f"every {Duration(heartbeat_ms)}) could not be set on the consumer group {group} "
            f"under the consumer group protocol: {exc.args[0].str()}"
            + (f". The broker's bounds: {said}" if said else "")
            + ". Set session_timeout within them, change the broker's bounds, or leave "
            "[service.kafka] group.protocol at classic") from exc
    return {}


def _broker_setting(admin: Any, names: tuple[str, ...]) -> dict[str, str]:
    """The broker's values of `names`, or {} when it does not tell (e.g. no Describe ACL)."""
    try:
        broker_id = next(iter(admin.list_topics(timeout=5).brokers))
        resource = ConfigResource(ResourceType.BROKER, str(broker_id))
        entries = admin.describe_configs([resource])[resource].result(5)
        return {n: entries[n].value for n in names if n in entries}
    except Exception as exc:  # noqa: BLE001 - only a better message is lost
        log.debug("could not read the broker's settings %s: %s", names, exc)
        return {}


def _ms(value: str | None, default: str) -> str:
    return str(Duration(int(value))) if value is not None and value.isdigit() else default


def refusal(err: KafkaError, config: Config, admin: Any) -> str | None:
    """The message of a start that must end, for a group error retrying cannot mend; None
    for any other error (librdkafka asks again by itself)."""
    svc = config.service
    group = f"{svc.topic_prefix}.service"
    code = err.code()
    if code == KafkaError.INVALID_SESSION_TIMEOUT:
        bounds = _broker_setting(admin, _SESSION_BOUNDS)
        low = _ms(bounds.get(_SESSION_BOUNDS[0]), "6s by default")
        high = _ms(bounds.get(_SESSION_BOUNDS[1]), "30m by default")
        return (f"[service] session_timeout = \"{svc.session_timeout}\" is refused by the "
                f"Kafka broker: it accepts session timeouts from {low} to {high} "
                f"({_SESSION_BOUNDS[0]} and {_SESSION_BOUNDS[1]}). Set session_timeout "
                "within that range, or change the broker's bounds")
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        user = svc.kafka.get("sasl.username", "this principal")
        return (f"the Kafka broker does not let {user} join the consumer group {group}: "
                f"grant it Read on group {group} ([service.kafka] names the login)")
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        user = svc.kafka.get("sasl.username", "this principal")
        return (f"the Kafka broker does not let {user} read kq's command topic "
                f"{svc.topic_prefix}.commands: grant it Read on the topics {svc.topic_prefix}.*")
    if code in (KafkaError.INCONSISTENT_GROUP_PROTOCOL, KafkaError.UNSUPPORTED_ASSIGNOR):
        return (f"the consumer group {group} is in use by members of another kind (another "
                f"program, or kq instances with another group protocol): {err.str()}. "
                "Give kq a topic_prefix of its own")
    if code == KafkaError.INVALID_GROUP_ID:
        return f"[service] topic_prefix: the Kafka broker refuses the group id {group}"
    if code == KafkaError.GROUP_MAX_SIZE_REACHED:
        return (f"the consumer group {group} is full (the broker's group.max.size): "
                "run fewer instances or raise the broker's limit")
    if code == KafkaError.UNSUPPORTED_VERSION:
        return (f"the Kafka broker does not support the group protocol kq uses: {err.str()}")
    return None


def leave(group: Any, within_s: float) -> tuple[bool, str | None]:
    """Close the group's member (it leaves the group, and the others take its shards at
    once), waiting at most `within_s`: whether the close ended, and what went wrong (None:
    nothing). librdkafka's close can wait on a rebalance under way (an assignment arriving
    as it closes) well past a stop's bound; a member not closed by then stays in the group
    until its session times out."""
    failed: list[str] = []

    def close() -> None:
        try:
            group.close()
        except KafkaException as exc:  # (Kafka gone: the session times out the same way)
            failed.append(f"leaving the group failed: {exc}")

    closing = threading.Thread(target=close, daemon=True, name="kq-leave-group")
    closing.start()
    closing.join(within_s)
    if closing.is_alive():
        return False, f"leaving the group took over {within_s:.0f} s"
    return True, failed[0] if failed else None
