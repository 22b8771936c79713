"""What the library answers with: plain frozen dataclasses, built once from the DCs'
protobuf answers, so that callers never touch generated code.

A value in a statement or a row is ``None``, ``bool``, ``int``, ``float``, ``str`` or
``bytes`` (SQL NULL, boolean, integer, real, text, blob).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from txsync.v1 import client_pb2, common_pb2

SqlValue = None | bool | int | float | str | bytes


class State(Enum):
    """A transaction's lifecycle at one DC; states only move forward."""

    INCOMING = 1
    ACCEPTED = 2
    ENQUEUED = 3
    TESTING = 4
    OK = 5
    FAILED = 6

    @classmethod
    def named(cls, name: str | State) -> State:
        """``"accepted"`` (any case) or a ``State``."""
        if isinstance(name, State):
            return name
        try:
            return cls[name.upper()]
        except KeyError:
            names = ", ".join(s.name.lower() for s in cls)
            raise ValueError(f"{name!r} is not a transaction state ({names})") from None

    @property
    def final(self) -> bool:
        return self in (State.OK, State.FAILED)


def state_of(value: int) -> State | None:
    return State(value) if value else None


@dataclass(frozen=True, slots=True)
class Statement:
    """One parameterised statement (``?`` placeholders) of a transaction."""

    sql: str
    params: tuple[SqlValue, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """The DC's verdict on a transaction: what its testing worker's database did."""

    ok: bool
    rows_affected: tuple[int, ...]
    error: str
    position: int
    """Where it stands in the agreed order (1-based)."""
    duplicate_of: str
    """Set when it ran nothing because an earlier transaction in the order had its
    idempotency key: that one's id (``ok``, rows and error are that one's)."""


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submit's answer."""

    tx_id: str
    """The transaction that counts: the one submitted, or, when the submit turned out
    to repeat an earlier transaction's key, that one (``duplicate``)."""
    state: State
    """Its state at the DC that answered when the answer was sent."""
    created: bool
    """False when the DC answered from an earlier submit with the same key."""
    duplicate: bool
    """The submit repeated an earlier transaction's key: nothing new ran."""
    outcome: Outcome | None
    """Set once OK or FAILED (``wait="ok"``)."""
    dc: str
    """The DC that took the submit (its name, or address)."""
    key: str
    """The idempotency key the submit carried (generated unless given)."""
    position: int = 0
    """Its place in the agreed order, once the answer knows it (waited for "accepted" or
    later); 0 otherwise."""


@dataclass(frozen=True, slots=True)
class Transition:
    state: State
    at: datetime
    service: str


@dataclass(frozen=True, slots=True)
class TxInfo:
    """A transaction as one DC holds it (``get``, ``list``)."""

    tx_id: str
    state: State | None
    position: int
    """Its place in the agreed order; 0 until ACCEPTED."""
    origin: str
    """The DC that took the submit ('' until its meta is known here)."""
    idempotency_key: str
    statements: tuple[Statement, ...]
    """Empty unless asked for (``get(..., body=True)``)."""
    history: tuple[Transition, ...]
    outcome: Outcome | None
    traceparent: str
    key_remembered_until: datetime | None = None
    """With ``body=True`` and a key: every worker remembers the key (a retry with it,
    at any DC, runs nothing) until at least this time, and for 262,144 positions
    besides, whichever is longer (the ``--idempotency-window-s`` of the DC that took
    it); None: by positions only, or the body was not asked for."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[SqlValue, ...], ...]
    truncated: bool
    """More rows than ``max_rows`` (or 4 MiB of values): the rest were cut."""
    position: int
    """The agreed position the answering worker had applied."""
    worker: str


def value_to_proto(value: object) -> common_pb2.SqlValue:
    if value is None:
        return common_pb2.SqlValue()
    if isinstance(value, bool):
        return common_pb2.SqlValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.SqlValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.SqlValue(real_value=value)
    if isinstance(value, str):
        return common_pb2.SqlValue(text_value=value)
    if isinstance(value, bytes | bytearray | memoryview):
        return common_pb2.SqlValue(blob_value=bytes(value))
    raise TypeError(
        f"a parameter must be None, bool, int, float, str or bytes, not {type(value).__name__}"
    )


def value_of(value: common_pb2.SqlValue) -> SqlValue:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    found: SqlValue = getattr(value, kind)
    return found


CLOCK_WORDS = re.compile(
    r"'now'|6e6f77|current_(?:timestamp|date|time)|"
    r"\b(?:date|time|datetime|julianday|unixepoch|strftime|timediff)\s*\(",
    re.IGNORECASE,
)
"""SQL that may read the current time (6E6F77 is 'now' as a blob)."""


def body_of(statements: Sequence[Statement], label: str = "") -> common_pb2.TxBody:
    """A transaction's body. One whose SQL may read the clock (``CLOCK_WORDS``) carries
    the time it was made (``now_unix_us``): what SQL's current time reads at every
    worker, kept through the library's retries. Only those: the time is part of the
    body, so a body made again for a retry under the same idempotency key would differ
    from the first (ALREADY_EXISTS), as the pipeline's resumed loads make them."""
    clock = any(CLOCK_WORDS.search(s.sql) for s in statements)
    return common_pb2.TxBody(
        now_unix_us=time.time_ns() // 1000 if clock else 0,
        statements=[
            common_pb2.Statement(sql=s.sql, params=[value_to_proto(p) for p in s.params])
            for s in statements
        ],
        label=label,
    )


def outcome_of(outcome: common_pb2.Outcome) -> Outcome:
    return Outcome(
        ok=outcome.state == common_pb2.TX_STATE_OK,
        rows_affected=tuple(outcome.rows_affected),
        error=outcome.error,
        position=outcome.position,
        duplicate_of=outcome.duplicate_of,
    )


def tx_info_of(answer: client_pb2.GetResponse) -> TxInfo:
    return TxInfo(
        tx_id=answer.tx_id,
        state=state_of(answer.state),
        position=answer.position,
        origin=answer.meta.origin,
        idempotency_key=answer.idempotency_key,
        statements=tuple(
            Statement(s.sql, tuple(value_of(p) for p in s.params)) for s in answer.body.statements
        ),
        history=tuple(
            Transition(State(t.state), t.at.ToDatetime(tzinfo=UTC), t.service)
            for t in answer.history
        ),
        outcome=outcome_of(answer.outcome) if answer.HasField("outcome") else None,
        traceparent=answer.traceparent,
        key_remembered_until=_key_remembered_until(answer.body),
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _key_remembered_until(body: common_pb2.TxBody) -> datetime | None:
    if not (body.key_taken_unix_ms and body.key_window_ms):
        return None
    return _EPOCH + timedelta(milliseconds=body.key_taken_unix_ms + body.key_window_ms)


def query_result_of(answer: client_pb2.QueryResponse) -> QueryResult:
    return QueryResult(
        columns=tuple(answer.columns),
        rows=tuple(tuple(value_of(v) for v in row.values) for row in answer.rows),
        truncated=answer.truncated,
        position=answer.position,
        worker=answer.worker_id,
    )
