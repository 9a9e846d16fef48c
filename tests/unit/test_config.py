import pytest

from broker.config import load_config, parse_config
from broker.errors import ConfigError
from broker.values import Bookmark, Duration


def q(**kw):
    return {"queue": [{"name": "ORDERS", **kw}]}


def error_of(raw) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    return str(exc.value)


def test_defaults_follow_the_spec():
    cfg = parse_config(q())
    o = cfg.queue[0]
    assert o.lease_period == Duration(60_000)
    assert o.max_per_subscription_backlog == 10
    assert o.effective_fairness == "proportional"
    assert o.topic_regex.pattern == "^ORDERS$"
    assert o.publish_target is None  # no underlying_topic: the topic NAME is its own
    assert cfg.service.heartbeat_timeout == Duration(10_000)
    assert cfg.service.topic_prefix == "kq"


def test_default_publish_target_is_name_direct_when_underlying_topic_is_set():
    o = parse_config(q(underlying_topic="^(ORDERS|X)$")).queue[0]
    assert o.publish_target == "ORDERS_DIRECT"


def test_at_most_once_defaults_to_round_robin():
    assert parse_config(q(semantics="at-most-once")).queue[0].effective_fairness == "round-robin"
    # the defaults written out, and a lease period (a test's way to show nothing comes back)
    parse_config(q(semantics="at-most-once", max_deliveries=0, redelivery_delay="0s",
                   lease_period="1s"))


@pytest.mark.parametrize(("raw", "words"), [
    (q(bogus=1), ["queue 'ORDERS'", "'bogus'", "unknown key"]),
    (q(lease_period="5x"), ["queue 'ORDERS'", "'lease_period'", "bad duration"]),
    (q(underlying_topic="(("), ["'underlying_topic'", "bad regex"]),
    (q(default_publish_target="ELSEWHERE"),  # (a no-op: the queue reads ORDERS itself)
     ["queue 'ORDERS'", "default_publish_target applies only with underlying_topic"]),
    (q(semantics="at-most-once", fairness="proportional"),
     ["queue 'ORDERS'", "fairness", "at-most-once"]),
    (q(target_queue_depth=5, priority="/p"), ["target_queue_depth", "priority"]),
    (q(target_queue_depth=5, priority_levels=3), ["target_queue_depth", "priority_levels"]),
    (q(min_ttl="1m", max_ttl="30s"), ["queue 'ORDERS'", "min_ttl", "above max_ttl"]),
    (q(max_ttl="soon"), ["'max_ttl'", "bad duration"]),
    (q(format="avro"), ["queue 'ORDERS'", "needs schema"]),
    (q(format="avro", schema="/nonexistent/x.avsc"), ["cannot read schema /nonexistent/x.avsc"]),
    (q(schema="x.avsc"), ["schema is for format = 'avro'"]),
    (q(priority_levels=1), ["queue 'ORDERS'", "'priority_levels'", "greater than or equal to 2"]),
    (q(priority_levels=11), ["'priority_levels'", "less than or equal to 10"]),
    (q(group_mode="shared"), ["queue 'ORDERS'", "group_mode = 'shared' needs group_key"]),
    (q(group_key="/g", group_mode="loose"), ["'group_mode'"]),
    (q(group_key="/g ="), ["'group_key'", "column"]),
    (q(group_key="/g", barrier_expression="/b"), ["group_key", "barrier_expression"]),
    (q(group_key="/g", nondestructive=True), ["group_key", "nondestructive"]),
    (q(barrier_expression="/b ="), ["queue 'ORDERS'", "'barrier_expression'", "column"]),
    (q(priority="/p = "), ["queue 'ORDERS'", "'priority'", "column 6"]),
    (q(lvq_key="/k", priority="/p"), ["queue 'ORDERS'", "lvq_key", "priority"]),
    (q(lvq_key="/k", priority_levels=3), ["lvq_key", "priority_levels"]),
    (q(lvq_key="/k", target_queue_depth=3), ["lvq_key", "target_queue_depth"]),
    (q(lvq_key="/k ="), ["'lvq_key'", "column"]),
    (q(max_messages=10), ["max_messages and max_bytes need an overflow_policy"]),
    (q(overflow_policy="ring"), ["overflow_policy = 'ring' needs max_messages or max_bytes"]),
    (q(max_messages=0, overflow_policy="ring"), ["'max_messages'", "greater than or equal"]),
    (q(max_bytes=100, overflow_policy="drop"), ["'overflow_policy'"]),
    (q(max_messages=10, overflow_policy="reject", target_queue_depth=5),
     ["max_messages and max_bytes", "target_queue_depth"]),
    (q(missing_sort_key="last"), ["missing_sort_key", "needs sort_key"]),
    (q(sort_key="/k", priority="/p"), ["queue 'ORDERS'", "sort_key", "priority"]),
    (q(sort_key="/k", priority_levels=2), ["sort_key", "priority_levels"]),
    (q(sort_key="/k", target_queue_depth=2), ["sort_key", "target_queue_depth"]),
    (q(sort_key="/k", lvq_key="/j"), ["lvq_key", "sort_key"]),
    (q(sort_key="/k", missing_sort_key="middle"), ["'missing_sort_key'"]),
    (q(sort_key="(("), ["'sort_key'"]),
    (q(max_redelivery_delay="1m"), ["queue 'ORDERS'", "max_redelivery_delay",
                                    "redelivery_backoff = 'exponential'"]),
    (q(redelivery_backoff="exponential"), ["redelivery_backoff", "needs redelivery_delay"]),
    (q(redelivery_delay="10s", redelivery_backoff="exponential", max_redelivery_delay="1s"),
     ["max_redelivery_delay (1s) is below redelivery_delay (10s)"]),
    (q(redelivery_delay="later"), ["'redelivery_delay'", "bad duration"]),
    # accepted and ignored: an at-most-once message is never delivered twice
    (q(semantics="at-most-once", max_deliveries=3, redelivery_delay="5s"),
     ["queue 'ORDERS'", "max_deliveries and redelivery_delay mean nothing with at-most-once"]),
    (q(semantics="at-most-once", max_cancels=1), ["max_cancels mean nothing"]),
    (q(hold_on_publish="yes"), ["'hold_on_publish'"]),
    (q(recovery_point="yesterday"), ["'recovery_point'", "ISO-8601"]),
    (q(semantics="sometimes"), ["'semantics'"]),
    (q(max_deliveries=-1), ["'max_deliveries'"]),
    ({"service": {"colour": "red"}}, ["'service.colour'", "unknown key"]),
    ({"service": {"heartbeat_timeout": "soon"}}, ["heartbeat_timeout", "bad duration"]),
    ({"queue": [{"name": "A"}, {"name": "A"}]}, ["defined twice"]),
    ({"auth": {"worker-1": "(("}}, ["[auth] 'worker-1'", "bad regex"]),
    ({"auth": {"alice@EXAMPLE.COM": ".*"}}, ["[auth] 'alice@EXAMPLE.COM'", "topic name"]),
    ({"queue": [{"lease_period": "1s"}]}, ["queue #1", "'name'"]),
])
def test_config_errors_name_the_queue_and_the_key(raw, words):
    message = error_of(raw)
    for w in words:
        assert w in message


