"""What a user installs: the distribution kafka-queues, typed, licensed, versioned."""

import tomllib
from pathlib import Path

import broker

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_kafka_queues_with_its_license_and_typing_marker():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "kafka-queues"  # `kq` on PyPI is another project
    assert project["scripts"] == {"kq": "cli.main:app"}
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert project["license"] == "Apache-2.0"
    assert (ROOT / "broker" / "py.typed").exists()
    assert {"spark", "test", "docs"} <= set(project["optional-dependencies"])


def test_the_version_is_one_number_everywhere():
    from typer.testing import CliRunner

    from cli.main import app

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and broker.__version__ in out.output
