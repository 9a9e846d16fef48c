"""`kq journal audit`: every queue's state rebuilt from the journal on Spark, compared with
what the live service holds, both as of the same journal batch.

The rebuild is written here in Spark SQL, apart from the engine's own `apply`, so that a
fault in the service's state (a lost write, a bug in applying a transition) shows as a
difference instead of being repeated by the audit.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from broker.errors import KqError

# What the last transition of a message's current life says its state is; the kinds that
# finish it (acked, removed, released) leave it out of the queue.
STATE_AFTER = {"enqueued": "available", "returned": "available", "leased": "leased",
               "sent": "sent"}
MESSAGE_KINDS = (*STATE_AFTER, "acked", "removed", "released")
FIELDS = ("state", "delivery_count", "cancel_count", "holder")
MAX_LISTED = 10_000  # differences listed in full; the count is always exact


def journal_state(journal: DataFrame, batch: int, base: DataFrame | None = None) -> DataFrame:
    """(queue, bookmark, state, delivery_count, cancel_count, holder) of every message still
    in a queue after journal batch `batch`. With `base` (the same columns: the state of a
    snapshot), `journal` holds only what came after it, and continues that state."""
    pos = F.struct("batch", "offset", "index")
    rows = (journal.where((F.col("batch") <= batch) & F.col("bookmark").isNotNull()
                          & F.col("kind").isin(*MESSAGE_KINDS))
            .withColumn("pos", pos))
    # a bookmark enqueued again (a recovery-point reset) starts a new life: only the last
    life = F.max(F.when(F.col("kind") == "enqueued", F.col("pos"))).over(
        Window.partitionBy("queue", "bookmark"))
    in_life = F.col("pos") >= F.col("life")
    if base is not None:  # a message with no enqueue after the snapshot lives on from it
        in_life = F.col("life").isNull() | in_life
    current = rows.withColumn("life", life).where(in_life)
    state = F.coalesce(*(F.when(F.col("last_kind") == k, F.lit(v))
                         for k, v in STATE_AFTER.items()))
    told = (current.groupBy("queue", "bookmark").agg(
        F.max_by("kind", "pos").alias("last_kind"),
        F.max_by("client", "pos").alias("last_client"),
        F.max("delivery_count").alias("delivery_count"),
        F.max("cancel_count").alias("cancel_count"),
        F.max(F.col("kind") == "enqueued").alias("born"))
        .withColumn("state", state))
    if base is not None:
        told = _continued(base, told)
    return (told.where(F.col("state").isNotNull())
            .select("queue", "bookmark", "state", "delivery_count", "cancel_count",
                    F.when(F.col("state").isin("leased", "sent"), F.col("last_client"))
                    .alias("holder")))


def _continued(base: DataFrame, told: DataFrame) -> DataFrame:
    """A snapshot's messages carried on by what the journal after it says of them: its last
    word decides the state; counts only grow, unless the message was enqueued anew."""
    t, b = told.alias("t"), base.alias("b")
    said = F.col("t.last_kind").isNotNull()
    fresh = F.coalesce(F.col("t.born"), F.lit(False))

    def count(name: str) -> Any:
        return F.when(fresh, F.col(f"t.{name}")).otherwise(
            F.greatest(F.coalesce(F.col(f"t.{name}"), F.lit(0)),
                       F.coalesce(F.col(f"b.{name}"), F.lit(0))))

    return (t.join(b, ["queue", "bookmark"], "full").select(
        "queue", "bookmark",
        F.when(said, F.col("t.state")).otherwise(F.col("b.state")).alias("state"),
        F.when(said, F.col("t.last_client")).otherwise(F.col("b.holder")).alias("last_client"),
        count("delivery_count").alias("delivery_count"),
        count("cancel_count").alias("cancel_count")))


def journal_counters(journal: DataFrame, batch: int) -> tuple[dict[str, dict[str, Any]], int]:
    """Per queue: enqueued, acked and removed by reason, counted in the journal; and how many
    transitions there are in all up to `batch` (in the same job)."""
    rows = (journal.where(F.col("batch") <= batch)
            .groupBy("queue", "kind",
                     F.when(F.col("kind").isin("removed", "released"),
                            F.coalesce(F.col("reason"), F.lit("removed"))).alias("reason"))
            .count().collect())
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["kind"] not in ("enqueued", "acked", "removed", "released"):
            continue
        q = out.setdefault(r["queue"], {"enqueued": 0, "acked": 0, "removed": {}})
        if r["kind"] in ("enqueued", "acked"):
            q[r["kind"]] += r["count"]
        else:
            q["removed"][r["reason"]] = q["removed"].get(r["reason"], 0) + r["count"]
    return out, sum(r["count"] for r in rows)


def audit(spark: SparkSession, journal: DataFrame, service: dict[str, Any],
          bases: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Compare the service's snapshot (`kq` query `snapshot`) with the journal's state at
    the snapshot's batch; SPEC 8.1's audit object, plus `batches` (shard, batch) and
    `snapshots` (the stored snapshots the journal was continued from).

    With several shards the snapshot is one per shard (`{"shards": [...]}`), each as of a
    batch of its own journal partition: each is compared with the journal rows of its own
    queues (a queue lives in one shard) up to its batch, and the results are added up.
    `bases`, by shard: where the journal's head was deleted, the state of a stored snapshot
    (broker.history.snapshot_base) that the journal after its offset continues."""
    bases = bases or {}
    shards = service.get("shards", [service])
    batches = [{"shard": s.get("shard", 0), "batch": int(s["batch"])} for s in shards]
    if len(shards) > 1:
        journal = journal.cache()  # read from Kafka once, compared once per shard
    results = [_audit_shard(spark, journal.where(F.col("queue").isin(list(s["queues"]))), s,
                            bases.get(s.get("shard", 0)))
               for s in shards]
    journal.unpersist()
    read = sum(r["transitions"] for r in results)
    if read == 0 and not bases and any(b["batch"] >= 0 for b in batches):
        # the service's state reflects journal batches, so the journal holds some: an audit
        # that read none compared nothing, and must not say "no differences"
        raise KqError(f"the audit read no journal transition up to the batch the service "
                      f"reflects ({batches}): the journal was not read, nothing was checked")
    return {"queues": sum(r["queues"] for r in results),
            "messages": sum(r["messages"] for r in results),
            "transitions": read,
            "batch": batches[0]["batch"] if len(batches) == 1 else None, "batches": batches,
            "snapshots": [{"shard": shard, "snapshot": b["snapshot"],
                           "journal_offset": b["after_offset"]}
                          for shard, b in sorted(bases.items())],
            "differing_messages": sum(r["differing_messages"] for r in results),
            "differences": [d for r in results for d in r["differences"]]}


