"""MkDocs hook: the configuration and command-line references are generated at build time
from the config model and the Typer app (cli/reference.py), where the pages say so."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cli.reference import cli_reference, config_reference  # noqa: E402

GENERATED = {"<!-- generated: configuration -->": config_reference,
             "<!-- generated: cli -->": cli_reference}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, generate in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
