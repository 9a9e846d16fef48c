"""How a queue orders its available messages: the first part of what makes a queue type.

Each message gets a rank when it arrives (journaled as the transition's `priority`, so a
replay orders it the same way): a number, highest first, or None, after every number; equal
ranks go oldest first. `Message.order` and the pager's keys sort by it.

  ByArrival   no rank: oldest first (the AMPS default)
  ByPriority  the `priority` expression's value (AMPS Priority)
  BySortKey   `sort_key`: a Qpid sorted queue, ascending: numbers (and strings that read
              as numbers, as every header value is a string) before other strings, numbers
              numerically, strings by code point; NULL first, or last with
              `missing_sort_key = "last"`. Its rank is the key itself (journaled as the
              priority when a number, as `sort_text` when a string).
  ByLevels    `priority_levels`: a Qpid priority queue. A priority 0..9, from the
              `priority` expression or else the `kq-priority` header (4 when absent or not
              a digit, as JMS), collapsed onto N levels by the AMQP 0-10 rule Qpid follows:
              with N levels the lowest one takes 0..(5 - ceil(N/2)), each priority above
              that has a level of its own, and the top level takes what is left (N=2: 0-4
              and 5-9; N=10: one level per priority).

"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Protocol

from broker.config import QueueConfig
from broker.expr import Doc, Expression, compile_expression
from broker.expr.compiler import as_number

PRIORITY_HEADER: Final = "kq-priority"
JMS_DEFAULT_PRIORITY: Final = 4

Headers = Mapping[str, bytes | None]


class Ordering(Protocol):
    # whether `rank` reads the payload (the service then decodes it on arrival; the
    # headers reach the engine either way, even when the payload does not parse)
    needs_doc: bool

    def rank(self, doc: Doc | None, headers: Headers) -> float | str | None: ...


class ByArrival:
    needs_doc = False

    def rank(self, doc: Doc | None, headers: Headers) -> float | None:
        return None


class ByPriority:
    needs_doc = True

    def __init__(self, expression: Expression) -> None:
        self.expression = expression

    def rank(self, doc: Doc | None, headers: Headers) -> float | None:
        return self.expression.number(doc) if doc is not None else None


class ByLevels:
    def __init__(self, levels: int, expression: Expression | None) -> None:
        self.levels = levels
        self.expression = expression
        self.needs_doc = expression is not None

    def rank(self, doc: Doc | None, headers: Headers) -> float | None:
        return float(level(self.priority(doc, headers), self.levels))

    def priority(self, doc: Doc | None, headers: Headers) -> int:
        """The message's priority, 0..9."""
        if self.expression is not None:
            value = self.expression.number(doc) if doc is not None else None
            if value is None or math.isnan(value):
                return JMS_DEFAULT_PRIORITY
            return min(9, max(0, math.floor(value)))
        raw = headers.get(PRIORITY_HEADER)
        text = raw.decode("ascii", "replace").strip() if raw is not None else ""
        return int(text) if len(text) == 1 and text.isdigit() else JMS_DEFAULT_PRIORITY


def level(priority: int, levels: int) -> int:
    """Priority 0..9 -> level 0..levels-1 (highest delivered first)."""
    lowest_top = 5 - min(5, math.ceil(levels / 2))
    return 0 if priority <= lowest_top else min(priority - lowest_top, levels - 1)


# Where a sorted queue's messages stand (`Message.sort_value` is (kind, value)): kinds sort
# before values, so a number is never compared with a string.
NULL_FIRST, NUMBER, STRING, NULL_LAST = 0, 1, 2, 3


class BySortKey:
    needs_doc = True

    def __init__(self, expression: Expression, nulls_last: bool) -> None:
        self.expression = expression
        self.null = (NULL_LAST if nulls_last else NULL_FIRST, 0.0)

    def rank(self, doc: Doc | None, headers: Headers) -> float | str | None:
        value = self.expression.evaluate(doc) if doc is not None else None
        number = as_number(value)
        if number is not None:
            return None if math.isnan(number) else float(number)
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else None  # objects and lists: no key

    def sort_value(self, rank: float | str | None) -> tuple[int, float | str]:
        """The key as `Message.sort_value`, from the rank journaled for it."""
        if rank is None:
            return self.null
        return (STRING, rank) if isinstance(rank, str) else (NUMBER, rank)


def ordering_of(config: QueueConfig) -> Ordering:
    if config.sort_key:
        return BySortKey(compile_expression(config.sort_key), config.missing_sort_key == "last")
    expression = compile_expression(config.priority) if config.priority else None
    if config.priority_levels is not None:
        return ByLevels(config.priority_levels, expression)
    if expression is not None:
        return ByPriority(expression)
    return ByArrival()
