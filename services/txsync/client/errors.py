"""What can go wrong, by what the caller should do about it.

Every error the library raises is a ``TxSyncError``. ``Unavailable`` and ``Timeout``
are raised only after the client tried every DC it was given until its deadline;
``Backpressure`` when the DCs kept refusing for load; the others at once (retrying
would not help).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import grpc

from txsync.client.results import Outcome, Submitted


class TxSyncError(Exception):
    """Anything the library raises. An error about a submit carries that submit's
    idempotency key (``key``; empty when it had none) and, once a DC took it, its
    ``tx_id``: submitting the same body again with ``key`` is safe whatever happened
    (a transaction that was taken is answered, never run twice)."""

    key: str = ""
    tx_id: str = ""


class TransactionFailed(TxSyncError):
    """The transaction was ordered and the DC's testing worker's database refused it: it
    is FAILED at every DC and changed nothing. ``error`` is the database's words."""

    def __init__(self, tx_id: str, outcome: Outcome) -> None:
        super().__init__(f"transaction {tx_id} failed: {outcome.error}")
        self.tx_id, self.outcome, self.error = tx_id, outcome, outcome.error


class BatchFailed(TxSyncError):
    """Some transactions of a ``submit_many`` were not submitted (or failed). Nothing is
    lost: ``results`` holds every transaction's answer in the order given (a
    ``Submitted``, or the error, each with its ``key``), and ``keys`` their keys. The safe
    retry sends the same transactions again with ``keys=error.keys``: those already
    taken are answered from their keys and run once (docs/client.md, "Retrying
    safely"). Transactions sent without a key (``idempotent=False``) cannot be retried
    safely: ``unkeyed`` counts the failed ones among them."""

    def __init__(self, results: Sequence[Submitted | TxSyncError]) -> None:
        self.results = list(results)
        self.keys = [result.key for result in self.results]
        self.errors = [r for r in self.results if isinstance(r, TxSyncError)]
        self.unkeyed = sum(1 for error in self.errors if not error.key)
        first = self.errors[0] if self.errors else None
        super().__init__(
            f"{len(self.errors)} of {len(self.results)} transactions were not submitted or "
            f"failed (the first: {first}); retry with keys=error.keys"
        )


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


def key_for(*parts: str | int | bytes) -> str:
    """An idempotency key derived from the caller's own data (an order id, a message id
    and its queue...): the same parts give the same key in every process and after any
    restart, so a redelivered message or a re-run job is answered, not run again. The
    parts are length-prefixed before hashing (``("ab", "c")`` and ``("a", "bc")``
    differ); 128 bits of SHA-256 in hex, well under the 128-byte key limit."""
    if not parts:
        raise ValueError("key_for needs at least one part")
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, str | int | bytes):
            raise TypeError(f"key_for takes str, int or bytes parts, not {type(part).__name__}")
        encoded = part if isinstance(part, bytes) else str(part).encode()
        kind = b"b" if isinstance(part, bytes) else b"i" if isinstance(part, int) else b"s"
        digest.update(kind + len(encoded).to_bytes(8, "big") + encoded)
    return "k-" + digest.hexdigest()[:32]


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
