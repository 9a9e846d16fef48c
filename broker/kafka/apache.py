"""A single-node Apache Kafka (KRaft, broker and controller in one JVM) that kq starts itself.

The jars come from Maven Central through Maven, once, into a cache (`KQ_KAFKA_HOME`, default
`~/.cache/kq/kafka-VERSION`); each start formats a fresh log in a temporary directory, which
the guard deletes when the broker stops, also when its owner was killed. Used by
`kq broker --apache`, the test suite's Apache Kafka runs and `ops/bench.py --broker apache`.
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from types import TracebackType

from broker.errors import KqError
from broker.kafka.guarded import GuardedProcess, free_port, port_open, wait_listening

KAFKA_VERSION = os.environ.get("KQ_KAFKA_VERSION", "4.3.0")
SUPER_USER = "admin"

# A small heap: the suite runs one broker per test worker on two shared cores.
DEFAULT_HEAP = os.environ.get("KQ_KAFKA_HEAP", "512m")

# What a single node needs (the internal topics want 3 replicas by default), and what a
# developer's broker should do at once rather than after a production-sized pause.
SINGLE_NODE = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "10",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # a broker for tests and trials: retention is applied within seconds of being due (stock:
    # every 5 minutes), so a short journal_retention shows its effect in a soak
    "log.retention.check.interval.ms": "10000",
    # Kafka's default minimum is 6 s; kq's fast-failover settings (3 s) and tests go lower.
    # The one departure from a stock broker's group rules, written in the README.
    "group.min.session.timeout.ms": "1000",
    # the same for groups on the consumer protocol (KIP-848), whose stock minimums are 45 s
    # and heartbeats every 5 s
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "100",
}

LOG_CONFIG = """\
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


class ApacheKafkaError(KqError):
    """Apache Kafka could not be fetched, formatted or started here."""


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    given = os.environ.get("KQ_KAFKA_HOME")
    return Path(given) if given else Path.home() / ".cache" / "kq" / f"kafka-{version}"


