"""Compiling a parsed expression into nested Python closures, once.

Values are JSON values; NULL is None. Logic is three-valued as in SQL: a comparison with NULL
is NULL, which never matches a filter; AND/OR/NOT follow the SQL truth tables.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Token, Transformer

Value = Any


@dataclass(frozen=True, slots=True)
class Doc:
    """What an expression sees of one message."""

    data: Any  # the decoded payload (a dict for JSON objects), or None
    headers: Mapping[str, bytes | None]
    now_ms: int = 0


Fn = Callable[[Doc], Value]


def _is_number(v: Value) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# What "reads as a number" means: a plain decimal, as a producer writes one into a header.
# Not Python's float(): that also takes "nan", "inf" and "1_000".
_NUMERIC = re.compile(r"\s*[+-]?(?:\d+(?P<frac>\.\d*)?|(?P<dot>\.\d+))(?P<exp>[eE][+-]?\d+)?\s*",
                      re.ASCII)


def as_number(v: Value) -> int | float | None:
    """A number, or a string that reads as one, as that number; anything else None.

    Every header value is a string, so `header('prio') * 1` and a priority or sort key of
    `header('prio')` need this to mean what their writer meant.
    """
    if _is_number(v):
        return v  # type: ignore[no-any-return]
    if isinstance(v, str) and (m := _NUMERIC.fullmatch(v)) is not None:
        return float(v) if m["frac"] or m["dot"] or m["exp"] else int(v)
    return None


def _comparable(a: Value, b: Value) -> tuple[Value, Value] | None:
    """Both sides as values of one kind, or None when they cannot be compared."""
    if a is None or b is None:
        return None
    if _is_number(a) or _is_number(b):
        x, y = as_number(a), as_number(b)
        return None if x is None or y is None else (x, y)
    if type(a) is type(b):
        return a, b
    return None


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<>": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


def _arith(op: str, a: Value, b: Value) -> Value:
    a, b = as_number(a), as_number(b)
    if a is None or b is None:
        return None
    if op in "/%" and b == 0:
        return None
    result = {"+": operator.add, "-": operator.sub, "*": operator.mul,
              "/": operator.truediv, "%": operator.mod}[op](a, b)
    return result


def _and(values: list[Value]) -> Value:
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def _or(values: list[Value]) -> Value:
    if any(v is True for v in values):
        return True
    return None if any(v is None for v in values) else False


def _not(v: Value) -> Value:
    return None if v is None else not v


def _truth(v: Value) -> Value:
    """A value used as a condition: booleans as they are, anything else NULL."""
    return v if isinstance(v, bool) else None


def _round(x: Value, digits: Value = 0) -> Value:
    x, digits = as_number(x), as_number(digits)
    if x is None or digits is None:
        return None
    return round(x, int(digits)) if digits else float(math.floor(x + 0.5))


_FUNCTIONS: dict[str, Callable[..., Value]] = {
    "UPPER": lambda s: s.upper() if isinstance(s, str) else None,
    "LOWER": lambda s: s.lower() if isinstance(s, str) else None,
    "LENGTH": lambda s: len(s) if isinstance(s, str | list) else None,
    "COALESCE": lambda *vs: next((v for v in vs if v is not None), None),
    "ABS": lambda x: None if (n := as_number(x)) is None else abs(n),
    "ROUND": _round,
}


# how many arguments each function takes (None: any number from the least)
_ARITY: dict[str, tuple[int, int | None]] = {
    "UPPER": (1, 1), "LOWER": (1, 1), "LENGTH": (1, 1), "COALESCE": (1, None), "ABS": (1, 1),
    "ROUND": (1, 2), "NOW": (0, 0)}


def _check_arity(name: str, given: int) -> None:
    """Refused when compiled: a call with the wrong number of arguments would otherwise fail
    on the first message it reads, inside the service."""
    least, most = _ARITY[name]
    if given < least or (most is not None and given > most):
        wanted = (f"{least}" if least == most else f"{least} or more" if most is None
                  else f"{least} to {most}")
        raise ValueError(f"{name} takes {wanted} argument(s), not {given}")


class Compiler(Transformer):  # type: ignore[type-arg]
    """Turns the parse tree into one closure `Doc -> value`."""

    def number(self, items: list[Token]) -> Fn:
        text = str(items[0])
        value = float(text) if any(c in text for c in ".eE") else int(text)
        return lambda doc: value

    def string(self, items: list[Token]) -> Fn:
        value = str(items[0])[1:-1].replace("''", "'")
        return lambda doc: value

    def true(self, items: list[Any]) -> Fn:
        return lambda doc: True

    def false(self, items: list[Any]) -> Fn:
        return lambda doc: False

    def null(self, items: list[Any]) -> Fn:
        return lambda doc: None

    def path(self, items: list[Token]) -> Fn:
        keys = str(items[0]).split("/")[1:]

        def get(doc: Doc) -> Value:
            node = doc.data
            for key in keys:
                if not isinstance(node, dict):
                    return None
                node = node.get(key)
            return node
        return get

    def header(self, items: list[Token]) -> Fn:
        name = str(items[0])[1:-1].replace("''", "'")

        def get(doc: Doc) -> Value:
            raw = doc.headers.get(name)
            if raw is None:
                return None
            return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return get

    def call(self, items: list[Any]) -> Fn:
        name = str(items[0]).upper()
        args = [a for a in items[1:] if a is not None]
        _check_arity(name, len(args))
        if name == "NOW":
            return lambda doc: doc.now_ms / 1000.0
        fn = _FUNCTIONS[name]
        return lambda doc: fn(*(a(doc) for a in args))

    def neg(self, items: list[Fn]) -> Fn:
        (inner,) = items
        return lambda doc: _arith("-", 0, inner(doc))

    def arith(self, items: list[Any]) -> Fn:
        if len(items) == 1:  # a lone operand: the grammar still names it
            return items[0]  # type: ignore[no-any-return]
        first, rest = items[0], [(str(items[i]), items[i + 1]) for i in range(1, len(items), 2)]

        def run(doc: Doc) -> Value:
            value = first(doc)
            for op, fn in rest:
                value = _arith(op, value, fn(doc))
            return value
        return run

    def compare(self, items: list[Any]) -> Fn:
        left, op, right = items[0], _COMPARE[str(items[1])], items[2]

        def run(doc: Doc) -> Value:
            pair = _comparable(left(doc), right(doc))
            if pair is None:
                return False  # with NULL, or values of kinds that do not compare
            try:
                return op(*pair)
            except TypeError:
                return False
        return run

    def like(self, items: list[Fn]) -> Fn:
        value, pattern = items
        cache: dict[str, re.Pattern[str] | None] = {}

        def run(doc: Doc) -> Value:
            v, p = value(doc), pattern(doc)
            if not isinstance(v, str) or not isinstance(p, str):
                return False
            if p not in cache:
                try:
                    cache[p] = re.compile(p)
                except (re.error, OverflowError, RecursionError):  # a pattern Python refuses
                    cache[p] = None
            rx = cache[p]
            return rx is not None and rx.search(v) is not None
        return run

    def not_like(self, items: list[Fn]) -> Fn:
        inner = self.like(items)
        return lambda doc: _not(inner(doc))

    def in_(self, items: list[Fn]) -> Fn:
        value, options = items[0], items[1:]

        def run(doc: Doc) -> Value:
            v = value(doc)
            return any((pair := _comparable(v, o(doc))) is not None and pair[0] == pair[1]
                       for o in options)
        return run

    def not_in(self, items: list[Fn]) -> Fn:
        inner = self.in_(items)
        return lambda doc: _not(inner(doc))

    def between(self, items: list[Fn]) -> Fn:
        value, low, high = items
        ge, le = self.compare([value, Token("COMPARE", ">="), low]), \
            self.compare([value, Token("COMPARE", "<="), high])
        return lambda doc: _and([ge(doc), le(doc)])

    def not_between(self, items: list[Fn]) -> Fn:
        inner = self.between(items)
        return lambda doc: _not(inner(doc))

    def is_null(self, items: list[Fn]) -> Fn:
        (inner,) = items
        return lambda doc: inner(doc) is None

    def is_not_null(self, items: list[Fn]) -> Fn:
        (inner,) = items
        return lambda doc: inner(doc) is not None

    def and_(self, items: list[Fn]) -> Fn:
        if len(items) == 1:
            return items[0]
        return lambda doc: _and([_truth(f(doc)) for f in items])

    def or_(self, items: list[Fn]) -> Fn:
        if len(items) == 1:
            return items[0]
        return lambda doc: _or([_truth(f(doc)) for f in items])

    def not_(self, items: list[Fn]) -> Fn:
        (inner,) = items
        return lambda doc: _not(_truth(inner(doc)))
