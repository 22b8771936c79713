"""What one SQLite transaction or read may cost, counted so that every replica agrees.

**Steps.** Every transaction (and every read) has a budget of virtual-machine steps,
counted by SQLite's progress handler (``StepBudget``): a statement that never ends, or
runs for minutes, fails with an error naming the limit, and since the count depends only
on the statements, the data and the SQLite version, every replica reaches the same
verdict.

**Work inside one step** (issue 48). The progress handler runs between steps, and one
step may call a function whose work grows with the product of its arguments' lengths:
``x LIKE '%' || p || 'b'`` compares up to len(x) * len(p) characters. One such LIKE of a
3 MB string and an 8,000-character pattern ran 51 s inside a single step, holding the
worker, its health checks and every DC's next transaction; ``sqlite3_interrupt`` cannot
stop it either (SQLite checks it between steps). GLOB, ``instr``, ``replace`` and ``trim``
(with a set of characters) are alike. ``CostedFunctions`` replaces each of them on a
user connection by a wrapper that first charges the budget what SQLite's own code may do
for those lengths (``QUADRATIC_UNITS_PER_STEP``; from the arguments' lengths alone, so
every replica charges the same) and then answers with SQLite's own function, called on a
connection of its own that has no wrappers: the same answer, to the byte. Past the
budget the statement fails naming the function and the lengths.

What it costs: about 3 µs more per call of a replaced function (a Python call and a
statement on the side connection; ``make bench-apply`` is unchanged, as its
transactions call none), and SQLite no longer uses an index for ``LIKE 'abc%'`` (its
LIKE optimization wants the built-in function; it applies only to case-insensitive
indexes anyway, and ``GLOB 'abc*'``, which it serves from an ordinary index, is
replaced too).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable

SqlValue = str | bytes | int | float | None

PROGRESS_EVERY_STEPS = 10_000
"""How often the progress handler counts (and may stop) a statement."""

QUADRATIC_UNITS_PER_STEP = 8
"""Character comparisons charged as one step. Measured here: SQLite runs ~48M steps/s and
compares ~500M characters/s in LIKE's worst case (``'%' || 'a' x m || 'b'`` against
``'a' x n``: 51 s at n*m = 2.5e10), so 8 comparisons take less than one step's time."""

QUADRATIC_FUNCTIONS: dict[str, tuple[int, ...]] = {
    "like": (2, 3),
    "glob": (2,),
    "instr": (2,),
    "replace": (3,),
    "trim": (2,),
    "ltrim": (2,),
    "rtrim": (2,),
}
"""Built-ins whose work grows with the product of their first two arguments' lengths,
by name and the argument counts replaced (one-argument trims are linear)."""


class StepBudget:
    """Counts one transaction's (or read's) steps; SQLite stops the statement when
    ``__call__`` (the progress handler) answers non-zero."""

    def __init__(self, steps_max: int, stopping: threading.Event) -> None:
        self.steps_max, self.stopping = steps_max, stopping
        self.steps = 0
        self.overrun = ""
        """What a charge refused (empty: none did)."""

    def __call__(self) -> int:
        self.steps += PROGRESS_EVERY_STEPS
        return int(self.steps > self.steps_max or self.stopping.is_set())

    def overrun_by(self, name: str, first: SqlValue, second: SqlValue) -> str:
        """Record (``overrun``) that a call of ``name`` on these arguments spent the
        budget inside one step."""
        lengths = " and ".join(
            f"{len(value) if isinstance(value, str | bytes) else 32:,}" for value in (first, second)
        )
        self.overrun = f"{name}() of {lengths} characters"
        return self.overrun

    @property
    def exceeded(self) -> bool:
        return self.steps > self.steps_max

    def refusal(self, what: str) -> str:
        cause = f" ({self.overrun})" if self.overrun else ""
        return (
            f"{what} exceeded the work budget of {self.steps_max:,} SQLite steps "
            f"(worker --steps-max){cause}"
        )


class WorkOverrun(Exception):
    """Raised inside a replaced function; SQLite turns it into a statement error and the
    budget's ``refusal`` says why."""


