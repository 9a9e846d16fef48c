"""One SparkSession (local[2]) for the pipeline tests that use Spark in-process."""

from collections.abc import Iterator

import pytest

from broker.pipeline.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    session = spark_session("local[2]", "kq tests")
    yield session
    session.stop()
