"""The CLI's answers to a machine that lacks something: one line saying what to install."""

import pytest
import typer

from cli.common import errors_to_exit_codes


def test_a_spark_command_without_pyspark_says_which_extra_to_install(capsys):
    with pytest.raises(typer.Exit) as ended, errors_to_exit_codes():
        raise ModuleNotFoundError("No module named 'pyspark'", name="pyspark")
    assert ended.value.exit_code == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "pip install 'kafka-queues[spark]'" in said and "pyspark" in said


def test_other_missing_modules_are_not_hidden():
    with pytest.raises(ModuleNotFoundError), errors_to_exit_codes():
        raise ModuleNotFoundError("No module named 'nothing_like_it'", name="nothing_like_it")
