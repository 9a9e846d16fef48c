"""kq expressions (SPEC section 11): parsed with lark, compiled once to a Python closure."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lark import Lark
from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from broker.errors import ExpressionError
from broker.expr.compiler import Compiler, Doc, Fn, as_number
from broker.expr.grammar import GRAMMAR

__all__ = ["Doc", "Expression", "compile_expression"]


@lru_cache(maxsize=1)
def _parser() -> Lark:
    """Built at the first expression (a tenth of a second): a `kq` command with none to
    parse does not pay for it."""
    return Lark(GRAMMAR, parser="lalr", maybe_placeholders=True)


@dataclass(frozen=True)
class Expression:
    text: str
    _fn: Fn = field(repr=False, compare=False)
    # Whether it reads the clock (NOW()): its value on a message may change as time passes,
    # so a result cannot be kept.
    uses_time: bool = field(default=False, compare=False)

    def evaluate(self, doc: Doc) -> Any:
        """The value: a JSON value, or None for NULL."""
        return self._fn(doc)

    def matches(self, doc: Doc) -> bool:
        """As a filter: true only when the expression is TRUE (NULL does not match)."""
        return self._fn(doc) is True

    def number(self, doc: Doc) -> float | None:
        """As a priority or sort key: the numeric value (a string that reads as a number
        counts as one), or None (lowest) when it is not a number."""
        v = as_number(self._fn(doc))
        return None if v is None else float(v)


@lru_cache(maxsize=1024)
def compile_expression(text: str) -> Expression:
    """Parse and compile; raise ExpressionError showing where the text goes wrong."""
    try:
        tree = _parser().parse(text)
        fn = Compiler().transform(tree)
    except UnexpectedInput as exc:
        at_end = isinstance(exc, UnexpectedEOF) or (
            isinstance(exc, UnexpectedToken) and exc.token.type == "$END")
        column = len(text) + 1 if at_end else (getattr(exc, "column", 0) or len(text) + 1)
        pointer = " " * (column - 1) + "^"
        word = text.strip().split(" ")[0].split("=")[0]
        hint = (f"\n  (a field's path starts with '/': /{word}, not {word})"
                if word.isidentifier() and column <= len(text) - len(text.lstrip()) + len(word)
                else "")
        raise ExpressionError(f"bad expression at column {column}: {text!r}\n  {text}\n  "
                              f"{pointer}{hint}") from None
    except VisitError as exc:
        raise ExpressionError(f"bad expression {text!r}: {exc.orig_exc}") from None
    uses_time = any(t.data == "call" and str(t.children[0]).upper() == "NOW"
                    for t in tree.iter_subtrees())
    return Expression(text, fn, uses_time)