def test_load_config_reports_bad_toml_and_missing_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[queue]\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")


def test_the_example_config_is_valid():
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[2] / "ops" / "queues.example.toml")
    assert {q.name for q in cfg.queue} == {"ORDERS_ANALYTICS", "ORDERS_RISK", "JOBS", "TICKETS",
                                           "PRICES", "REMINDERS", "POSITIONS", "METRICS",
                                           "UPLOADS", "EVENTS", "DEADLINES", "CARTS"}


@pytest.mark.parametrize(("text", "ms"), [("500ms", 500), ("30s", 30_000), ("5m", 300_000),
                                          ("1h", 3_600_000), ("1d", 86_400_000), ("1.5s", 1500)])
def test_durations(text, ms):
    assert Duration.parse(text).ms == ms


def test_bookmarks_round_trip_even_with_slashes_in_the_topic():
    for text in ["ORDERS/0/1234", "a/b/3/7"]:
        assert str(Bookmark.parse(text)) == text
    with pytest.raises(ValueError, match="TOPIC/PARTITION/OFFSET"):
        Bookmark.parse("ORDERS/x/1")


def test_memory_budget_reads_sizes_and_refuses_too_little():
    assert int(parse_config({}).service.memory_budget) == 64 * 1024 * 1024
    assert int(parse_config({"service": {"memory_budget": "1GiB"}}).service.memory_budget) == 2**30
    message = error_of({"service": {"memory_budget": "1MB"}})
    assert "memory_budget" in message
    assert "memory_budget" in error_of({"service": {"memory_budget": "lots"}})


def test_an_avro_queue_needs_a_schema_that_parses(tmp_path):
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "X", "fields": [{"name": "a"}]}')
    with pytest.raises(ConfigError, match="schema '.*bad.avsc': not an Avro schema"):
        parse_config(q(format="avro", schema=str(bad)))
    good = tmp_path / "good.avsc"
    good.write_text('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]}')
    assert parse_config(q(format="avro", schema=str(good))).queue[0].schema_ == str(good)


def test_avro_payloads_decode_with_the_schema_and_bad_ones_say_so():
    import io

    import fastavro

    from broker.formats import decode

    schema = '{"type": "record", "name": "T", "fields": [{"name": "sym", "type": "string"}]}'
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(__import__("json").loads(schema)),
                               {"sym": "IBM"})
    assert decode("avro", out.getvalue(), schema) == {"sym": "IBM"}
    with pytest.raises(ValueError, match="not Avro"):
        decode("avro", b"\xff\xff\xff", schema)
    assert decode("bytes", b"{}") is None and decode("json", b'{"a": 1}') == {"a": 1}


def test_the_journal_keeps_at_least_two_snapshot_intervals():
    svc = parse_config({}).service
    assert (svc.snapshot_interval, svc.journal_retention) == (Duration(300_000),
                                                              Duration(7 * 86_400_000))
    forever = parse_config({"service": {"journal_retention": "forever"}}).service
    assert forever.journal_retention is None
    with pytest.raises(ConfigError, match=r"journal_retention = 5m is shorter than twice "
                                          r"snapshot_interval \(5m\).*at least 10m"):
        parse_config({"service": {"journal_retention": "5m"}})
    with pytest.raises(ConfigError, match="snapshot_interval = 500ms: at least 1s"):
        parse_config({"service": {"snapshot_interval": "500ms"}})


def test_journal_settings_that_could_lose_what_a_restore_needs_are_named():
    from broker.service.retention import journal_problem

    svc = parse_config({"service": {"snapshot_interval": "1m"}}).service
    fine = {"retention.ms": "604800000", "retention.bytes": "-1", "cleanup.policy": "delete"}
    assert journal_problem(fine, svc) is None
    assert journal_problem({**fine, "retention.ms": "-1"}, svc) is None  # forever
    assert "retention.ms = 60000 (1m) is shorter" in journal_problem(
        {**fine, "retention.ms": "60000"}, svc)
    assert "at least 2m" in journal_problem({**fine, "retention.ms": "60000"}, svc)
    assert "retention.bytes = 1000" in journal_problem({**fine, "retention.bytes": "1000"}, svc)
    assert "cleanup.policy = compact" in journal_problem(
        {**fine, "cleanup.policy": "compact"}, svc)
