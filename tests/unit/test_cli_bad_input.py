"""What a user typed wrong is named and exits 2 (SPEC section 8), before any Kafka is
reached; a handler module that cannot load names its file and line."""

import pytest
from typer.testing import CliRunner

from broker.client.worker import load_handler
from broker.config import load_config
from broker.errors import ConfigError
from cli.main import app


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(("args", "words"), [
    (["serve", "--log-level", "LOUD"], "bad --log-level 'LOUD'"),
    (["broker", "--port", "70000"], "'--port'"),
    (["serve", "--broker-port", "-1"], "'--broker-port'"),
    (["journal", "dump", "--kind", "bogus"], "no kind bogus: the kinds are enqueued"),
    (["journal", "dump", "--limit", "-1"], "'--limit'"),
    (["inspect", "Q", "--limit", "0"], "'--limit'"),
    (["publish", "bad topic!", "{}"], "bad topic name 'bad topic!'"),
    (["publish", "", "{}"], "bad topic name ''"),
    (["publish", "T", "@"], "@ names no file: use @FILE"),
    (["queues", "-b", ""], "--bootstrap-servers: bootstrap servers are empty"),
    (["subscribers", "-b", ","], "bad bootstrap server ''"),
    (["inspect", "Q", "-b", "127.0.0.1:notaport"], "bad bootstrap server '127.0.0.1:notaport'"),
    (["consume", "Q", "--replay-period", "60s"], "--replay-period applies to --browse only"),
    (["journal", "dump", "--since", "yesterday"], "or epoch milliseconds"),
    (["journal", "dump", "--since", "-1h", "--until", "-2h"],
     "--since -1h is not before --until -2h"),
    (["consume", "Q", "--count", "-1"], "'--count'"),
    (["consume", "Q", "--max-backlog", "0"], "'--max-backlog'"),
    (["worker", "jobs:handle", "--queue", "Q", "--concurrency", "0"], "'--concurrency'"),
    (["worker", "jobs:handle", "--queue", "Q", "--max-backlog", "0"], "'--max-backlog'"),
])
def test_a_bad_option_exits_2_naming_it(args, words):
    out = _run(*args)
    assert out.exit_code == 2, out.output
    assert words in " ".join(out.output.split())


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "kq.toml"
    path.write_bytes(b"\xff\xfe[service]\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(path)


@pytest.mark.parametrize(("source", "spec", "words"), [
    ("def handle(msg)\n    pass\n", "broken:handle", "broken.py, line 1"),
    ("raise RuntimeError('no database')\n", "raising:handle",
     "importing raising raised RuntimeError('no database') ("),
    ("handle = 5\n", "five:handle", "five.handle is not a function"),
    ("def other(msg): pass\n", "other:handle", "other has no function 'handle'"),
])
def test_a_handler_that_cannot_be_loaded_is_named(tmp_path, monkeypatch, source, spec, words):
    module = spec.split(":")[0]
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        load_handler(spec)
    assert words in str(exc.value)


def test_a_handler_that_loads_is_returned(tmp_path, monkeypatch):
    (tmp_path / "fine.py").write_text("def handle(msg):\n    return msg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_handler("fine:handle")(7) == 7


def test_a_data_dir_that_cannot_be_made_exits_2_before_any_broker(tmp_path):
    (tmp_path / "file").write_text("")
    cfg = tmp_path / "kq.toml"
    cfg.write_text(f'[service]\ndata_dir = "{tmp_path}/file/sub"\n\n[[queue]]\nname = "Q"\n')
    out = _run("serve", "--config", str(cfg))
    assert out.exit_code == 2, out.output
    said = f"[service] data_dir {tmp_path}/file/sub: cannot create it"
    assert "".join(said.split()) in "".join(out.output.split())  # however the line wrapped


def test_a_config_with_bad_bootstrap_servers_is_refused(tmp_path):
    path = tmp_path / "kq.toml"
    path.write_text('[service]\nbootstrap_servers = "host:99999"\n\n[[queue]]\nname = "Q"\n')
    with pytest.raises(ConfigError, match="bad bootstrap server 'host:99999'"):
        load_config(path)


def test_an_empty_data_dir_is_refused_naming_it(tmp_path):
    """It was taken as the current directory: shard-0, shard-1... made wherever kq ran."""
    path = tmp_path / "kq.toml"
    path.write_text('[service]\ndata_dir = ""\n\n[[queue]]\nname = "Q"\n')
    with pytest.raises(ConfigError, match="data_dir"):
        load_config(path)


def test_a_session_timeout_of_no_time_is_refused_naming_it(tmp_path):
    """"0s" was blamed on [service.kafka] by librdkafka. (A session the broker refuses is
    named with what the broker accepts: tests/kafka/test_apache_kafka.py.)"""
    path = tmp_path / "kq.toml"
    path.write_text('[service]\nsession_timeout = "0s"\n\n[[queue]]\nname = "Q"\n')
    with pytest.raises(ConfigError, match="session_timeout = 0ms: must be more than 0"):
        load_config(path)


def test_a_bad_instance_name_on_the_command_line_is_refused_as_in_the_config(tmp_path):
    """`--instance` (and KQ_INSTANCE) skipped the config's check: 'bad name/x' served."""
    cfg = tmp_path / "kq.toml"
    cfg.write_text(f'[service]\ndata_dir = "{tmp_path}/d"\n\n[[queue]]\nname = "Q"\n')
    out = _run("serve", "--config", str(cfg), "--instance", "bad name/x")
    assert out.exit_code == 2 and "bad --instance 'bad name/x'" in out.output, out.output


@pytest.mark.parametrize(("line", "key"), [
    ('max_deliveries = "5"', "max_deliveries"), ("max_deliveries = 5.0", "max_deliveries"),
    ('nondestructive = "yes"', "nondestructive"), ('max_bytes = "1000"', "max_bytes")])
def test_a_number_or_switch_given_as_text_is_refused_naming_the_key(tmp_path, line, key):
    """They were converted quietly ("5" -> 5, "yes" -> true), where `hold_on_publish = "yes"`
    was refused: every key is now taken as TOML typed it."""
    path = tmp_path / "kq.toml"
    path.write_text(f'[[queue]]\nname = "Q"\n{line}\n')
    with pytest.raises(ConfigError, match=f"queue 'Q', key '{key}'"):
        load_config(path)


@pytest.mark.parametrize(("text", "key"), [
    ('[service]\nheartbeat_timeout = "0ms"\n\n[[queue]]\nname = "Q"\n',
     "service.heartbeat_timeout"),
    ('[[queue]]\nname = "Q"\nlease_period = "0s"\n', "lease_period")])
def test_a_heartbeat_timeout_or_lease_period_of_no_time_is_refused(tmp_path, text, key):
    """Accepted, they made the queue unusable: every client dropped as it subscribed
    ("no heartbeat for 0 ms"), every lease lapsed as it was made, every ack refused."""
    path = tmp_path / "kq.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"key '{key}': 0(ms|s)?: must be more than 0"):
        load_config(path)
