"""What the store keeps of the history it lets go: a truncated transaction's verdict
(``Verdict``, for the clients still waiting on it) and a rotation's bodies not yet filed,
carried into the new log (``Carried``, written as ``BodyStored`` entries after the
snapshot). Pure: the store's rotation and truncation (``store.py``) use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from txsync.protocol import TxState
from txsync.v1 import common_pb2, txlog_pb2


class Verdict(NamedTuple):
    """What a client waiting on a truncated transaction is told: its outcome's fields,
    not the outcome itself. A message parsed as part of a request keeps that whole
    request's memory alive (protobuf's arenas): kept for 32,768 transactions, the
    outcomes took 1.4 KB each, and the store's RSS grew with the history again."""

    state: TxState
    position: int
    rows_affected: tuple[int, ...]
    error: str
    duplicate_of: str

    @classmethod
    def of(cls, state: TxState, outcome: common_pb2.Outcome | None) -> Verdict:
        if outcome is None:
            return cls(state, 0, (), "", "")
        return cls(
            state, outcome.position, tuple(outcome.rows_affected), outcome.error,
            outcome.duplicate_of,
        )  # fmt: skip

    def outcome(self) -> common_pb2.Outcome:
        return common_pb2.Outcome(
            state=common_pb2.TxState.ValueType(self.state.value),
            position=self.position,
            rows_affected=self.rows_affected,
            error=self.error,
            duplicate_of=self.duplicate_of,
        )


class Carried(NamedTuple):
    """A body a rotation carries into the new log, not yet filed among the bodies."""

    tx_id: str
    body: bytes
    digest: bytes
    membership: bool
    traceparent: str


def carried_entries(bodies: Sequence[Carried], now_ms: int) -> dict[str, bytes]:
    """The ``BodyStored`` entries (``carried``) a rotation writes after its snapshot,
    encoded: as messages, thousands of them held while a rotation ran cost about 2 KB
    each (``txlog.files.SnapshotForm`` has the measure)."""
    entries: dict[str, bytes] = {}
    for body in bodies:
        stored = txlog_pb2.BodyStored(
            tx_id=body.tx_id, body_digest=body.digest, body_bytes=len(body.body),
            body=body.body, membership=body.membership, traceparent=body.traceparent,
            carried=True,
        )  # fmt: skip
        entry = txlog_pb2.LogEntry(at_unix_ms=now_ms, body_stored=stored)
        entries[body.tx_id] = entry.SerializeToString()
    return entries


def split_by_budget(
    bodies: list[tuple[str, bytes]], budget: int
) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """The bodies that fit ``budget`` bytes (in order: the oldest first), and the rest."""
    taken = 0
    for index, (_, encoded) in enumerate(bodies):
        taken += len(encoded)
        if taken > budget:
            return bodies[:index], bodies[index:]
    return bodies, []
