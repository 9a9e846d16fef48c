"""The hot modules run the way the build says: compiled in `make test`'s compiled tier
(KQ_EXPECT_COMPILED=1), as Python everywhere else. A build left behind in the source tree
would hide later edits of the source, so the Python run checks that none is there."""

from __future__ import annotations

import os

from broker import compiled

EXPECT_COMPILED = os.environ.get("KQ_EXPECT_COMPILED") == "1"


def test_every_hot_module_runs_the_way_the_build_says():
    modules = compiled.compiled_modules()
    assert "broker.engine.engine" in modules and "broker.state.pager" in modules
    wrong = [name for name, is_compiled in modules.items() if is_compiled != EXPECT_COMPILED]
    assert not wrong, f"expected {'compiled' if EXPECT_COMPILED else 'Python'}: {wrong}"


def test_the_log_line_says_how_kq_runs():
    expected = "compiled with mypyc" if EXPECT_COMPILED else "runs as Python"
    assert expected in compiled.describe()
