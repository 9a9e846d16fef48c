"""The TOML configuration, validated once into frozen, typed objects.

Validation is pydantic's (unknown keys are errors, types are checked); this module adds the
kq rules that span keys and turns every failure into one `ConfigError` naming queue and key.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from broker.config_fields import DurationField, RetentionField, parse_time
from broker.config_fields import Strict as _Strict
from broker.errors import ConfigError, ExpressionError
from broker.expr import compile_expression
from broker.formats import load_schema
from broker.service_config import ServiceConfig
from broker.shards import shard_by_name
from broker.values import CLIENT_NAME, Duration

__all__ = ["Config", "QueueConfig", "ServiceConfig", "DurationField", "RetentionField",
           "load_config", "parse_config", "parse_time"]


class QueueConfig(_Strict):
    """One `[[queue]]` table."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    """The queue's name (A-Z a-z 0-9 . _ -). Without `underlying_topic` the queue reads the
    topic of this name."""
    underlying_topic: str | None = None
    """A regular expression: the queue reads every topic whose name it matches (e.g.
    `^orders\\.`). Default: the topic named like the queue."""
    default_publish_target: str | None = None
    """Where records written to a topic named exactly like the queue go, when the queue reads
    other topics (`underlying_topic`). Default: `NAME_DIRECT` then."""
    semantics: Literal["at-least-once", "at-most-once"] = "at-least-once"
    """at-least-once: a message is leased and must be acked, or it is delivered again.
    at-most-once: a message leaves the queue when it is sent and is never delivered again."""
    lease_period: DurationField = Duration(60_000)
    """How long a subscriber holds a message before it goes back to the queue unanswered
    (renewable with `msg.extend`)."""
    max_deliveries: StrictInt = Field(0, ge=0)
    """A message delivered this many times whose last lease lapses is removed (dead-lettered
    with reason max-deliveries). 0: no limit."""
    max_cancels: StrictInt = Field(0, ge=0)
    """A message cancelled more often than this is removed (reason max-cancels). 0: no
    limit."""
    expiration: DurationField | None = None
    """A message still queued this long after its record's timestamp is removed (reason
    expired); a `kq-expiration` header (ms) sets a message's own. Default: never."""
    max_per_subscription_backlog: StrictInt = Field(10, ge=1)
    """The most messages one subscription may hold at once, whatever its `max_backlog`."""
    fairness: Literal["fast", "round-robin", "proportional"] | None = None
    """How messages are shared among subscribers: proportional to their free backlog
    (the default for at-least-once), round-robin (the default and only choice for
    at-most-once), or fast (the first with room)."""
    leasing: Literal["strict", "permissive"] = "strict"
    """strict: only the lease holder may ack, cancel or expire a message. permissive: any
    subscriber of the queue may."""
    recovery_point: str = "earliest"
    """Where a new queue starts reading its topics: earliest, latest, or an ISO-8601 time
    (records published before it are not enqueued)."""
    dead_letter_topic: str | None = None
    """Removed messages (too many deliveries or cancels, expired, too large, rejected) are
    copied here with kq-* headers saying why. Default: dropped."""
    format: Literal["json", "bytes", "avro"] = "json"
    """How payloads are decoded for filters, expressions and `msg.data`."""
    priority: str | None = None
    """An expression computing each message's priority: higher first, arrival order among
    equals."""
    priority_levels: StrictInt | None = Field(None, ge=2, le=10)
    """A Qpid priority queue of this many levels (2-10): a priority 0-9 from `priority`,
    else the `kq-priority` header (4 when absent), collapsed onto the levels, highest
    first."""
    barrier_expression: str | None = None
    """An expression marking barrier messages: a barrier waits until every message before it
    is finished, then is sent to every subscriber."""
    target_queue_depth: StrictInt | None = Field(None, ge=1)
    """Read the underlying topics only while fewer than this many messages are queued
    (AMPS TargetQueueDepth): the rest waits in Kafka."""
    sort_key: str | None = None
    """A sorted queue: an expression whose value orders delivery, ascending (numbers before
    strings)."""
    missing_sort_key: Literal["first", "last"] | None = None
    """With `sort_key`: where messages without a sort key go. Default: first."""
    lvq_key: str | None = None
    """A last-value queue: an expression naming each message's key; a newer message with
    the same key replaces an available older one (reason replaced)."""
    group_key: str | None = None
    """Message groups: an expression naming each message's group; a group's messages are
    delivered one at a time, in order."""
    group_mode: Literal["sticky", "shared"] | None = None
    """With `group_key`: sticky keeps a group with one subscriber while it holds any of its
    messages; shared lets any subscriber take the next. Default: sticky."""
    hold_on_publish: StrictBool = False
    """Honour the `kq-not-before` header (epoch ms): a message is held until then (Qpid's
    hold-until)."""
    max_messages: StrictInt | None = Field(None, ge=1)
    """The most messages the queue holds; over it, `overflow_policy` decides."""
    max_bytes: StrictInt | None = Field(None, ge=1)
    """The most bytes (key + value + headers) the queue holds; over it, `overflow_policy`
    decides."""
    overflow_policy: Literal["none", "ring", "reject", "flow-control"] = "none"
    """Over max_messages or max_bytes: ring removes the oldest available, reject removes the
    newcomer, flow-control asks publishers to pause (PREFIX.flow)."""
    min_ttl: DurationField | None = None
    """Raise every message's time to live (from `kq-expiration` or `expiration`) to at
    least this."""
    max_ttl: DurationField | None = None
    """Lower every message's time to live to at most this (also the time to live of
    messages that have none)."""
    nondestructive: StrictBool = False
    """Every subscription browses: messages are shown, never leased or taken (Qpid's
    nondestructive queues)."""
    default_replay_period: DurationField | None = None
    """A browser's `replay_period` when it gives none."""
    redelivery_delay: DurationField | None = None
    """A message given back (lapsed, cancelled) is held this long before it is available
    again (`msg.cancel(delay=...)` sets it for one return). Default: at once."""
    redelivery_backoff: Literal["fixed", "exponential"] = "fixed"
    """With `redelivery_delay`: fixed, or exponential (doubled for each delivery before the
    last)."""
    max_redelivery_delay: DurationField | None = None
    """With exponential backoff: the longest delay."""
    schema_: str | None = Field(None, alias="schema")
    """With `format = "avro"`: the path of the .avsc schema of the payloads."""
    shard: StrictInt | None = Field(None, ge=0)
    """The shard that owns the queue (0 to shards - 1). Default: a stable hash of its
    name. Do not change it once the queue has state: kq does not move a queue's state
    between shards, and the other shard would start the queue anew from its recovery point
    (messages already acked delivered again; the old shard warns at its start)."""

    @field_validator("priority", "barrier_expression", "lvq_key", "sort_key", "group_key")
    @classmethod
    def _expression_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_expression(value)
            except ExpressionError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("lease_period")
    @classmethod
    def _some_time(cls, value: Duration) -> Duration:
        if value.ms <= 0:  # (every lease would lapse as it is made, every ack refused)
            raise ValueError(f"{value}: must be more than 0")
        return value

    @field_validator("underlying_topic")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"bad regex {value!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _cross_key_rules(self) -> QueueConfig:
        if self.semantics == "at-most-once" and self.fairness not in (None, "round-robin"):
            raise ValueError(f"fairness = {self.fairness!r} is not allowed with at-most-once "
                             "(only 'round-robin')")
        delay = self.redelivery_delay.ms if self.redelivery_delay else 0
        redelivered = [k for k, v in (("max_deliveries", self.max_deliveries), ("max_cancels",
                       self.max_cancels), ("redelivery_delay", delay)) if v]
        if self.semantics == "at-most-once" and redelivered:  # (each is about redeliveries)
            raise ValueError(f"{' and '.join(redelivered)} mean nothing with at-most-once: its "
                             "messages leave the queue when sent and are never delivered again")
        if self.default_publish_target and not self.underlying_topic:
            raise ValueError("default_publish_target applies only with underlying_topic (the "
                             "queue reads the topic of its name itself, so nothing is "
                             "forwarded)")
        if (self.min_ttl is not None and self.max_ttl is not None
                and self.min_ttl.ms > self.max_ttl.ms):
            raise ValueError(f"min_ttl ({self.min_ttl}) is above max_ttl ({self.max_ttl})")
        for other in ("priority", "priority_levels", "barrier_expression"):
            if self.target_queue_depth is not None and getattr(self, other) is not None:
                raise ValueError(f"target_queue_depth is not allowed together with {other}")
        if self.redelivery_backoff == "exponential" and not self.redelivery_delay:
            raise ValueError("redelivery_backoff = 'exponential' needs redelivery_delay "
                             "(the first delay, which then doubles)")
        if self.max_redelivery_delay is not None and (
                self.redelivery_backoff != "exponential"):
            raise ValueError("max_redelivery_delay is the cap of redelivery_backoff = "
                             "'exponential'; set that too, or drop it")
        if (self.max_redelivery_delay is not None and self.redelivery_delay is not None
                and self.max_redelivery_delay.ms < self.redelivery_delay.ms):
            raise ValueError(f"max_redelivery_delay ({self.max_redelivery_delay}) is below "
                             f"redelivery_delay ({self.redelivery_delay})")
        for other in ("priority", "priority_levels", "target_queue_depth"):
            if self.sort_key is not None and getattr(self, other) is not None:
                raise ValueError(f"sort_key is not allowed together with {other}")
        if self.missing_sort_key is not None and self.sort_key is None:
            raise ValueError("missing_sort_key says where messages without a sort key go: "
                             "it needs sort_key")
        self._admission_rules()
        self._group_rules()
        if self.format == "avro" and self.schema_ is None:
            raise ValueError("format = 'avro' needs schema (the path of an .avsc file)")
        if self.schema_ is not None and self.format != "avro":
            raise ValueError(f"schema is for format = 'avro', not {self.format!r}")
        if self.schema_ is not None:
            try:
                load_schema(self.schema_)  # readable, and an Avro schema
            except ValueError as exc:
                raise ValueError(f"schema {self.schema_!r}: {exc}") from None
        return self

    def _admission_rules(self) -> None:
        """Last-value and size-limited queues: what they may not be combined with."""
        # Qpid refuses a queue that is two of priority, sorted and last-value; a limit
        # needs a policy that says what happens over it, and TargetQueueDepth bounds the
        # queue its own way
        for other in ("priority", "priority_levels", "sort_key", "target_queue_depth"):
            if self.lvq_key is not None and getattr(self, other) is not None:
                raise ValueError(f"lvq_key is not allowed together with {other}")
        limited = self.max_messages is not None or self.max_bytes is not None
        if limited and self.overflow_policy == "none":
            raise ValueError("max_messages and max_bytes need an overflow_policy (ring, "
                             "reject or flow-control) saying what happens over them")
        if not limited and self.overflow_policy != "none":
            raise ValueError(f"overflow_policy = {self.overflow_policy!r} needs max_messages "
                             "or max_bytes")
        if limited and self.target_queue_depth is not None:
            raise ValueError("max_messages and max_bytes are not allowed together with "
                             "target_queue_depth")

    def _group_rules(self) -> None:
        """Message groups: what they may not be combined with."""
        if self.group_mode is not None and self.group_key is None:
            raise ValueError(f"group_mode = {self.group_mode!r} needs group_key (the expression "
                             "naming each message's group)")
        if self.group_key is None:
            return
        if self.barrier_expression is not None:
            # a barrier waits for everything before it, and a sticky group waits for its
            # holder: combined, one consumer's group could hold every worker's barrier
            raise ValueError("group_key is not allowed together with barrier_expression")
        if self.nondestructive:
            raise ValueError("group_key is not allowed together with nondestructive (every "
                             "subscription browses, and browsers ignore groups)")

    @field_validator("recovery_point")
    @classmethod
    def _recovery_point(cls, value: str) -> str:
        if value not in ("earliest", "latest"):
            try:
                parse_time(value)
            except ValueError:
                raise ValueError(f"bad recovery_point {value!r}: use 'earliest', 'latest' or "
                                 "an ISO-8601 time like 2026-11-22T08:00:00Z") from None
        return value

    def recovery_start_ms(self, now_ms: int) -> int:
        """The time a new queue starts from: records older than this are not enqueued."""
        if self.recovery_point == "earliest":
            return 0
        if self.recovery_point == "latest":
            return now_ms
        return parse_time(self.recovery_point)

    @property
    def topic_regex(self) -> re.Pattern[str]:
        return re.compile(self.underlying_topic or f"^{re.escape(self.name)}$")

    @property
    def publish_target(self) -> str | None:
        """Where records written to a topic named exactly like the queue are forwarded."""
        if self.default_publish_target:
            return self.default_publish_target
        return f"{self.name}_DIRECT" if self.underlying_topic else None

    @property
    def effective_fairness(self) -> str:
        if self.fairness:
            return self.fairness
        return "round-robin" if self.semantics == "at-most-once" else "proportional"

    @property
    def at_most_once(self) -> bool:
        return self.semantics == "at-most-once"


