"""The modules `make compile` builds with mypyc: where `kq serve` spends its CPU per message
(the queue engine, the state's encoding and paging, the commands, journal and envelope
encodings, what the service reads of each record and for which queues). Their Python source
stays the source of truth: without a build, or after `make pure`, the same modules run as
Python, with the same behaviour.

A compiled module is a C extension beside its source (`broker/engine/queue.cpython-311-...so`
beside `queue.py`), which Python imports first; a build left behind would therefore hide
later edits of the source. `make test` removes it before the suite and after its compiled
tier, and `kq serve` logs at start which way it runs.
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Paths from the project's root, as mypyc takes them: a directory stands for its modules
SOURCES = [
    "broker/engine",
    "broker/state",
    "broker/values.py",
    "broker/avro_binary.py",
    "broker/packed.py",
    "broker/kafka/records.py",
    "broker/service/coalesce.py",
    "broker/service/commands.py",
    "broker/service/commit.py",
    "broker/service/crash_points.py",
    "broker/service/envelopes.py",
    "broker/service/inputs.py",
    "broker/service/columns.py",
    "broker/service/journal.py",
    "broker/service/routing.py",
    "broker/service/sending.py",
    "broker/service/service.py",
    "broker/client/acks.py",
    "broker/client/core.py",
    "broker/client/message.py",
]


def module_names() -> list[str]:
    """Every module of SOURCES, dotted."""
    names: list[str] = []
    for source in SOURCES:
        path = ROOT / source
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        names += [".".join(f.relative_to(ROOT).with_suffix("").parts) for f in files]
    return names


def is_compiled(module: str) -> bool:
    return str(getattr(importlib.import_module(module), "__file__", "")).endswith(
        tuple(EXTENSION_SUFFIXES))


def compiled_modules() -> dict[str, bool]:
    """Which of the modules run compiled, here and now."""
    return {name: is_compiled(name) for name in module_names()}


def describe() -> str:
    """One line for the log: how `kq serve` runs its hot modules."""
    modules = compiled_modules()
    done = sum(modules.values())
    if done == 0:
        return "kq runs as Python (`make compile` builds its hot modules with mypyc)"
    if done == len(modules):
        return f"kq runs its {done} hot modules compiled with mypyc"
    missing = ", ".join(name for name, ok in modules.items() if not ok)
    return f"kq runs {done} of {len(modules)} hot modules compiled with mypyc (not: {missing})"