class CostedFunctions:
    """The replacements of QUADRATIC_FUNCTIONS for one user connection, charging
    whichever budget is current (``budget``; None charges nothing: the worker's own
    statements)."""

    def __init__(self, value_bytes_max: int) -> None:
        self.budget: StepBudget | None = None
        self.failure = ""
        """Why a replaced function last failed (SQLite reports only that one raised)."""
        self._builtins = sqlite3.connect(":memory:", check_same_thread=False)
        """SQLite's own functions, under the user connection's length limit."""
        self._builtins.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_bytes_max)

    def install(self, conn: sqlite3.Connection) -> None:
        for name, arities in QUADRATIC_FUNCTIONS.items():
            for arity in arities:
                conn.create_function(name, arity, self._costed(name, arity), deterministic=True)

    def close(self) -> None:
        self._builtins.close()

    def _costed(self, name: str, arity: int) -> Callable[..., SqlValue]:
        call = f"SELECT {name}({','.join('?' * arity)})"
        execute = self._builtins.execute
        exact = _EXACT_IN_PYTHON[name]

        def costed(*args: SqlValue) -> SqlValue:
            # The hot path of every LIKE, instr() and replace() a user runs: kept flat
            # (one call of ``exact``; the charge inline), it costs ~1 us over a call.
            first, second = args[0], args[1]
            product = (len(first) if isinstance(first, str | bytes) else 32) * (
                len(second) if isinstance(second, str | bytes) else 32
            )
            budget = self.budget
            if budget is not None:
                budget.steps += product // QUADRATIC_UNITS_PER_STEP
                if budget.steps > budget.steps_max:
                    raise WorkOverrun(budget.overrun_by(name, first, second))
            if product <= PYTHON_PRODUCT_MAX:
                answer = exact(*args)
                if answer is not _UNANSWERED:
                    return answer  # type: ignore[return-value]
            try:
                answer = execute(call, args).fetchone()[0]
            except sqlite3.Error as error:
                self.failure = f"{name}(): {error}"
                raise
            return answer  # type: ignore[no-any-return]

        return costed


def _length(value: SqlValue) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    return 0 if value is None else 32  # a number as text


# --- SQLite's answers computed in Python, for text arguments ----------------------------
#
# A call answered on the side connection costs ~7 us against ~0.15 us for the built-in
# (measured: LIKE over 200k rows, 27 ms -> 1.39 s). The common cases (text arguments,
# modest lengths) are answered here instead, exactly as SQLite answers them; anything
# else (numbers, blobs, NULLs mixed in, GLOB's [...] classes, a LIKE escape that is a
# letter, long patterns) goes to SQLite itself.

PYTHON_PRODUCT_MAX = 1_000_000
"""Arguments whose lengths multiply to more are matched by SQLite's C code (Python's
regular expressions are several times slower per comparison)."""
PATTERN_CHARS_MAX = 1_000
"""Longer LIKE and GLOB patterns go to SQLite, which applies its pattern length limit."""

_UNANSWERED = object()
_ASCII_LOWER = {code: code + 32 for code in range(ord("A"), ord("Z") + 1)}


