"""The transaction-store's client calls: submits (backpressure, idempotency keys, the
stamp of a local submit), reads of a transaction, waits on transactions, pages of the
list, and the admin API's membership changes. Part of ``TransactionStore`` (``store.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from txsync.protocol import TxState
from txsync.refusals import Refusal, Refused
from txsync.telemetry import work
from txsync.transaction_store.state import TxRecord
from txsync.transaction_store.step_rules import (
    check_membership_change,
    stamp_floor,
    stamps_at_clock,
)
from txsync.transaction_store.store_core import Staged, StoreCore, Waiter, now_ms
from txsync.transaction_store.txlog.bodies import body_digest
from txsync.transaction_store.validation import check_body, check_membership, check_tx_id, invalid
from txsync.v1 import common_pb2, txlog_pb2

SERVICE_NAME = "transaction-store"


LIST_SCAN_MAX = 20_000
"""Transactions one ``List`` call looks at (8 ms of the event loop here); a page
it cannot fill within them ends early, with a token to go on from."""


def _retry_digest(body: common_pb2.TxBody, first: TxRecord, digest: bytes) -> bytes:
    """The digest of ``body`` as a retry of ``first`` (the submit taken here with its
    key): with the first's time (``key_taken_unix_ms``, its INCOMING step's), not this
    call's, which is all that may differ between the two as the store wrote them."""
    taken_ms = next((s.at_unix_ms for s in first.history if s.state is TxState.INCOMING), 0)
    if not taken_ms or not body.key_taken_unix_ms or taken_ms == body.key_taken_unix_ms:
        return digest
    body.key_taken_unix_ms = taken_ms
    return body_digest(body.SerializeToString())


@dataclass(frozen=True, slots=True)
class Submitted:
    tx_id: str
    created: bool
    state: TxState


