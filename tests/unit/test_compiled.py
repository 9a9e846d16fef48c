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


def test_the_clients_classes_build_on_the_cores():
    """The sync and async clients subclass classes of compiled modules (a compiled class
    refuses interpreted subclasses unless it allows them): each is made here as a client
    makes it."""
    from broker.client.aio import AsyncMessage, AsyncSubscription
    from broker.client.core import ClientCore
    from broker.client.sync import Subscription

    for kind in (Subscription, AsyncSubscription):
        sub = kind(object(), "Q", "s1")  # type: ignore[arg-type]
        assert (sub.queue, sub.sub_id, sub.mode) == ("Q", "s1", "queue")
    core = ClientCore("w", "", message=AsyncMessage)
    msg = core.message(queue="Q", bookmark="T/0/1", value=b"{}", key=None, headers=[],
                       delivery_count=1, lease_deadline=None, is_barrier=False, timestamp=0.0,
                       _client=None)
    assert isinstance(msg, AsyncMessage) and msg.data == {}
