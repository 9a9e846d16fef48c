"""What a user installs: the distribution kafka-queues, typed, licensed, versioned."""

import tomllib
from pathlib import Path

import broker

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_kafka_queues_with_its_license_and_typing_marker():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "kafka-queues"  # `kq` on PyPI is another project
    assert project["scripts"] == {"kq": "cli.entry:run"}
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert project["license"] == "Apache-2.0"
    assert (ROOT / "broker" / "py.typed").exists()
    assert {"spark", "test", "docs"} <= set(project["optional-dependencies"])


def test_the_version_is_one_number_everywhere():
    from typer.testing import CliRunner

    from cli.main import app

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and broker.__version__ in out.output


def test_a_ctrl_c_while_kq_loads_ends_quietly(monkeypatch, capsys):
    """(A second of imports: a Ctrl-C then printed an import traceback.)"""
    import builtins

    import pytest

    from cli import entry

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "cli.main":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as stopped:
        entry.run()
    assert stopped.value.code == 1 and capsys.readouterr().err == "Aborted.\n"
