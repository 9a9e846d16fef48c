"""How long kq's journal keeps its records, and the check that a restore still finds what it
needs (SPEC 14).

A restore loads the newest snapshot and replays the journal after it; a snapshot is written
every `snapshot_interval`, so the journal must keep at least two intervals (the newest
snapshot may be one interval old, plus the time it takes to write). kq sets the journal's
`retention.ms` from `journal_retention` when it creates the topic, and on every start when it
differs; then it reads back what Kafka applies, and refuses to serve when that cannot hold.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from broker.config import ServiceConfig
from broker.errors import ConfigError
from broker.values import Duration

log = logging.getLogger("kq.topics")

# The snapshot topic keeps the newest value per key (each snapshot's keys are its own, and a
# replaced snapshot's are deleted by tombstones). Segments roll hourly so compaction reaches
# replaced snapshots within about an hour; a chunk holds at least one entry, and an entry may
# hold a record of up to Kafka's largest record size.
SNAPSHOT_TOPIC = {"cleanup.policy": "compact", "segment.ms": "3600000",
                  "max.message.bytes": str(16 * 1024 * 1024)}


def journal_settings(svc: ServiceConfig) -> dict[str, str]:
    """The journal topic's settings kq wants."""
    retention = svc.journal_retention
    return {"retention.ms": str(retention.ms if retention is not None else -1),
            "retention.bytes": "-1", "cleanup.policy": "delete"}


def _describe(admin: Any, topic: str) -> dict[str, str] | None:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(10)
    except Exception as exc:  # noqa: BLE001 - a broker without DescribeConfigs (embedded)
        log.debug("could not read the settings of %s: %s", topic, exc)
        return None
    return {name: entry.value for name, entry in entries.items()}


def apply_journal_retention(admin: Any, topic: str, svc: ServiceConfig) -> None:
    """Give the journal the configured retention, then check what Kafka applies: refuse
    (ConfigError, exit 2) when a restore could need records it deletes."""
    have = _describe(admin, topic)
    if have is None:
        return  # a broker that does not say (the embedded one applies no retention)
    wanted = journal_settings(svc)
    if have.get("retention.ms") != wanted["retention.ms"]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        resource.add_incremental_config(ConfigEntry(
            "retention.ms", wanted["retention.ms"], incremental_operation=AlterConfigOpType.SET))
        try:
            admin.incremental_alter_configs([resource])[resource].result(30)
            log.info("journal %s: retention.ms %s -> %s (journal_retention = %s)", topic,
                     have.get("retention.ms"), wanted["retention.ms"],
                     svc.journal_retention or "forever")
        except KafkaException as exc:
            log.warning("could not set the retention of %s to journal_retention (%s): %s",
                        topic, svc.journal_retention or "forever", exc.args[0].str())
        have = _describe(admin, topic) or have
    problem = journal_problem(have, svc)
    if problem:
        raise ConfigError(f"the journal topic {topic}: {problem}")


def journal_problem(settings: dict[str, str], svc: ServiceConfig) -> str | None:
    """Why a journal with these topic settings could lose what a restore needs, or None."""
    need = Duration(2 * svc.snapshot_interval.ms)
    why = (f"a restore replays the journal after the newest snapshot, written every "
           f"snapshot_interval = {svc.snapshot_interval}, so it must keep at least {need}")
    if "compact" in settings.get("cleanup.policy", "delete"):
        return (f"cleanup.policy = {settings['cleanup.policy']} would drop transitions; "
                f"{why}. Set cleanup.policy = delete on it")
    if int(settings.get("retention.bytes", "-1")) >= 0:
        return (f"retention.bytes = {settings['retention.bytes']} may delete records of any "
                f"age; {why}. Set retention.bytes = -1 (kq bounds it by journal_retention)")
    ms = int(settings.get("retention.ms", "-1"))
    if 0 <= ms < need.ms:
        return (f"retention.ms = {ms} ({Duration(ms)}) is shorter than a restore needs: "
                f"{why}. Raise it, or set [service] journal_retention (which kq applies)")
    return None
