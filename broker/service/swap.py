"""The pager across a clean stop: kept, so that a restart need not page every queue out again.

Loading a deep queue at start is mostly paging it out into the pager (RocksDB writes, two or
three keys per message, and their compaction). At a clean stop the service pages out the
windows too, so that the pager holds every available message, and leaves a marker saying which
state that is: the store's place in the journal, each paging queue's ranking and the layout of
the pager's keys (broker.state.pager).
The next start uses the pager as it is only when its store and its queues are still those;
anything else (a crash, a store rebuilt from a snapshot, a queue added, removed or ranked
differently, a queue whose restore does not page records out as stored) rebuilds it.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.engine.engine import Engine
from broker.state.pager import LAYOUT, RocksPager

log = logging.getLogger("kq.swap")


def _marker(engine: Engine, meta: dict[str, Any]) -> dict[str, Any] | None:
    """What a kept pager must say for this engine and store (None: none can serve it)."""
    queues = {}
    for name, q in engine.queues.items():
        if q.pager is None:
            continue
        if not q.restores_raw:
            return None
        queues[name] = {"ranked": q.ranked}
    return {"offset": meta["offset"], "batch": meta["batch"], "queues": queues,
            "layout": LAYOUT}


def _state(marker: dict[str, Any]) -> tuple[Any, Any, dict[str, Any], Any]:
    """What of a marker must match: the store's journal place, each queue's ranking, the
    layout of the pager's keys."""
    return (marker.get("offset"), marker.get("batch"),
            {q: v.get("ranked") for q, v in marker.get("queues", {}).items()},
            marker.get("layout"))


def use_kept_pager(engine: Engine, meta: dict[str, Any]) -> bool:
    """At start, before the engine is loaded: whether its pager is the one a clean stop
    left for this store and these queues. When it is not, it is emptied."""
    pager = engine.pager
    if not isinstance(pager, RocksPager) or pager.kept is None:
        return False
    expected = _marker(engine, meta)
    if expected is not None and _state(pager.kept) == _state(expected):
        log.info("the pager kept at the last stop holds the queues' available messages: "
                 "used as it is")
        return True
    log.info("the pager kept at the last stop is not this state's: paging out anew")
    pager.discard()
    return False


def keep_pager(engine: Engine, meta: dict[str, Any]) -> None:
    """At a clean stop, the store written for the last time (`meta` its journal place):
    page out every queue's window and leave the pager's marker."""
    pager, marker = engine.pager, _marker(engine, meta)
    if not isinstance(pager, RocksPager) or marker is None:
        return
    try:
        for name in marker["queues"]:
            engine.queues[name].page_out_window()
        pager.keep(marker)
    except Exception as exc:  # the stop goes on: without a marker the next start rebuilds
        log.warning("could not keep the pager for the next start: %s", exc)
