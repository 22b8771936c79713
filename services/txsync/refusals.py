"""What a service's rules refuse, and why, in their own terms.

The transaction-store's rules (``transaction_store/store.py`` and its parts,
``validation.py``, which the coordinator also checks peers' bodies with) raise
``Refusal`` with a ``Refused`` kind and know nothing of gRPC. ``rpc`` maps each kind to
its gRPC status where a call is answered, the one place that mapping lives, so the same
rules can run where there is no gRPC (the simulator, issue 53).
"""

from __future__ import annotations

import enum


class Refused(enum.Enum):
    """Why a request was refused: what the caller can do about it differs by kind."""

    INVALID = "invalid"
    """The request itself breaks a limit or a format: sending it again cannot help."""
    OVERLOADED = "overloaded"
    """A queue or a budget is full: retry later (``retry_after_ms`` says when)."""
    UNAVAILABLE = "unavailable"
    """The store is stopping, or its log writer failed: retry at a restarted store."""
    NOT_FOUND = "not found"
    """No such transaction (or body, or key) here."""
    CONFLICT = "conflict"
    """It exists already, differently: a synced meta, an idempotency key of another body."""
    PRECONDITION = "precondition"
    """The store's state does not allow it now: a step out of order, a backward state, a
    membership change before the last one applied, a submit at a witness."""
    TRUNCATED = "truncated"
    """What it asks for was truncated from the log: read from a snapshot instead."""
    PAST_END = "past the end"
    """A position past what the store holds yet."""
    CORRUPT = "corrupt"
    """Data that fails its own digest: never served."""


class Refusal(Exception):
    """A request refused, by kind, with the sentence a person reads."""

    def __init__(self, kind: Refused, message: str, *, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_ms = retry_after_ms

    def copy(self) -> Refusal:
        """The same refusal, a new exception, to raise where a frame holds this one: an
        exception raised from a frame whose locals hold it is a reference cycle (the
        exception, its traceback, the frame), freed only by a full collection, and the
        frames keep the call's request and body until then. Refused single submits
        left 458 such cycles alive for minutes in a store after a flow-controlled load
        (``bench/heap_probe``, 2026-12-02)."""
        return Refusal(self.kind, self.message, retry_after_ms=self.retry_after_ms)
