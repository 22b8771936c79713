"""What applying a transaction yields, and the running state digest every backend keeps.

The digest chains every position a worker has passed: equal digests at one position mean
equal histories (the same transactions, the same statements, the same rows affected, the
same OK/FAILED verdicts), which is how dispatch spots a worker that went its own way and
how DCs compare each other. Error texts stay out of it: they differ between database
versions for the same failure.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from txsync.v1 import common_pb2

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

    def to_proto(self) -> common_pb2.Outcome:
        return common_pb2.Outcome(
            state=common_pb2.TX_STATE_OK if self.ok else common_pb2.TX_STATE_FAILED,
            rows_affected=list(self.rows_affected),
            state_digest=self.state_digest,
            error=self.error,
            position=self.position,
        )


def next_digest(
    previous: bytes,
    position: int,
    tx_id: str,
    body: common_pb2.TxBody,
    *,
    ok: bool,
    rows_affected: tuple[int, ...],
    content: bytes = b"",
) -> bytes:
    """SHA-256 over the previous digest, the position, the id, the statements (their
    deterministic encoding), the verdict and the rows affected; at a content check
    position, also the digest of every user table's rows (``content``), so that replicas
    whose data went apart with the same history are told apart there."""
    sha = hashlib.sha256(previous)
    sha.update(struct.pack(">Q", position))
    sha.update(tx_id.encode())
    for statement in body.statements:
        encoded = statement.SerializeToString(deterministic=True)
        sha.update(struct.pack(">I", len(encoded)))
        sha.update(encoded)
    sha.update(b"OK" if ok else b"FAILED")
    sha.update(struct.pack(f">{len(rows_affected)}q", *rows_affected))
    if content:
        sha.update(b"CONTENT")
        sha.update(content)
    return sha.digest()


def is_content_check(position: int, every: int) -> bool:
    """Whether the state digest at ``position`` covers the data (every worker of a
    cluster must use the same ``every``; 0: never)."""
    return every > 0 and position % every == 0
