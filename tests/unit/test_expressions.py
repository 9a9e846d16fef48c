"""The expression language (SPEC section 11): operators, NULL, paths, headers, errors."""

import pytest

from broker.errors import ExpressionError
from broker.expr import Doc, compile_expression

ORDER = Doc(
    data={"sym": "IBM", "px": 10.5, "qty": 3, "side": "buy", "tags": ["a", "b"],
          "client": {"id": 7, "tier": "gold", "name": "O'Brien"}, "note": None, "ok": True},
    headers={"region": b"EU", "kq-priority": b"7", "empty": None, "prio": b"5",
             "ratio": b" 2.5 ", "big": b"1e3", "word": b"high", "odd": b"nan"},
    now_ms=1_700_000_000_000,
)

TABLE = [
    # comparisons
    ("/sym = 'IBM'", True), ("/sym != 'IBM'", False), ("/sym <> 'MSFT'", True),
    ("/px > 10", True), ("/px >= 10.5", True), ("/px < 10.5", False), ("/qty <= 3", True),
    ("/qty = 3.0", True), ("/qty = '3'", True), ("/sym > 'ABC'", True),
    ("/sym = 3", False), ("/ok = true", True), ("/ok = false", False),
    # arithmetic
    ("/px * /qty", 31.5), ("/qty + 1", 4), ("/qty - 5", -2), ("/qty / 2", 1.5),
    ("/qty % 2", 1), ("/qty / 0", None), ("-/qty", -3), ("/sym + 1", None),
    ("(/qty + 1) * 2", 8), ("/qty + 1 * 2", 5),
    # logic, with SQL's three values
    ("/sym = 'IBM' AND /qty = 3", True), ("/sym = 'IBM' AND /qty = 4", False),
    ("/sym = 'X' OR /qty = 3", True), ("NOT /sym = 'IBM'", False),
    ("/missing = 1", False), ("NOT /missing = 1", True), ("/missing = 1 OR /qty = 3", True),
    ("/missing = 1 AND /qty = 4", False), ("/missing = 1 AND /qty = 3", False),
    ("/ok", True), ("not /ok", False),
    # LIKE (a regular expression), IN, BETWEEN, IS NULL
    ("/sym LIKE '^I.M$'", True), ("/sym LIKE 'X'", False), ("/sym NOT LIKE 'X'", True),
    ("/missing LIKE 'X'", False), ("/sym IN ('MSFT', 'IBM')", True),
    ("/sym IN ('MSFT')", False), ("/sym NOT IN ('MSFT')", True), ("/qty IN (1, 2, 3)", True),
    ("/missing IN (1)", False), ("/px BETWEEN 10 AND 11", True),
    ("/px BETWEEN 11 AND 12", False), ("/px NOT BETWEEN 11 AND 12", True),
    ("/note IS NULL", True), ("/missing IS NULL", True), ("/sym IS NOT NULL", True),
    ("/sym IS NULL", False),
    # nested paths, headers
    ("/client/tier = 'gold'", True), ("/client/id * 2", 14), ("/client/none/deeper", None),
    ("/sym/deeper", None), ("header('region') = 'EU'", True), ("header('nope') IS NULL", True),
    ("header('empty') IS NULL", True), ("header('kq-priority') > 5", True),
    # a string that reads as a number is that number (every header value is a string)
    ("header('prio') * 1", 5), ("header('prio') + header('kq-priority')", 12),
    ("header('ratio') * 2", 5.0), ("-header('prio')", -5), ("header('big') / 10", 100.0),
    ("ABS(-header('prio'))", 5), ("ROUND(header('ratio'))", 3.0),
    ("header('word') * 1", None), ("header('odd') * 1", None), ("header('odd') > 1", False),
    ("header('prio') = '5'", True), ("header('prio') = 5.0", True), ("'10' > '9'", False),
    # functions
    ("UPPER(/side)", "BUY"), ("LOWER(/sym)", "ibm"), ("LENGTH(/sym)", 3),
    ("LENGTH(/tags)", 2), ("LENGTH(/qty)", None), ("COALESCE(/missing, /note, 'x')", "x"),
    ("ABS(-/px)", 10.5), ("ROUND(/px)", 11.0), ("ROUND(10.25, 1)", 10.2),
    ("NOW() > 1600000000", True), ("upper(/sym) = 'IBM'", True),
    # literals
    ("'it''s'", "it's"), ("/client/name = 'O''Brien'", True), ("NULL", None),
    ("1.5e2", 150.0), ("TRUE AND true", True),
]


