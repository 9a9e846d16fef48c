"""Tables for people, readable in an 80-column terminal.

Short headers, numbers on the right, and the columns that name things (queues, bookmarks,
clients) never cut. Columns marked optional are shown only when the terminal has room for
them; they are dropped in the order given until the table fits. `--json` shows everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

SHORT = 12  # a column no wider than this is shown whole


@dataclass(frozen=True)
class Col:
    header: str
    number: bool = False  # right-aligned
    key: bool = False  # names a thing: shown whole, never cut
    drop: int = 0  # optional: dropped when there is no room, lowest first (0: always shown)


def render(console: Console, columns: Sequence[Col], rows: Sequence[Sequence[str]],
           title: str | None = None) -> None:
    """Print `rows` under `columns`, leaving out optional columns the terminal cannot fit."""
    shown = list(range(len(columns)))
    droppable = sorted((c.drop, i) for i, c in enumerate(columns) if c.drop)
    while True:
        table = _table(columns, rows, shown, title)
        if not droppable or _natural_width(console, table) <= console.width:
            break
        shown.remove(droppable.pop(0)[1])
    console.print(table)


def _natural_width(console: Console, table: Table) -> int:
    """How wide the table is when nothing is cut (rich measures within the console's width
    unless told otherwise)."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def _table(columns: Sequence[Col], rows: Sequence[Sequence[str]], shown: list[int],
           title: str | None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title=title,
                  title_justify="left")
    for i in shown:
        c = columns[i]
        natural = max([len(c.header), *(len(r[i]) for r in rows)])
        # names are never cut, and short columns (kinds, counts) never squeezed to nothing:
        # rich takes the room it lacks from the long free-text ones
        short = natural <= SHORT
        table.add_column(c.header, justify="right" if c.number else "left",
                         no_wrap=c.key or short, min_width=natural if c.key or short else None)
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table