class Config(_Strict):
    """The whole file."""

    service: ServiceConfig = Field(default_factory=ServiceConfig)  # type: ignore[arg-type]
    """The `[service]` table."""
    auth: dict[str, str] = Field(default_factory=dict)
    """The `[auth]` table: principal = regular expression of the queues it may use. With
    it, each principal sends commands on a topic of its own (PREFIX.commands.PRINCIPAL)."""
    queue: tuple[QueueConfig, ...] = ()
    """The `[[queue]]` tables, one per queue."""

    @model_validator(mode="after")
    def _rules(self) -> Config:
        for principal, pattern in self.auth.items():
            if not CLIENT_NAME.match(principal):
                raise ValueError(
                    f"[auth] {principal!r}: a principal must be usable in a Kafka topic name "
                    "(its commands come on PREFIX.commands.<principal>): use 1-200 of "
                    "A-Z a-z 0-9 . _ -")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"[auth] {principal!r}: bad regex {pattern!r}: {exc}") from None
        seen: set[str] = set()
        for q in self.queue:
            if q.name in seen:
                raise ValueError(f"queue {q.name!r} is defined twice")
            seen.add(q.name)
            if q.shard is not None and q.shard >= self.service.shards:
                raise ValueError(f"queue {q.name!r}: shard = {q.shard} but [service] shards = "
                                 f"{self.service.shards} (shards are numbered 0 to "
                                 f"{self.service.shards - 1})")
        return self

    def digest(self) -> str:
        """A fingerprint of what every instance sharing the topic prefix must agree on: the
        shard count and every queue's definition (not per-instance keys such as data_dir)."""
        shared = {"shards": self.service.shards,
                  "queues": [q.model_dump(mode="json") for q in self.queue]}
        return hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()
                              ).hexdigest()[:16]

    def shard_of(self, queue: str) -> int:
        """The shard that owns a queue: its `shard` key, else a stable hash of its name."""
        q = self.queues.get(queue)
        if q is not None and q.shard is not None:
            return q.shard
        return shard_by_name(queue, self.service.shards)

    def queues_of_shard(self, shard: int) -> tuple[QueueConfig, ...]:
        return tuple(q for q in self.queue if self.shard_of(q.name) == shard)

    @property
    def queues(self) -> dict[str, QueueConfig]:
        return {q.name: q for q in self.queue}


def _where(loc: tuple[Any, ...], raw: dict[str, Any]) -> str:
    """Turn a pydantic location like ('queue', 1, 'lease_period') into words."""
    if len(loc) >= 2 and loc[0] == "queue" and isinstance(loc[1], int):
        queues = raw.get("queue") or []
        name = queues[loc[1]].get("name") if loc[1] < len(queues) else None
        label = f"queue {name!r}" if name else f"queue #{loc[1] + 1}"
        key = ".".join(str(p) for p in loc[2:])
        return f"{label}, key {key!r}" if key else label
    key = ".".join(str(p) for p in loc)
    return f"key {key!r}" if key else "config"


def _explain(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def parse_config(raw: dict[str, Any]) -> Config:
    """Validate a parsed TOML document; raise ConfigError naming queue and key."""
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{_where(tuple(e['loc']), raw)}: {_explain(e)}" for e in exc.errors()]
        raise ConfigError("invalid configuration: " + "; ".join(lines)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text (byte {exc.start}): TOML must be") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from None
    return parse_config(raw)