class ClientCalls(StoreCore):
    """Clients' calls and the admin API's (``service.py``, ``admin.py``)."""

    def _capacity_refusal(self, *, staged: int = 0, admin: bool = False) -> Refusal | None:
        """Backpressure: the refusal a submit gets now, or None if there is room;
        ``staged`` counts submits of this batch not yet applied. A membership change
        (``admin``) passes the workers' backlog: removing a DC must not wait for this
        DC's workers.

        Returned, not raised: a batch's answers hold its refusals, and one raised and
        caught by the frame that keeps it is a reference cycle (the refusal, its
        traceback, the frame) holding the whole call, its 500 bodies, log entries and
        records, until a full collection. Under a batched load's flow control that
        kept batches alive for minutes (docs/benchmarks.md, "Run of 2026-12-03 15:37")."""
        state, config = self.state, self.config
        waiting = state.incoming_state_txs + staged
        if waiting >= config.incoming_txs_max:
            return Refusal(
                Refused.OVERLOADED,
                f"{waiting} transactions are waiting to be ordered "
                f"(limit {config.incoming_txs_max}); retry later",
                retry_after_ms=config.retry_after_ms,
            )
        if not admin and not config.witness:
            unfinished = waiting + self.ordered_unfinished()
            if unfinished >= config.unfinished_txs_max:
                return Refusal(
                    Refused.OVERLOADED,
                    f"{unfinished} transactions are waiting to be ordered or applied at "
                    f"{config.node_id} (limit {config.unfinished_txs_max}: its workers are "
                    "behind); retry later or at another DC",
                    retry_after_ms=config.retry_after_ms,
                )
            # What waits to be ordered counts too: twelve loaders' batches of 500 taken at
            # once ran 3,000 past the bound before the first of them was ordered. No
            # holder: nothing reported yet (a store alone, or just started).
            behind, holder = self.unpassed()
            ahead = behind + waiting
            if config.unpassed_max and holder and ahead >= config.unpassed_max:
                return Refusal(
                    Refused.OVERLOADED,
                    f"{config.node_id} is {ahead} transactions ahead of the slowest of its "
                    f"peers and workers ({holder}, {behind} positions behind the synced "
                    f"end; limit {config.unpassed_max}: flow control); retry later",
                    retry_after_ms=config.retry_after_ms,
                )
        if state.open_body_bytes >= config.open_body_bytes_max:
            return Refusal(
                Refused.OVERLOADED,
                f"unfinished transactions' bodies take {state.open_body_bytes} bytes "
                f"(limit {config.open_body_bytes_max}); retry later",
                retry_after_ms=config.retry_after_ms,
            )
        return None

    async def submit_many(
        self, submits: Sequence[tuple[common_pb2.TxBody, str, str]], *, admin: bool = False
    ) -> list[Submitted | Refusal]:
        """Submit (body, idempotency key, traceparent) triples; each answered on its own.
        The log entries of every accepted submit carry their bodies and go into one
        batch, so a whole SubmitBatch costs one fsync (their files wait for a rotation:
        ``_unfiled``). Membership entries come only from the admin API
        (``admin``)."""
        self._client_calls += 1
        try:
            return await self._submit_many(submits, admin=admin)
        finally:
            self._client_calls -= 1

    async def _submit_many(
        self, submits: Sequence[tuple[common_pb2.TxBody, str, str]], *, admin: bool
    ) -> list[Submitted | Refusal]:
        if self.config.witness and not admin:
            raise Refusal(
                Refused.PRECONDITION,
                f"{self.config.node_id} is a witness (it applies nothing): submit at a DC",
            )
        keys = [key or body.idempotency_key for body, key, _ in submits]
        # Over a limit already, and no retry of a submit taken here among them (those
        # are answered whatever the load): refuse the lot before encoding, checking and
        # hashing each body. Clients retry refused submits; a refusal must cost the
        # store less than taking them, or the retries keep it over the limit.
        if (full := self._capacity_refusal(admin=admin)) is not None and not any(
            key in self.state.idempotency for key in keys if key
        ):
            return [full] * len(submits)
        prepared: list[tuple[str, bytes] | Refusal] = []
        taken_ms = now_ms()  # each keyed body's and its INCOMING step's (a retry's check)
        for (body, _, _), key in zip(submits, keys, strict=True):
            if key and body.idempotency_key != key:
                # The key travels with the body, so that every DC can tell a retry made
                # at another DC from a new transaction (docs/client.md, "Idempotency").
                if body.idempotency_key:
                    prepared.append(invalid(
                        f"body.idempotency_key {body.idempotency_key!r} differs from the "
                        f"submit's idempotency_key {key!r}: give one, or the same"
                    ))  # fmt: skip
                    continue
                body.idempotency_key = key
            # This DC's window and clock, whatever the client sent; a retry here is
            # compared as if given the first's (``_retry_digest``).
            body.key_window_ms = self.config.idempotency_window_ms if key else 0
            body.key_taken_unix_ms = taken_ms if key else 0
            encoded = body.SerializeToString()
            work.count(work.BODY_ENCODES)
            try:
                check_body(
                    body,
                    len(encoded),
                    allow_nondeterministic=self.config.allow_nondeterministic,
                )
                if body.HasField("membership") and not admin:
                    raise invalid("body.membership: membership changes go through the admin API")
            except Refusal as error:
                prepared.append(error.with_traceback(None))  # kept by this frame: no cycle
                continue
            prepared.append((str(uuid.uuid4()), encoded))
        results: list[Submitted | Refusal] = []
        entries: list[txlog_pb2.LogEntry] = []
        in_flight: dict[int, Staged] = {}  # writes on their way that this call repeats
        async with self._lock:
            # Stamped above every counter and timestamp staged (the state applies what is
            # staged): the protocol takes the stamp if its counter is still below it.
            stamp = stamp_floor(self.state, self._stamp_clock_us(len(prepared)))
            local_seq = self.state.local_seq
            batch_keys: dict[str, str] = {}
            batch_digests: dict[str, bytes] = {}
            for (body, _, traceparent), key, item in zip(submits, keys, prepared, strict=True):
                if isinstance(item, Refusal):
                    results.append(item)
                    continue
                tx_id, encoded = item
                digest = body_digest(encoded)
                existing = None
                if key:
                    existing = self.state.idempotency.get(key) or batch_keys.get(key)
                if existing is not None:
                    record = self.state.txs.get(existing)
                    first_digest = record.body_digest if record else batch_digests.get(key)
                    if record is not None and first_digest != digest:
                        digest = _retry_digest(body, record, digest)
                    if first_digest and first_digest != digest:
                        results.append(Refusal(
                            Refused.CONFLICT,
                            f"idempotency key {key!r} belongs to tx {existing}, whose body "
                            "differs from this one: a retry must send the same body, and "
                            "a new transaction a new key",
                        ))  # fmt: skip
                        continue
                    state = record.state if record and record.state else TxState.INCOMING
                    if (held := self._undurable.get(existing)) is not None:
                        writing, written = held
                        if written is None:  # its submit is on its way
                            in_flight[id(writing)] = writing
                        else:
                            state = written  # what the log holds, not what is on its way
                    results.append(Submitted(existing, False, state))
                    continue
                refusal = self._capacity_refusal(staged=len(entries), admin=admin)
                if refusal is not None:
                    results.append(refusal)
                    continue
                stamp += 1
                local_seq += 1
                entries.append(
                    self._entry(
                        at_unix_ms=taken_ms,
                        submitted=txlog_pb2.TxSubmitted(
                            tx_id=tx_id,
                            idempotency_key=key,
                            body_digest=digest,
                            body_bytes=len(encoded),
                            traceparent=traceparent,
                            service=SERVICE_NAME,
                            body=encoded,
                            membership=admin,
                            ts=stamp,
                            local_seq=local_seq,
                        ),
                    )
                )
                self._unfiled[tx_id] = encoded
                if key:
                    batch_keys[key] = tx_id
                    batch_digests[key] = digest
                results.append(Submitted(tx_id, True, TxState.INCOMING))
            staged = self._stage(entries, hand_over=True) if entries else None
        if staged is not None:
            await self._durable(staged)
        for repeated in in_flight.values():
            # A retry of a submit still on its way to disk is acknowledged no sooner
            # than the first try: a crash before that write would lose the transaction
            # both answers promised.
            await self._durable(repeated)
        return results

    def _stamp_clock_us(self, submits: int) -> int:
        """The wall clock (microseconds) if this call's submits are stamped at it
        (``step_rules.stamps_at_clock``: the DC is under load), else 0."""
        if stamps_at_clock(self.state, submits):
            work.count(work.STAMPS_AT_CLOCK)
            return self.config.stamp_clock_us()
        return 0

    async def submit(
        self, body: common_pb2.TxBody, idempotency_key: str = "", traceparent: str = ""
    ) -> Submitted:
        (result,) = await self.submit_many([(body, idempotency_key, traceparent)])
        if isinstance(result, Refusal):
            raise result.copy()  # not ``result``, which this frame holds: no cycle
        return result

    def get(self, tx_id: str) -> TxRecord:
        """The transaction as the log holds it (``written_tx``)."""
        check_tx_id(tx_id)
        record = self.written_tx(tx_id)
        if record is None:
            verdict = self.truncated_verdicts.get(tx_id)
            if verdict is not None:
                raise Refusal(
                    Refused.NOT_FOUND,
                    f"no transaction {tx_id} at this DC any more: it was {verdict.state.name}, "
                    "and its history is truncated",
                )
            raise Refusal(Refused.NOT_FOUND, f"no transaction {tx_id} at this DC")
        return record

    def get_by_key(self, key: str) -> TxRecord:
        """The transaction submitted here with idempotency key ``key``, as written."""
        tx_id = self.state.idempotency.get(key)
        record = self.written_tx(tx_id) if tx_id is not None else None
        if record is None:
            raise Refusal(
                Refused.NOT_FOUND,
                f"no transaction submitted at this DC with idempotency key {key!r}",
            )
        return record

    async def wait(
        self, tx_id: str, state: TxState, timeout_s: float
    ) -> tuple[TxRecord | None, bool]:
        """Wait until the transaction's state is ``state`` or later (durably; TESTING, written
        only with the outcome, as soon as the dispatch reports it). A transaction this DC has not
        heard of yet (submitted at another DC) is waited for too; the record is None if it
        never showed up."""
        (answer,) = await self.wait_many([tx_id], state, timeout_s)
        return answer

    async def wait_many(
        self, tx_ids: Sequence[str], state: TxState, timeout_s: float, caller: str = ""
    ) -> list[tuple[TxRecord | None, bool]]:
        """``wait`` for each of ``tx_ids`` at once, in the order given: one timer and one
        future for the lot, not a task and a timeout each (a ``SubmitBatch`` of 50 that
        waits is one call here). Each counts toward ``WAITS_MAX``, and toward
        ``caller``'s share of it (``shares.py``)."""
        for tx_id in tx_ids:
            check_tx_id(tx_id)
        pending = [tx_id for tx_id in tx_ids if not self._has_reached(tx_id, state)]
        if not pending:  # all there already: no waiter, no timer
            return [(self.written_tx(tx_id), True) for tx_id in tx_ids]
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop)
        # A plain timer, not ``asyncio.timeout``: that costs a Timeout object, a
        # reschedule and two running-loop lookups (each a getpid syscall on 3.11) per
        # wait, a few percent of the store's CPU with many clients waiting.
        self.waits.take(caller, len(tx_ids))
        timer = loop.call_later(timeout_s, waiter.time_out)
        self._client_calls += 1
        try:
            while True:
                for tx_id in pending:
                    waiting_here = self._waiters.setdefault(tx_id, [])
                    if waiter not in waiting_here:  # still listed where nothing moved
                        waiting_here.append(waiter)
                await waiter.woken
                pending = [tx_id for tx_id in pending if not self._has_reached(tx_id, state)]
                if not pending or waiter.timed_out:
                    break
                waiter.woken = loop.create_future()
        finally:
            self.waits.give_back(caller, len(tx_ids))
            self._client_calls -= 1
            timer.cancel()
            for tx_id in pending:  # timed out or cancelled: maybe still listed
                listed = self._waiters.get(tx_id)
                if listed is not None and waiter in listed:
                    listed.remove(waiter)
                    if not listed:
                        del self._waiters[tx_id]
        unreached = set(pending)
        return [(self.written_tx(tx_id), tx_id not in unreached) for tx_id in tx_ids]

    def list_page(
        self, state: TxState | None, page_size: int, after_seq: int
    ) -> tuple[list[TxRecord], int | None]:
        """A page of transactions (in the order learned) after ``after_seq``, as
        written (``written_tx``); the seq to go on after if more may follow.

        At most ``LIST_SCAN_MAX`` records are looked at per call: a page of a rare
        state among many transactions may come back short, or empty, with a token to
        go on from, rather than hold the event loop while it walks them all."""
        page: list[TxRecord] = []
        scanned = 0
        for stored in self.state.in_seq_order(after_seq):
            if scanned == LIST_SCAN_MAX:
                return page, stored.seq - 1
            scanned += 1
            record = self._written(stored)
            if record is None or (state is not None and record.state is not state):
                continue
            if len(page) == page_size:
                return page, page[-1].seq
            page.append(record)
        return page, None

    async def change_membership(
        self, change: common_pb2.MembershipChange, *, adds: bool = False
    ) -> Submitted:
        """Submit a membership entry (admin API), taken against the installed
        configuration (``step_rules.check_membership_change``: one at a time, a node
        added only while this DC holds the whole history or can export a copy for it, a
        node removed only once the others have caught up). ``adds``: it adds the node."""
        check_membership(change)  # bad input first, whatever is pending
        # No truncation between the check and the entry: once taken, the entry itself
        # holds truncation back until it is applied (``retention.truncation_hold``).
        async with self._one_rotation:
            peers = self.progress.peer_synced_len
            after = check_membership_change(
                self.state,
                change,
                peers,
                adds=adds,
                joins_from_snapshot=bool(self.config.dispatch_address),
            )
            taken = common_pb2.MembershipChange()
            taken.CopyFrom(change)
            taken.after_position = after
            body = common_pb2.TxBody(membership=taken)
            (result,) = await self.submit_many([(body, "", "")], admin=True)
        if isinstance(result, Refusal):
            raise result.copy()  # not ``result``, which this frame holds: no cycle
        return result
