"""The replaced string functions (``sqlite_work``): the same answers as SQLite's own, to
the byte, and their quadratic work charged to the step budget, so one call cannot hold a
worker for minutes (issue 48)."""

from __future__ import annotations

import random
import sqlite3
import threading

import pytest

from txsync.worker.sqlite_work import CostedFunctions, StepBudget, WorkOverrun

ALPHABET = "aAbBzZ%_*?[]^-\\é Äß0\n"


def _text(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, most)))


def _value(rng: random.Random) -> object:
    kind = rng.random()
    if kind < 0.8:
        return _text(rng, 8)
    if kind < 0.88:
        return _text(rng, 4).encode()
    if kind < 0.94:
        return rng.choice([0, 12, -3, 1.5, 1e20])
    return None


CALLS = [
    ("like", 2), ("like", 3), ("glob", 2), ("instr", 2), ("replace", 3),
    ("trim", 2), ("ltrim", 2), ("rtrim", 2),
]  # fmt: skip


def _answer(conn: sqlite3.Connection, sql: str, args: tuple[object, ...]) -> tuple[str, object]:
    try:
        return ("ok", conn.execute(sql, args).fetchone()[0])
    except sqlite3.Error as error:
        return ("error", type(error).__name__)


def test_answers_match_sqlites_own_functions() -> None:
    rng = random.Random(48)
    plain = sqlite3.connect(":memory:")
    replaced = sqlite3.connect(":memory:")
    functions = CostedFunctions(64 * 1024 * 1024)
    functions.install(replaced)
    functions.budget = StepBudget(10**12, threading.Event())
    compared = 0
    for _ in range(30_000):
        name, arity = rng.choice(CALLS)
        args = tuple(_value(rng) for _ in range(arity))
        if name == "like" and arity == 3 and rng.random() < 0.8:
            args = (*args[:2], rng.choice("\\%_aé"))  # mostly a valid escape
        sql = f"SELECT {name}({','.join('?' * arity)})"
        expected = _answer(plain, sql, args)
        got = _answer(replaced, sql, args)
        if expected[0] == "error":  # SQLite's error; ours names it through the function
            assert got[0] == "error", (name, args, got)
        else:
            assert got == expected, (name, args)
        compared += 1
    assert compared == 30_000


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT printf('%.*c', 3000000, 'a') LIKE '%' || printf('%.*c', 8000, 'a') || 'b'",
        "SELECT printf('%.*c', 3000000, 'a') GLOB '*' || printf('%.*c', 8000, 'a') || 'b'",
        "SELECT instr(printf('%.*c', 3000000, 'a'), printf('%.*c', 8000, 'a') || 'b')",
        "SELECT replace(printf('%.*c', 3000000, 'a'), printf('%.*c', 8000, 'a') || 'b', '')",
        "SELECT trim(printf('%.*c', 3000000, 'a'), printf('%.*c', 8000, 'b'))",
    ],
)
def test_one_call_with_quadratic_work_spends_the_budget_before_it_runs(sql: str) -> None:
    """Each of these once ran for a minute or more inside one SQLite step, where the
    progress handler never runs."""
    conn = sqlite3.connect(":memory:")
    functions = CostedFunctions(64 * 1024 * 1024)
    functions.install(conn)
    budget = functions.budget = StepBudget(100_000_000, threading.Event())
    with pytest.raises(sqlite3.OperationalError, match="user-defined function raised"):
        conn.execute(sql).fetchone()
    assert budget.exceeded
    assert "3,000,000" in budget.overrun and " 8,00" in budget.overrun
    assert "(" + budget.overrun + ")" in budget.refusal("the transaction")


def test_the_charge_is_the_product_of_the_lengths_alike_everywhere() -> None:
    """The charge depends on the arguments alone, so every replica counts the same."""
    functions = CostedFunctions(1024)
    conn = sqlite3.connect(":memory:")
    functions.install(conn)
    budget = functions.budget = StepBudget(10**9, threading.Event())
    conn.execute("SELECT instr(?, ?)", ("a" * 1000, "b" * 100)).fetchone()
    assert budget.steps == 1000 * 100 // 8
    functions.budget = None  # the worker's own statements: not charged
    conn.execute("SELECT instr(?, ?)", ("a" * 1000, "b" * 100)).fetchone()
    assert budget.steps == 1000 * 100 // 8


def test_results_past_the_length_limit_fail_either_way() -> None:
    functions = CostedFunctions(1024)  # the side connection has the user's limit
    conn = sqlite3.connect(":memory:")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1024)
    functions.install(conn)
    with pytest.raises(sqlite3.DataError, match="too big"):  # answered in Python
        conn.execute("SELECT replace(?, 'a', ?)", ("a" * 100, "b" * 100)).fetchone()
    assert not functions.failure
    with pytest.raises(sqlite3.OperationalError):  # answered by SQLite on the side
        conn.execute("SELECT replace(?, 'a', ?)", ("a" * 100, b"b" * 100)).fetchone()
    assert functions.failure.startswith("replace(): string or blob too big")
    assert issubclass(WorkOverrun, Exception)
