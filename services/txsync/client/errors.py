"""What can go wrong, by what the caller should do about it.

Every error the library raises is a ``TxSyncError``. ``Unavailable`` and ``Timeout``
are raised only after the client tried every DC it was given until its deadline;
``Backpressure`` when the DCs kept refusing for load; the others at once (retrying
would not help).
"""

from __future__ import annotations

import grpc

from txsync.client.results import Outcome


class TxSyncError(Exception):
    """Anything the library raises."""


class TransactionFailed(TxSyncError):
    """The transaction was ordered and the DC's testing worker's database refused it: it
    is FAILED at every DC and changed nothing. ``error`` is the database's words."""

    def __init__(self, tx_id: str, outcome: Outcome) -> None:
        super().__init__(f"transaction {tx_id} failed: {outcome.error}")
        self.tx_id, self.outcome, self.error = tx_id, outcome, outcome.error


class Unavailable(TxSyncError):
    """No DC answered (each was down, unreachable or cut off from a majority) before the
    deadline. A submit may still have been taken by one of them; retrying it with the
    same key is safe."""


class Timeout(TxSyncError):
    """The deadline passed before the transaction reached the state waited for.
    ``tx_id`` and ``state`` say where it got to; wait for it again, or retry the submit
    with the same key."""

    def __init__(self, message: str, tx_id: str = "", state: str = "") -> None:
        super().__init__(message)
        self.tx_id, self.state = tx_id, state


class Backpressure(TxSyncError):
    """The DCs are over a queue or size limit; ``retry_after_s`` is their hint."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidRequest(TxSyncError):
    """A request no DC takes (a malformed statement, a limit broken): the message names
    the field and the limit."""


class NotFound(TxSyncError):
    """No such transaction at the DC asked."""


class KeyConflict(TxSyncError):
    """The idempotency key already belongs to a transaction with another body: a retry
    must send the same body, a new transaction a new key."""


class AccessDenied(TxSyncError):
    """The cluster refused the caller (no token, a wrong one, or a role without this
    call)."""


def from_status(code: grpc.StatusCode, details: str, retry_after_s: float = 0.0) -> TxSyncError:
    """The error a DC's refusal stands for."""
    text = f"{code.name}: {details}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(text)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(text)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return KeyConflict(text)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AccessDenied(text)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Backpressure(text, retry_after_s)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Timeout(text)
    if code in RETRIED_ELSEWHERE:
        return Unavailable(text)
    return TxSyncError(text)


RETRIED_ELSEWHERE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.FAILED_PRECONDITION,  # a witness, or a DC that is shutting down
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
"""Refusals another DC may not repeat: the client moves on to the next one."""