def _need(program: str, why: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise ApacheKafkaError(f"{program} was not found on PATH: {why}")
    return path


def ensure_jars(version: str = KAFKA_VERSION,
                say: Callable[[str], None] = lambda _: None) -> Path:
    """The directory of Apache Kafka's jars, fetched with Maven the first time.

    A lock keeps test workers that start at once from fetching side by side, and the jars
    are copied into a scratch directory renamed into place, so a fetch cut short is retried
    rather than taken for complete."""
    home = kafka_home(version)
    libs = home / "libs"
    if (libs / ".complete").exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (libs / ".complete").exists():
            return libs
        mvn = _need("mvn", "Apache Kafka's jars are fetched with Maven (apt install maven)")
        say(f"fetching Apache Kafka {version} from Maven Central into {home} (once)")
        scratch = Path(tempfile.mkdtemp(prefix="libs.", dir=home))
        pom = resources.files("broker.kafka") / "apache-kafka.pom.xml"
        with resources.as_file(pom) as pom_path:
            run = subprocess.run(
                [mvn, "-q", "-B", "-f", str(pom_path), f"-Dkafka.version={version}",
                 "dependency:copy-dependencies", "-DincludeScope=runtime",
                 f"-DoutputDirectory={scratch}"],
                capture_output=True, text=True)
        if run.returncode != 0 or not any(scratch.glob("kafka_2.13-*.jar")):
            shutil.rmtree(scratch, ignore_errors=True)
            tail = (run.stdout + run.stderr).strip().splitlines()[-15:]
            raise ApacheKafkaError(
                f"Maven could not fetch Apache Kafka {version} (exit {run.returncode}); "
                "it needs to reach Maven Central:\n" + "\n".join(tail))
        (scratch / ".complete").touch()
        shutil.rmtree(libs, ignore_errors=True)
        scratch.rename(libs)
    return libs


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, never starting
    with "-" (one in 64 would: the format tool then takes it for an option and fails)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made


class ApacheKafka:
    """One KRaft node on free ports (or `port` for clients), data in a temporary directory.

    With `sasl_users` ({user: password}) it also has a SASL/PLAIN listener whose requests are
    authorized by ACLs (StandardAuthorizer); `admin` is a super user there, and the PLAINTEXT
    listener (which the controller uses too) stays open to all, as a developer's broker."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 sasl_users: dict[str, str] | None = None, log_path: Path | None = None,
                 heap: str = DEFAULT_HEAP, version: str = KAFKA_VERSION,
                 settings: dict[str, str] | None = None):
        self.host, self.version, self.heap = host, version, heap
        self.port = port or free_port()
        self.controller_port = free_port()
        self.sasl_users = sasl_users
        self.sasl_port = free_port() if sasl_users is not None else None
        self.log_path = log_path
        self.settings = settings or {}
        self.data_dir: Path | None = None
        self.started_in_s: float | None = None
        self._process: GuardedProcess | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        if self.sasl_port is None:
            raise ApacheKafkaError("this broker was started without a SASL listener")
        return f"{self.host}:{self.sasl_port}"

    def _properties(self, data: Path) -> dict[str, str]:
        listeners = {"PLAINTEXT": self.port, "CONTROLLER": self.controller_port}
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.bootstrap.servers": f"{self.host}:{self.controller_port}",
            "log.dirs": str(data / "log"),
            **SINGLE_NODE,
        }
        if self.sasl_users is not None:
            listeners["SASL_PLAINTEXT"] = self.sasl_port  # type: ignore[assignment]
            users = {SUPER_USER: "admin-secret", **self.sasl_users}
            logins = " ".join(f'user_{u}="{p}"' for u, p in users.items())
            props |= {
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {logins};",
                "authorizer.class.name":
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{SUPER_USER};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            }
        props["listeners"] = ",".join(f"{n}://{self.host}:{p}" for n, p in listeners.items())
        props["advertised.listeners"] = ",".join(
            f"{n}://{self.host}:{p}" for n, p in listeners.items() if n != "CONTROLLER")
        props["listener.security.protocol.map"] = ",".join(
            f"{n}:{'PLAINTEXT' if n == 'CONTROLLER' else n}" for n in listeners)
        return props | self.settings

    def start(self, timeout: float = 90.0,
              say: Callable[[str], None] = lambda _: None) -> ApacheKafka:
        began = time.monotonic()
        for port in (self.port, self.sasl_port):
            if port is not None and port_open(self.host, port):
                raise ApacheKafkaError(f"port {port} on {self.host} is already in use")
        java = _need("java", f"Apache Kafka {self.version} needs Java 17 or newer")
        libs = ensure_jars(self.version, say)
        data = self.data_dir = Path(tempfile.mkdtemp(prefix="kq-kafka-"))
        config = data / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self._properties(data).items()))
        (data / "log4j2.properties").write_text(LOG_CONFIG)
        classpath = f"{libs}/*"
        # kq picks the JVM's flags: options meant for other JVMs (the suite's for Spark) may
        # clash with them ("Multiple garbage collectors selected")
        env = {k: v for k, v in os.environ.items() if k != "JDK_JAVA_OPTIONS"}
        fmt = subprocess.run(
            [java, "-XX:TieredStopAtLevel=1", "-cp", classpath, "kafka.tools.StorageTool",
             "format", "--standalone", "-t", _cluster_id(), "-c", str(config)],
            capture_output=True, text=True, timeout=timeout, env=env)
        if fmt.returncode != 0:
            shutil.rmtree(data, ignore_errors=True)
            raise ApacheKafkaError(self._explain(f"formatting its log failed (exit "
                                                 f"{fmt.returncode})", fmt.stdout + fmt.stderr))
        # The whole heap from the start, as Kafka's own scripts set it: grown from a small
        # one, it stays near full with the broker's live data (~170 MB under load) and G1
        # keeps marking it concurrently, a core busy for 100-300 ms at a time (latency
        # stalls on 2 cores).
        self._process = GuardedProcess(
            [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
             "-XX:MaxGCPauseMillis=20",
             # each pause of the collector, for whoever asks why a record waited
             # (ops/bench.py reads it: ops/broker_gc.py)
             f"-Xlog:gc:file={data / 'gc.log'}:timemillis",
             "-Djava.awt.headless=true",
             f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
             "-cp", classpath, "kafka.Kafka", str(config)],
            env=env, log_path=self.log_path or data / "server.log", remove=data)
        self._process.start()
        left = timeout - (time.monotonic() - began)
        failure = wait_listening(self._process, self.host, self.port, left, "Apache Kafka")
        if failure is None:
            failure = self._wait_ready(timeout - (time.monotonic() - began))
        if failure:
            log = self._log_tail()
            self.stop(timeout=0)
            raise ApacheKafkaError(self._explain(failure, log))
        self.started_in_s = time.monotonic() - began
        return self

    def _wait_ready(self, left: float) -> str | None:
        """The port opens before the broker is unfenced; a metadata answer that names it
        means it serves requests."""
        from confluent_kafka.admin import AdminClient  # lazy: `kq broker` needs no client

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        deadline = time.monotonic() + max(left, 1.0)
        while time.monotonic() < deadline:
            if self.exit_code() is not None:
                return f"Apache Kafka exited with {self.exit_code()}"
            try:
                if admin.list_topics(timeout=2).brokers:
                    return None
            except Exception:  # noqa: BLE001 - not answering yet: ask again
                time.sleep(0.1)
        return f"Apache Kafka did not answer within {left:.0f}s"

    def _log_tail(self) -> str:
        path = self.log_path or (self.data_dir / "server.log" if self.data_dir else None)
        try:
            return path.read_text(errors="replace")[-6000:] if path else ""
        except OSError:
            return ""

    def _explain(self, failure: str, output: str) -> str:
        if "UnsupportedClassVersionError" in output:
            return f"Apache Kafka {self.version} needs Java 17 or newer; `java` here is older"
        lines = [ln for ln in output.splitlines() if " ERROR " in ln or "Exception" in ln]
        return failure + "\n" + "\n".join(lines[-8:] or output.strip().splitlines()[-8:])

    def exit_code(self) -> int | None:
        return self._process.exit_code() if self._process is not None else None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a clean shutdown takes a few seconds), SIGKILL after `timeout`; the data
        directory is deleted either way."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(timeout)
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.kill()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def wait(self) -> int:
        assert self._process is not None
        return self._process.wait()

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