ROWS = ("queue string, bookmark string, state string, delivery_count int, cancel_count int, "
        "holder string")


def _audit_shard(spark: SparkSession, journal: DataFrame, service: dict[str, Any],
                 base: dict[str, Any] | None) -> dict[str, Any]:
    batch = int(service["batch"])
    theirs = spark.createDataFrame(service["rows"], ROWS)
    start = None
    if base is not None:
        journal = journal.where(F.col("offset") > base["after_offset"])
        start = spark.createDataFrame(base["rows"], ROWS)
    ours = journal_state(journal, batch, start)
    joined = (ours.alias("j").join(theirs.alias("s"), ["queue", "bookmark"], "full")
              .select("queue", "bookmark", *(F.col(f"{side}.{f}").alias(f"{side}_{f}")
                                             for side in "js" for f in FIELDS)))
    differs = F.lit(False)
    for f in FIELDS:
        differs = differs | ~F.col(f"j_{f}").eqNullSafe(F.col(f"s_{f}"))
    # one job counts both; the differing rows are fetched only when there are any (each
    # Spark job costs seconds on a cold start, and a healthy service has none)
    totals = joined.agg(F.count(F.lit(1)).alias("compared"),
                        F.count(F.when(differs, 1)).alias("found")).collect()[0]
    compared, found = int(totals["compared"]), int(totals["found"])
    listed = (joined.where(differs).orderBy("queue", "bookmark").limit(MAX_LISTED).collect()
              if found else [])
    differences = []
    for r in listed:
        gone = r["j_state"] is None or r["s_state"] is None
        for f in ("state",) if gone else FIELDS:  # a message one side lacks: one line
            if r[f"j_{f}"] != r[f"s_{f}"]:
                differences.append({"queue": r["queue"], "bookmark": r["bookmark"],
                                    "field": f, "journal": r[f"j_{f}"],
                                    "service": r[f"s_{f}"]})
    counted, transitions = journal_counters(journal, batch)
    if base is not None:  # the snapshot's counters, and what the journal after it adds
        for name, had in base["queues"].items():
            q = counted.setdefault(name, {"enqueued": 0, "acked": 0, "removed": {}})
            q["enqueued"] += had["enqueued"]
            q["acked"] += had["acked"]
            for reason, n in had["removed"].items():
                q["removed"][reason] = q["removed"].get(reason, 0) + n
    for name, theirs_q in sorted(service["queues"].items()):
        ours_q = counted.get(name, {"enqueued": 0, "acked": 0, "removed": {}})
        for f in ("enqueued", "acked"):
            if ours_q[f] != theirs_q[f]:
                differences.append({"queue": name, "bookmark": None, "field": f,
                                    "journal": ours_q[f], "service": theirs_q[f]})
        for reason in sorted(set(ours_q["removed"]) | set(theirs_q["removed"])):
            a, b = ours_q["removed"].get(reason, 0), theirs_q["removed"].get(reason, 0)
            if a != b:
                differences.append({"queue": name, "bookmark": None,
                                    "field": f"removed.{reason}", "journal": a, "service": b})
    return {"queues": len(service["queues"]), "messages": compared,
            "transitions": transitions, "differing_messages": found,
            "differences": differences}