def _ascii_folded(text: str) -> str:
    """LIKE folds ASCII letters only (SQLite without ICU): 'Ä' stays 'Ä'."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


Matcher = Callable[[str], bool]


Segment = list[str | None]
"""Literal characters, and None for any one character."""


def _segments_matcher(segments: list[Segment], fold: bool) -> Matcher:
    """A LIKE or GLOB pattern split at its any-sequence wildcards into segments of fixed
    length, matched leftmost in order: for such segments that finds a match whenever one
    exists, without backtracking. Segments of literals alone are found by string search
    (the common ``'%word%'`` costs one ``find``)."""
    if all(None not in segment for segment in segments):
        parts = ["".join(segment) for segment in segments]  # type: ignore[arg-type]
        if len(parts) == 1:
            whole = parts[0]
            return lambda text: (_ascii_folded(text) if fold else text) == whole
        first, *middle, last = parts

        def literal_match(text: str) -> bool:
            if fold:
                text = _ascii_folded(text)
            end = len(text) - len(last)
            position = len(first)
            if end < position or not text.startswith(first) or not text.endswith(last):
                return False
            for part in middle:
                found = text.find(part, position, end)
                if found < 0:
                    return False
                position = found + len(part)
            return True

        return literal_match
    compiled = [
        re.compile("".join("." if c is None else re.escape(c) for c in segment), re.DOTALL)
        for segment in segments
    ]
    if len(compiled) == 1:
        whole_pattern = compiled[0]
        return lambda text: (
            whole_pattern.fullmatch(_ascii_folded(text) if fold else text) is not None
        )
    head, *between, tail = compiled
    tail_length = len(segments[-1])

    def wildcard_match(text: str) -> bool:
        if fold:
            text = _ascii_folded(text)
        matched = head.match(text)
        if matched is None:
            return False
        position = matched.end()
        for segment in between:
            found = segment.search(text, position)
            if found is None:
                return False
            position = found.end()
        start = len(text) - tail_length
        return start >= position and tail.fullmatch(text, start) is not None

    return wildcard_match


def _like_matcher(pattern: str, escape: str) -> Matcher | None:
    if escape and (len(escape) != 1 or (escape.isascii() and escape.isalpha())):
        return None  # SQLite's error, or a folding question: SQLite answers
    segments: list[Segment] = [[]]
    chars = iter(_ascii_folded(pattern))
    for char in chars:
        if escape and char == escape:
            following = next(chars, None)
            if following is None:
                return None  # a trailing escape: SQLite decides
            segments[-1].append(following)
        elif char == "%":
            segments.append([])
        else:
            segments[-1].append(None if char == "_" else char)
    return _segments_matcher(segments, fold=True)


def _glob_matcher(pattern: str) -> Matcher | None:
    if "[" in pattern:
        return None  # character classes: SQLite answers
    segments: list[Segment] = [
        [None if char == "?" else char for char in part] for part in pattern.split("*")
    ]
    return _segments_matcher(segments, fold=False)


_LIKES: dict[tuple[str, str], Matcher | None] = {}
_GLOBS: dict[str, Matcher | None] = {}
MATCHERS_KEPT = 256
"""Compiled patterns kept (each dictionary is emptied when it holds more)."""


def _like(pattern: SqlValue, text: SqlValue, *escaping: SqlValue) -> object:
    if not (isinstance(pattern, str) and isinstance(text, str)):
        return _UNANSWERED
    escape = ""
    if escaping:
        escape = escaping[0]  # type: ignore[assignment]
        if not (isinstance(escape, str) and len(escape) == 1):
            return _UNANSWERED  # NULL, or SQLite's error for any other length
    key = (pattern, escape)
    try:
        matcher = _LIKES[key]
    except KeyError:  # reads run in threads of their own: never look up twice
        if len(pattern) > PATTERN_CHARS_MAX:
            return _UNANSWERED
        if len(_LIKES) >= MATCHERS_KEPT:
            _LIKES.clear()
        matcher = _LIKES[key] = _like_matcher(pattern, escape)
    return _UNANSWERED if matcher is None else int(matcher(text))


def _glob(pattern: SqlValue, text: SqlValue) -> object:
    if not (isinstance(pattern, str) and isinstance(text, str)):
        return _UNANSWERED
    try:
        matcher = _GLOBS[pattern]
    except KeyError:
        if len(pattern) > PATTERN_CHARS_MAX:
            return _UNANSWERED
        if len(_GLOBS) >= MATCHERS_KEPT:
            _GLOBS.clear()
        matcher = _GLOBS[pattern] = _glob_matcher(pattern)
    return _UNANSWERED if matcher is None else int(matcher(text))


def _instr(haystack: SqlValue, needle: SqlValue) -> object:
    if isinstance(haystack, str) and isinstance(needle, str):
        return haystack.find(needle) + 1  # characters, 1-based; 0 when absent
    if isinstance(haystack, bytes) and isinstance(needle, bytes):
        return haystack.find(needle) + 1  # bytes, when both are blobs
    return _UNANSWERED


def _replace(text: SqlValue, old: SqlValue, new: SqlValue) -> object:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        return text if not old else text.replace(old, new)
    return _UNANSWERED


def _trimming(strip: Callable[[str, str], str]) -> Callable[[SqlValue, SqlValue], object]:
    def trimmed(text: SqlValue, characters: SqlValue) -> object:
        if isinstance(text, str) and isinstance(characters, str):
            return strip(text, characters)
        return _UNANSWERED

    return trimmed


_EXACT_IN_PYTHON: dict[str, Callable[..., object]] = {
    "like": _like,
    "glob": _glob,
    "instr": _instr,
    "replace": _replace,
    "trim": _trimming(str.strip),
    "ltrim": _trimming(str.lstrip),
    "rtrim": _trimming(str.rstrip),
}
