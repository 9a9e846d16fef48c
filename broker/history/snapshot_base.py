"""Where a journal command starts when the journal's head was deleted by retention: a shard's
snapshot (broker.service.snapshots), read into memory, as the state the rest of the journal
continues from."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer

from broker.config import Config
from broker.engine.engine import Engine
from broker.errors import KqError
from broker.kafka import clients
from broker.service.queries import snapshot as state_rows
from broker.service.snapshots import load, survey
from broker.service.topics import Topics
from broker.state.layout import load_engine
from broker.state.store import MemoryStore
from broker.values import now_ms


def journal_start(c: Consumer, config: Config, shard: int) -> int:
    """The first offset the shard's journal partition still holds."""
    low, _ = clients.watermarks(c, Topics(config.service.topic_prefix).journal, shard)
    return low


def deleted_while_read(c: Consumer, config: Config, shards: list[int],
                       bases: dict[int, dict[str, Any]]) -> str | None:
    """What retention deleted of the journal that a reader started at these snapshots
    (`bases`, by shard; the journal's start for the others) still needed, or None."""
    journal = Topics(config.service.topic_prefix).journal
    for shard in shards:
        needed = bases[shard]["after_offset"] + 1 if shard in bases else 0
        start = journal_start(c, config, shard)
        if start > needed:
            return (f"retention deleted {journal} partition {shard} up to offset {start} "
                    f"while it was read (from offset {needed}): what was read is incomplete. "
                    f"Run it again (it starts from the newest snapshot), and keep the journal "
                    f"longer than a read takes (journal_retention)")
    return None


def audit_base(c: Consumer, config: Config, shard: int) -> dict[str, Any]:
    """The shard's state as of its newest snapshot that the journal continues, read into
    memory before the service is asked for its state (so the service's batch is at least
    the snapshot's, however soon a newer snapshot replaces it), in the shape of the
    service's own state answer (rows and counters), with the journal offset it reflects
    (`after_offset`) and its batch."""
    topics = Topics(config.service.topic_prefix)
    start = journal_start(c, config, shard)
    seen = survey(c, topics.snapshots, shard)
    usable = [f for f in seen.complete if f.journal_offset >= start - 1]
    if not usable:
        raise KqError(
            f"the journal {topics.journal} partition {shard} starts at offset {start} "
            f"(retention deleted the records before) and {topics.snapshots} holds no snapshot "
            f"of shard {shard} from which the rest of it continues: nothing to audit from")
    found = usable[0]
    store = MemoryStore()
    load(store, c, topics.snapshots, found)
    engine = Engine(config.queues_of_shard(shard), config.service.heartbeat_timeout.ms)
    load_engine(store, engine, now_ms())
    parts = state_rows(engine, found.batch, shard)
    return {"shard": shard, "snapshot": found.snapshot, "after_offset": found.journal_offset,
            "batch": found.batch, "queues": parts[0]["queues"],
            "rows": [row for part in parts for row in part["rows"]]}
