"""Compile kq's hot modules with mypyc, in place (`make compile`), or remove the build
(`--clean`, `make pure`). The modules are listed in `broker.compiled`.

    python ops/compile.py [--clean | --test]

`--test` builds, runs the unit suite and the clients' end-to-end tests (embedded broker) on
the compiled modules (KQ_EXPECT_COMPILED=1: a test checks they really loaded), and removes the
build again: `make test`'s compiled tier.

Needs a C compiler and Python's headers. Where either is missing it says so and builds
nothing (exit 0), unless KQ_REQUIRE_COMPILED=1 (CI) makes that a failure (exit 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from broker.compiled import ROOT, SOURCES, compiled_modules, describe

BUILD = ROOT / "build" / "mypyc"  # the generated C and objects, removed with the build


def why_not() -> str | None:
    """Why no build can be made here, or None."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} not found; install gcc)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h; on Debian: apt install python3-dev)"
    return None


def built() -> list[Path]:
    """The extension modules a build left in the source tree."""
    found: list[Path] = []
    for source in SOURCES:
        path = ROOT / source
        folder = path if path.is_dir() else path.parent
        found += [f for f in folder.iterdir() if f.name.endswith(tuple(EXTENSION_SUFFIXES))
                  and (path.is_dir() or f.name.split(".")[0] == path.stem)]
    # mypyc's shared runtime, one per build, beside the package
    return found + [f for f in ROOT.glob("*__mypyc*") if f.is_file()]


def clean() -> None:
    for f in built():
        f.unlink()
    shutil.rmtree(BUILD, ignore_errors=True)


def build() -> None:
    from mypyc.build import mypycify  # the test extra brings mypy (mypyc) and setuptools
    from setuptools import Distribution

    os.chdir(ROOT)  # mypyc names modules from paths, and reads [tool.mypy] from here
    # multi_file: C files the compiler can build side by side (build_ext's parallel)
    extensions = mypycify(SOURCES, opt_level="3", multi_file=True, target_dir=str(BUILD))
    # a Distribution, not setup(): setup() would read pyproject.toml, which hatch builds
    dist = Distribution({"name": "kq-compiled", "ext_modules": extensions})
    command = dist.get_command_obj("build_ext")
    command.inplace = True  # type: ignore[attr-defined]
    command.build_temp = str(BUILD / "temp")  # type: ignore[attr-defined]
    command.build_lib = str(BUILD / "lib")  # type: ignore[attr-defined]
    command.parallel = os.cpu_count() or 1  # type: ignore[attr-defined]
    dist.run_command("build_ext")


# The compiled tier: every unit test, and the clients and the service end to end (on the
# embedded broker), where a compiled class meets the code that subclasses or wraps it
COMPILED_TIER = ["tests/unit", "tests/integration/test_worker_api.py",
                 "tests/integration/test_leases.py"]


def test_compiled() -> int:
    """The compiled tier's tests on the compiled modules."""
    env = {**os.environ, "KQ_EXPECT_COMPILED": "1", "KQ_TEST_BROKERS": "embedded"}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", "3", *COMPILED_TIER],
                           cwd=ROOT, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--clean", action="store_true", help="remove the build")
    what.add_argument("--test", action="store_true",
                      help="build, run the compiled tier's tests on the build, remove it")
    args = parser.parse_args()
    clean()
    if args.clean:
        print("compile: removed the build; kq runs as Python")
        return 0
    why = why_not()
    if why:
        print(f"compile: {why}: kq runs as Python"
              + (" (the compiled tier did not run)" if args.test else ""), file=sys.stderr)
        return 1 if os.environ.get("KQ_REQUIRE_COMPILED") == "1" else 0
    started = time.monotonic()
    build()
    print(f"compile: {describe()} ({time.monotonic() - started:.0f} s)", flush=True)
    if not all(compiled_modules().values()):
        return 1
    if not args.test:
        return 0
    try:
        return test_compiled()
    finally:
        clean()


if __name__ == "__main__":
    sys.exit(main())
