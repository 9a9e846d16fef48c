"""Starting Spark the way kq's jobs need it."""

from __future__ import annotations

import os
import sys
from typing import Any

from broker.errors import KqError


def spark_session(master: str | None = None, app: str = "kq") -> Any:
    """A SparkSession on `master` (default `local[*]`) with kq's data sources registered.

    The workers run this same Python (`PYSPARK_PYTHON`), so they can import kq; on a
    cluster, install kq there too. Spark binds to 127.0.0.1 unless SPARK_LOCAL_IP says
    otherwise."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise KqError("Spark is not installed: pip install 'kafka-queues[spark]'") from None
    from broker.pipeline import register

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master or "local[*]").appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             # small jobs: few shuffle partitions (adaptive execution splits big ones)
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.python.worker.reuse", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
