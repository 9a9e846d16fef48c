"""kill -9 at random moments under load (ops/soak.py, run smaller than the soak's 100,000
messages and 50 kills, to keep the suite short)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))

import soak  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_30k_messages_12_random_kills_every_message_accounted_for(bootstrap, tmp_path, capsys):
    report = soak.run(bootstrap, messages=30_000, kills=12, tmp=tmp_path, seed=20261122)
    with capsys.disabled():
        print("\n" + "\n".join(f"  soak: {line}" for line in report.lines()))
    assert report.problems == []
    assert report.kills == 12
    assert report.published == 30_000
    assert report.acked + sum(report.removed.values()) == 30_000
    # every removal was copied to the dead-letter topic (duplicates allowed, never fewer)
    assert report.dead_letter_records >= sum(report.removed.values())
    assert report.redeliveries > 0  # the cancelling and lapsing subscribers did their part
