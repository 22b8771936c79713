"""What applying a transaction yields, and the running state digest every backend keeps.

The digest chains every position a worker has passed: equal digests at one position mean
equal histories (the same transactions, the same statements, the same rows affected, the
same OK/FAILED verdicts), which is how dispatch spots a worker that went its own way and
how DCs compare each other. Error texts stay out of it: they differ between database
versions for the same failure.

The statements enter it in an encoding of our own (``encode_statement``), fixed and
pinned by a test, not protobuf's serialization, which protobuf does not promise to keep
stable across library versions: DCs running different protobuf releases must still
agree. Integers are big-endian; lengths are u32::

    statement := len(sql) sql count(params) param*
    param     := "N"                    (no value)
               | "I" i64 | "R" f64 (IEEE 754) | "O" u8 (bool)
               | "T" len(utf8) utf8     | "B" len(bytes) bytes
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from txsync.worker.transactions import Statement, Transaction

GENESIS_DIGEST = bytes(32)
"""The digest before position 1."""


@dataclass(frozen=True, slots=True)
class Applied:
    """Where a worker's database stands: its last applied position, that transaction's
    id, and the running digest there (position 0: nothing applied)."""

    position: int = 0
    tx_id: str = ""
    state_digest: bytes = GENESIS_DIGEST


@dataclass(frozen=True, slots=True)
class Outcome:
    position: int
    tx_id: str
    ok: bool
    rows_affected: tuple[int, ...]
    state_digest: bytes
    error: str = ""
    duplicate_of: str = ""
    """Set when it ran nothing: the earlier transaction with its idempotency key (whose
    verdict ``ok`` repeats)."""
    touched_digest: bytes = field(default=b"", compare=False)
    """SHA-256 of the rows it touched as they are after it (SQLite, when it ran and was
    OK now; empty when answered from its record): compared between a DC's workers, not
    part of ``state_digest`` nor of the outcome's equality."""


def next_digest(
    previous: bytes,
    position: int,
    tx_id: str,
    body: Transaction,
    *,
    ok: bool,
    rows_affected: tuple[int, ...],
    content: bytes = b"",
    duplicate_of: str = "",
) -> bytes:
    """SHA-256 over the previous digest, the position, the id, the statements (their
    deterministic encoding), the verdict and the rows affected, and for a duplicate the
    transaction it repeats (keys themselves stay out: a history digests as it did before
    keys travelled); at a content check position, also the digest of every user table's
    rows (``content``), so that replicas whose data went apart with the same history are
    told apart there."""
    sha = hashlib.sha256(previous)
    sha.update(struct.pack(">Q", position))
    sha.update(tx_id.encode())
    for statement in body.statements:
        encoded = encode_statement(statement)
        sha.update(struct.pack(">I", len(encoded)))
        sha.update(encoded)
    sha.update(b"OK" if ok else b"FAILED")
    sha.update(struct.pack(f">{len(rows_affected)}q", *rows_affected))
    if duplicate_of:
        sha.update(b"DUPLICATE")
        sha.update(duplicate_of.encode())
    if content:
        sha.update(b"CONTENT")
        sha.update(content)
    return sha.digest()


def is_content_check(position: int, every: int) -> bool:
    """Whether the state digest at ``position`` covers the data (every worker of a
    cluster must use the same ``every``; 0: never)."""
    return every > 0 and position % every == 0


def encode_statement(statement: Statement) -> bytes:
    """The statement in the digest's own encoding (the module docstring)."""
    sql = statement.sql.encode()
    parts = [struct.pack(">I", len(sql)), sql, struct.pack(">I", len(statement.params))]
    for param in statement.params:
        # bool before int: a bool is an int to Python, not to the digest.
        if param is None:
            parts.append(b"N")
        elif isinstance(param, bool):
            parts.append(b"O" + struct.pack(">B", param))
        elif isinstance(param, int):
            parts.append(b"I" + struct.pack(">q", param))
        elif isinstance(param, float):
            parts.append(b"R" + struct.pack(">d", param))
        elif isinstance(param, str):
            text = param.encode()
            parts.append(b"T" + struct.pack(">I", len(text)) + text)
        else:
            parts.append(b"B" + struct.pack(">I", len(param)) + param)
    return b"".join(parts)
