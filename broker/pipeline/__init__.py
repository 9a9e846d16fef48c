"""The Spark pipeline (SPEC section 9): data sources for journals and underlying topics, and
the report, audit and replay jobs. Imported only by the commands that use Spark: `kq serve`
never pays for it. Needs `pip install 'kafka-queues[spark]'` (pyspark, pyarrow, matplotlib)."""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make `spark.read.format("kq-journal")` and `format("kq-topic")` available."""
    from broker.pipeline.sources import JournalSource, TopicSource

    spark.dataSource.register(JournalSource)
    spark.dataSource.register(TopicSource)
