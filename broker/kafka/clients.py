"""Kafka clients configured the kq way: pass-through settings, quiet logs, fast polls."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from broker.errors import ConfigError, KafkaUnavailableError
from broker.kafka import stats

log = logging.getLogger("kq.kafka")

Settings = Mapping[str, Any]


def group_heartbeat_ms(session_ms: int) -> int:
    """The heartbeat interval of kq's group members: a fifth of the session, 0.1 to 1 s."""
    return max(100, min(1000, session_ms // 5))


# Settings that kq's guarantees rest on, or that one of kq's own keys sets. A value for one
# in [service.kafka] (or a client's kafka_config) is refused, never silently overridden.
_OFFSETS = "kq keeps its read positions in its own state, written with the state"
KQ_DECIDES: dict[str, str] = {
    "bootstrap.servers": "[service] bootstrap_servers says where Kafka is",
    "metadata.broker.list": "[service] bootstrap_servers says where Kafka is",
    "group.id": "kq names its one consumer group itself (PREFIX.service)",
    "group.instance.id": "kq's instances are dynamic group members: one static id shared "
                         "by several instances' config would have them fence each other",
    "enable.auto.commit": _OFFSETS,
    "auto.commit.enable": _OFFSETS,
    "enable.auto.offset.store": _OFFSETS,
    "auto.offset.reset": "kq decides where each of its readers starts",
    "enable.partition.eof": "kq's readers are written for it off",
    "enable.idempotence": "kq's journal writes are idempotent; its commands need none",
    "acks": "kq counts a write done only once every in-sync replica has it",
    "request.required.acks": "kq counts a write done only once every in-sync replica has it",
    "transactional.id": "[service] exactly_once makes kq's producers transactional",
    "session.timeout.ms": "[service] session_timeout sets it",
    "heartbeat.interval.ms": "kq derives it from [service] session_timeout",
    "partition.assignment.strategy": "kq's shards move by cooperative-sticky assignment",
    "max.in.flight.requests.per.connection": "a client's commands keep their order with one "
                                             "request in flight",
    "max.in.flight": "a client's commands keep their order with one request in flight",
    "allow.auto.create.topics": "kq creates its topics itself, with the partitions and "
                                "retention they need",
}


def check_settings(extra: Settings | None) -> None:
    """Refuse a pass-through setting kq decides itself (ConfigError naming it and why)."""
    for key in extra or {}:
        if key in KQ_DECIDES:
            raise ConfigError(f"[service.kafka] (Kafka client settings): {key!r} is kq's to "
                              f"set ({KQ_DECIDES[key]}); remove it")


def base_config(bootstrap: str, extra: Settings | None = None,
                defaults: Settings | None = None) -> dict[str, Any]:
    """A client's settings: kq's `defaults` for its role (tuning such as `linger.ms` and
    `fetch.wait.max.ms`, and the settings of KQ_DECIDES), then the pass-through `extra`,
    which wins, as an operator tuning for their own Kafka expects."""
    check_settings(extra)
    # librdkafka logs every failed connection; the reachability check reports those itself.
    # Silenced at the source, not through a Python logger: a logger's Python code runs
    # inside librdkafka's callbacks and can swallow a fatal error confluent-kafka left
    # pending there (a fenced producer's flush then raised a bare SystemError).
    cfg: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0,
                           "error_cb": lambda err: None}
    cfg.update(defaults or {})
    cfg.update(extra or {})
    return cfg


def _build(kind: Any, cfg: dict[str, Any]) -> Any:
    """A client; settings librdkafka refuses are a configuration error, not an outage."""
    try:
        return kind({**cfg, **stats.settings()})
    except (KafkaException, ValueError, TypeError) as exc:
        detail = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        raise ConfigError(f"[service.kafka] (Kafka client settings): {detail}") from None


def producer(bootstrap: str, extra: Settings | None = None, **overrides: Any) -> Producer:
    cfg = base_config(bootstrap, extra, {"linger.ms": 2, "enable.idempotence": True,
                                         "acks": "all", **overrides})
    return _build(Producer, cfg)  # type: ignore[no-any-return]


def service_producer(bootstrap: str, extra: Settings | None,
                     transactional_id: str | None) -> Producer:
    """A producer; with `transactional_id`, a transactional one, ready (its start fences an
    earlier producer with that id: that one's open transaction aborts)."""
    if transactional_id is None:
        # no linger: the committer produces a batch's records together and goes on while
        # they are in flight; waiting 2 ms more for company only delays each step
        return producer(bootstrap, extra, **{"linger.ms": 0})
    made = producer(bootstrap, extra, **{"transactional.id": transactional_id})
    made.init_transactions(30)
    log.info("transactional producer %s: commits are Kafka transactions", transactional_id)
    return made


def consumer(bootstrap: str, extra: Settings | None = None, **overrides: Any) -> Consumer:
    cfg = base_config(bootstrap, extra, {
        "group.id": "kq-unused",  # required by librdkafka; kq assigns and stores offsets itself
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Some brokers (the embedded one) hold a fetch for about this long even when records
        # arrive meanwhile, so it is the latency of each hop. Apache Kafka answers at once:
        # there a longer wait ([service.kafka]) only saves idle fetch requests.
        "fetch.wait.max.ms": 5,
        "enable.partition.eof": False,
        **overrides})
    return _build(Consumer, cfg)  # type: ignore[no-any-return]


# How long a long-lived consumer's fetch may wait for records. Apache Kafka answers a fetch as
# soon as a record arrives (it parks the fetch in its "fetch purgatory"), so a long wait only
# spares the broker idle fetch requests, each of which costs it CPU (at 5 ms, every idle
# consumer sends 200 a second). Brokers that hold a fetch for the whole wait (the embedded
# one) make the wait each hop's latency: there it stays short.
SHORT_FETCH_WAIT_MS = 5
LONG_FETCH_WAIT_MS = 100
_answers_at_once: dict[str, bool] = {}


def fetch_wait_ms(bootstrap: str, extra: Settings | None = None) -> int:
    """The `fetch.wait.max.ms` for long-lived consumers of this cluster (asked once per
    process and cluster; a broker that does not say, or will not, gets the short wait)."""
    return LONG_FETCH_WAIT_MS if is_apache_kafka(bootstrap, extra) else SHORT_FETCH_WAIT_MS


def is_apache_kafka(bootstrap: str, extra: Settings | None = None) -> bool:
    """Whether the cluster is Apache Kafka (its brokers list the settings of its fetch
    purgatory): asked once per process and cluster; one that does not say counts as not."""
    if bootstrap not in _answers_at_once:
        _answers_at_once[bootstrap] = _has_fetch_purgatory(admin(bootstrap, extra))
    return _answers_at_once[bootstrap]


def _has_fetch_purgatory(a: AdminClient) -> bool:
    try:
        node = a.describe_cluster(request_timeout=10).result().nodes[0].id
        asked = a.describe_configs([ConfigResource(ConfigResource.Type.BROKER, str(node))])
        configs = next(iter(asked.values())).result(10)
    except (KafkaException, IndexError, StopIteration):  # no answer, or not allowed to ask
        return False
    return "fetch.purgatory.purge.interval.requests" in configs


def admin(bootstrap: str, extra: Settings | None = None) -> AdminClient:
    # Asking about a topic must not create it (librdkafka's admin handle would, by default).
    cfg = base_config(bootstrap, extra, {"allow.auto.create.topics": False})
    made = _build(AdminClient, cfg)
    made.kq_bootstrap = bootstrap  # named by the errors of wait_for_leaders
    return made  # type: ignore[no-any-return]


class _LastFailure(logging.Handler):
    """Keeps librdkafka's last connection failure (a refused SASL login, a TLS handshake):
    what a metadata timeout alone does not say."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "FAIL" in text:
            self.last = text.split("]: ", 1)[-1]


def check_reachable(bootstrap: str, extra: Settings | None = None, timeout: float = 10.0) -> None:
    """Raise KafkaUnavailableError (naming the address, and librdkafka's last connection
    failure, e.g. a refused login) unless Kafka answers within `timeout`."""
    failures = _LastFailure()
    watcher = logging.getLogger(f"kq.librdkafka.check.{id(failures)}")
    watcher.propagate = False
    watcher.setLevel(logging.WARNING)
    watcher.addHandler(failures)
    client = _build(AdminClient, {**base_config(bootstrap, extra,
                                                {"allow.auto.create.topics": False}),
                                  "logger": watcher, "log_level": 4})  # 4: warnings
    try:
        client.list_topics(timeout=timeout)
    except KafkaException as exc:
        client.poll(0)  # hands over the logs queued meanwhile
        detail = str(exc.args[0].str())
        if failures.last:
            detail += f" (last failure: {failures.last})"
        raise KafkaUnavailableError(bootstrap, detail) from None
    finally:
        watcher.removeHandler(failures)


# Answers that mean "not yet", not "no": Apache Kafka gives a topic just created a leader a
# moment after CreateTopics returns, and moves leaders; librdkafka does not flag them all as
# retriable. A caller that meets one asks again, within RETRY_FOR_S.
_NOT_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC, KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN, KafkaError.NETWORK_EXCEPTION,
    KafkaError.KAFKA_STORAGE_ERROR, KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
}
RETRY_FOR_S = 30.0

T = TypeVar("T")


def not_yet(exc: BaseException) -> bool:
    """A Kafka error that asking again may mend (no leader yet, a moved leader, a timeout)."""
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return False
    return err.code() in _NOT_YET or (err.retriable() and not err.fatal())


def retrying(call: Callable[[], T], what: str, bootstrap: str,
             within_s: float = RETRY_FOR_S) -> T:
    """`call()`, asked again while Kafka answers "not yet"; past `within_s`, a
    KafkaUnavailableError that names the broker and `what` was being done (exit 3)."""
    deadline = time.monotonic() + within_s
    pause = 0.05
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not not_yet(exc):
                raise
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    bootstrap, f"{what}: still {exc.args[0].str()} after {within_s:.0f} s"
                ) from None
            log.debug("%s: %s; asking again", what, exc.args[0].str())
            time.sleep(pause)
            pause = min(1.0, pause * 2)


def watermarks(c: Consumer, topic: str, partition: int, bootstrap: str = "Kafka",
               timeout: float = 10.0) -> tuple[int, int]:
    """(low, high) offsets of one partition as the broker reports them, asked again while
    the partition has no leader yet."""
    tp = TopicPartition(topic, partition)
    low, high = retrying(lambda: c.get_watermark_offsets(tp, timeout=timeout),
                         f"reading the offsets of {topic}/{partition}", bootstrap)
    return int(low), int(high)


def topic_metadata(client: AdminClient, timeout: float = 10.0) -> dict[str, int | None]:
    """Every topic (internal ones excluded) and its number of partitions; None for a topic
    that exists but reports an error just now (e.g. while it has no leader)."""
    md = client.list_topics(timeout=timeout)
    return {name: (len(t.partitions) if t.error is None else None)
            for name, t in md.topics.items() if not name.startswith("__")}


def end_offsets(client: AdminClient, topic: str, partitions: int,
                timeout: float = 10.0) -> list[int]:
    """The offset after the last record of each partition of `topic`."""
    asked = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}

    def ask() -> list[int]:
        answers = client.list_offsets(asked, request_timeout=timeout)
        return [answers[TopicPartition(topic, p)].result(timeout).offset
                for p in range(partitions)]

    return retrying(ask, f"reading the end offsets of {topic}",
                    getattr(client, "kq_bootstrap", "Kafka"))


def topic_partitions(client: AdminClient, timeout: float = 10.0) -> dict[str, int]:
    """Every usable topic (internal ones excluded) and its number of partitions."""
    return {name: n for name, n in topic_metadata(client, timeout).items() if n is not None}


# Apache Kafka creates a segment's index files when the segment is first indexed (once 4 KiB
# were appended, by default) and sizes each for 10 MiB. On a virtual disk that was measured
# to hold the partition's writer for 25-180 ms, and a broker answers one connection's
# requests in turn: a new worker's delivery topic reaching 4 KiB held the service's every
# produce (the journal and the other workers' deliveries) behind it, at every new segment
# too. With indexes of 64 KiB it took 2-5 ms. An entry per 256 KiB (not 4) keeps segments
# as long as before (a full index rolls the segment; 1 GiB by `segment.bytes` comes first),
# and a read from an offset or a time scans at most 256 KiB more, which kq, reading these
# topics onward from where it is, hardly notices.
SMALL_INDEXES: Final = {"segment.index.bytes": str(64 * 1024),
                        "index.interval.bytes": str(256 * 1024)}


def ensure_topics(client: AdminClient, names: Iterable[str], partitions: int = 1,
                  config: dict[str, str] | None = None, within_s: float = RETRY_FOR_S,
                  tuning: Mapping[str, str] | None = None) -> None:
    """Create the topics that do not exist yet (existing ones are left alone), and return
    once every partition of each has a leader: until then Apache Kafka answers reads and
    writes of a topic just created with "not leader" or "unknown partition".

    `tuning`: more settings, for speed only; a topic the broker refuses them for (one that
    does not know them) is created without them."""
    names = list(names)
    existing = set(topic_partitions(client))
    wanted = [n for n in names if n not in existing]
    refused = _create(client, wanted, partitions, {**(tuning or {}), **(config or {})},
                      tolerate_invalid=bool(tuning))
    if refused:
        log.info("creating %s: the broker refused %s; created without them", ", ".join(refused),
                 ", ".join(f"{k}={v}" for k, v in (tuning or {}).items()))
        _create(client, refused, partitions, dict(config or {}), tolerate_invalid=False)
    if wanted:
        wait_for_leaders(client, wanted, within_s)


def _create(client: AdminClient, names: list[str], partitions: int, config: dict[str, str],
            tolerate_invalid: bool) -> list[str]:
    """Create `names` (one already there is fine); return those refused for an invalid
    setting, when `tolerate_invalid` (else that refusal raises)."""
    refused = []
    topics = [NewTopic(n, partitions, 1, config=config) for n in names]
    for name, future in (client.create_topics(topics, operation_timeout=10).items()
                         if topics else ()):
        try:
            future.result()
        except KafkaException as exc:
            code = exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None
            if code == KafkaError.TOPIC_ALREADY_EXISTS or "TOPIC_ALREADY_EXISTS" in str(exc):
                continue
            if tolerate_invalid and code in (KafkaError.INVALID_CONFIG,
                                             KafkaError.POLICY_VIOLATION):
                refused.append(name)
                continue
            raise
    return refused


def _leaderless(client: AdminClient, topic: str) -> str | None:
    """Why `topic` cannot be used yet, or None once every partition has a leader."""
    md = client.list_topics(topic=topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None:
        return str(md.error.str() if md is not None and md.error else "not in the metadata")
    if not md.partitions:
        return "no partitions in the metadata"
    waiting = sorted(p for p, pm in md.partitions.items() if pm.leader < 0 or pm.error)
    return f"partition(s) {waiting} without a leader" if waiting else None


def wait_for_leaders(client: AdminClient, topics: list[str],
                     within_s: float = RETRY_FOR_S) -> None:
    """Return once every partition of `topics` has a leader; past `within_s`, a
    KafkaUnavailableError that names the topic (exit 3)."""
    deadline = time.monotonic() + within_s
    for topic in topics:
        while (why := _leaderless(client, topic)) is not None:
            if time.monotonic() > deadline:
                servers = getattr(client, "kq_bootstrap", "Kafka")
                raise KafkaUnavailableError(
                    servers, f"topic {topic} was created but has no leader after "
                             f"{within_s:.0f} s ({why})")
            time.sleep(0.05)


def end_offset(c: Consumer, topic: str, partition: int, timeout: float = 10.0) -> int:
    """The high watermark as the broker reports it.

    The embedded broker may under-report it after a multi-record write, so callers may only
    use it as a place to start reading from, never as proof that nothing follows.
    """
    return watermarks(c, topic, partition, timeout=timeout)[1]


def take(c: Consumer, max_records: int, timeout: float) -> list[Any]:
    """Wait up to `timeout` for one record, then take what else is already there.

    `Consumer.consume(n, timeout)` waits until it has n records or the timeout passed, which
    adds the whole timeout to the latency of a quiet topic.
    """
    first = c.poll(timeout)
    if first is None:
        return []
    return [first, *c.consume(max_records - 1, 0)] if max_records > 1 else [first]
