"""The Apache Kafka tier: what only a real Apache Kafka shows, in a container (testcontainers).

The embedded broker does not isolate transactions (DESIGN 3), so kq's `exactly_once` and
the integration suite on the broker production uses are checked here. Without a Docker engine
the tier is skipped for one reason, listed once by `pytest -ra`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

NO_ENGINE = "no Docker engine here: the Apache Kafka tier (tests/kafka) needs one; see README"
NO_LIBRARY = ("testcontainers is not installed: the Apache Kafka tier (tests/kafka) needs it "
              "(pip install -e '.[test]')")


def kafka_container_class() -> Any:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers releases before its `community` package
        from testcontainers.kafka import KafkaContainer
    return KafkaContainer


def why_not_here() -> str | None:
    """Why the tier cannot run on this machine, or None when it can."""
    try:
        import docker

        kafka_container_class()
    except ImportError:
        # without the library, look for the engine ourselves: its absence is the likelier news
        engine = os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()
        return NO_LIBRARY if engine else NO_ENGINE
    try:
        docker.from_env().ping()
    except Exception:  # no socket, refused, no permission: any of them means no engine to use
        return NO_ENGINE
    return None