@pytest.mark.parametrize(("text", "expected"), TABLE, ids=[t for t, _ in TABLE])
def test_expression_table(text, expected):
    assert compile_expression(text).evaluate(ORDER) == expected


def test_the_table_is_large():
    assert len(TABLE) >= 40


@pytest.mark.parametrize(("text", "column"), [
    ("/a = ", 6), ("/sym = 'x", 8), ("(/a = 1", 8), ("FOO(1)", 1), ("/a === 1", 5),
    ("/a BETWEEN 1", 13), ("", 1),
])
def test_bad_expressions_report_their_position(text, column):
    with pytest.raises(ExpressionError) as exc:
        compile_expression(text)
    assert f"column {column}" in str(exc.value)


@pytest.mark.parametrize(("text", "words"), [
    ("LENGTH() = 1", "LENGTH takes 1 argument(s), not 0"),
    ("LENGTH(/a, /b) = 1", "LENGTH takes 1 argument(s), not 2"),
    ("ABS() = 1", "ABS takes 1 argument(s), not 0"),
    ("ROUND(/qty, 1, 2)", "ROUND takes 1 to 2 argument(s), not 3"),
    ("NOW(1) > 0", "NOW takes 0 argument(s), not 1"),
    ("COALESCE() = 1", "COALESCE takes 1 or more argument(s), not 0"),
])
def test_a_call_with_the_wrong_number_of_arguments_is_refused_when_compiled(text, words):
    # not when the first message is read: in a filter or a priority that would be inside
    # kq serve, at every restart
    with pytest.raises(ExpressionError, match=words.replace("(", r"\(").replace(")", r"\)")):
        compile_expression(text)


def test_a_like_pattern_python_refuses_matches_nothing_instead_of_raising():
    assert compile_expression("/sym LIKE 'a{99999999999}'").evaluate(ORDER) is False
    assert compile_expression("/sym LIKE '('").evaluate(ORDER) is False


def test_filters_match_only_true_and_priorities_are_numbers_or_none():
    assert compile_expression("/qty = 3").matches(ORDER) is True
    assert compile_expression("/missing = 3").matches(ORDER) is False
    assert compile_expression("/px").number(ORDER) == 10.5
    assert compile_expression("/sym").number(ORDER) is None
    assert compile_expression("/ok").number(ORDER) is None  # booleans are not numbers
    # header-driven priorities: the header's text is the number it reads as
    assert compile_expression("header('prio')").number(ORDER) == 5.0
    assert compile_expression("header('kq-priority') * 1").number(ORDER) == 7.0
    assert compile_expression("header('word')").number(ORDER) is None
    assert compile_expression("'1_000'").number(ORDER) is None  # not a plain decimal


def test_a_payload_without_data_gives_null_paths_and_false_comparisons():
    nothing = Doc(data=None, headers={})
    assert compile_expression("/a").evaluate(nothing) is None
    assert compile_expression("/a = 1").evaluate(nothing) is False
    assert compile_expression("/a IS NULL").evaluate(nothing) is True


def test_compiled_once():
    assert compile_expression("/a = 1") is compile_expression("/a = 1")


def test_an_expression_says_whether_it_reads_the_clock():
    assert compile_expression("/deadline < NOW()").uses_time
    assert compile_expression("ABS(now() - /t) > 5").uses_time
    assert not compile_expression("/sym = 'NOW'").uses_time


def test_a_path_written_without_its_slash_is_pointed_out():
    with pytest.raises(ExpressionError, match="path starts with '/': /sym, not sym"):
        compile_expression("sym = 'IBM'")
