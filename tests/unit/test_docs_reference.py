"""The generated references name everything the code has: every config key with its
default and a description, every `kq` command."""

import re

from broker.config import QueueConfig, ServiceConfig
from cli.reference import cli_reference, config_reference


def test_every_config_key_is_in_the_reference_with_a_description():
    text = config_reference()
    for model in (ServiceConfig, QueueConfig):
        for name, field in model.model_fields.items():
            key = field.alias or name
            row = re.search(rf"^\| `{re.escape(key)}` \|.*$", text, re.M)
            assert row, f"{key} is missing from the configuration reference"
            assert field.description and len(field.description) > 20, key
            assert row.group(0).count("|") >= 5


def test_the_reference_shows_defaults_as_a_user_writes_them():
    text = config_reference()
    assert '| `lease_period` | duration (e.g. `"30s"`) | `"1m"` |' in text
    assert "| `max_per_subscription_backlog` | integer | `10` |" in text


def test_every_command_is_in_the_cli_reference():
    from typer.main import get_command

    from cli.main import app

    text = cli_reference()
    group = get_command(app)
    context = group.context_class(group)
    for name in group.list_commands(context):
        assert f"## `kq {name}" in text, name
    for sub in ("dump", "grep", "replay", "report", "audit"):
        assert f"## `kq journal {sub}`" in text
    assert "`--concurrency`" in text and "`--grace`" in text  # kq worker's options


def test_the_cli_reference_says_which_options_are_required_and_every_default():
    text = cli_reference()
    where = next(line for line in text.splitlines() if line.startswith("| `--where` |"))
    assert "(required)" in where  # kq ack exits 2 without it
    rows = text.split("## `kq consume`")[1].split("## ")[0].splitlines()
    assert any(r.startswith("| `--count` |") and "default `0`" in r for r in rows)
    assert any(r.startswith("| `--ack`, `--no-ack` |") and "default `--ack`" in r for r in rows)
