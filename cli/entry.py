"""The `kq` executable: the Typer app, imported here so that a Ctrl-C while Python loads
it (about a second) ends quietly, as one later does, rather than with an import traceback."""

from __future__ import annotations

import sys


def run() -> None:
    try:
        from cli.main import app
    except KeyboardInterrupt:
        sys.stderr.write("Aborted.\n")
        sys.exit(1)
    app()
