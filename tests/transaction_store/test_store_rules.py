"""The store's rules on real files: the lifecycle only moves forward, bad internal
requests change nothing, backpressure refuses with a hint, and restarts remember all."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from unittest.mock import ANY

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from tests.support.in_process import WAIT_S, until
from tests.transaction_store.held_writes import hold_writes
from txsync.protocol import (
    Ballot,
    Configuration,
    MergeBase,
    PersistViewVote,
    TxMeta,
    TxState,
    View,
    ViewProposal,
)
from txsync.protocol.limits import INCOMING_TXS_MOST, Limits
from txsync.refusals import Refusal, Refused
from txsync.rpc import add_service, new_server
from txsync.settings import FOLLOW_GATHER_MS_MOST
from txsync.telemetry import work
from txsync.transaction_store import (
    client_calls,
    dispatch_calls,
    local_submits,
    retention,
    rotation,
    store_core,
)
from txsync.transaction_store.history import History
from txsync.transaction_store.local_submits import LocalSubmit
from txsync.transaction_store.retention import Progress, TruncationHold, peers_ordered
from txsync.transaction_store.server import CLIENT_SERVICE, UNDECODED
from txsync.transaction_store.service import ClientServicer
from txsync.transaction_store.state import Outcome, StoreState, TxRecord
from txsync.transaction_store.step_rules import ProtocolStep, StateChangeRequest
from txsync.transaction_store.store import StoreConfig, Submitted, TransactionStore
from txsync.transaction_store.txlog.bodies import BodyStore, body_digest, gzip_body
from txsync.transaction_store.validation import PERSIST_METAS_MAX, nondeterminism
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2, txlog_pb2

T = TypeVar("T")

LOCAL_ADMIT = Limits().local_admit_txs_max


def _body(sql: str = "INSERT INTO t VALUES (1)") -> common_pb2.TxBody:
    return common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])


def _run(tmp_path: Path, scenario: Callable[[TransactionStore], Awaitable[T]], **config: Any) -> T:
    config.setdefault("history_kept", 0)  # truncation goes as far as progress allows
    config.setdefault("history_kept_ms", 0)

    async def main() -> T:
        store = await TransactionStore.open(StoreConfig(data_dir=tmp_path, node_id="dc1", **config))
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


def _ok(tx_id: str = "", position: int = 1) -> common_pb2.Outcome:
    return common_pb2.Outcome(state=common_pb2.TX_STATE_OK, position=position)


def _finished(tx_id: str, position: int) -> list[StateChangeRequest]:
    return [
        StateChangeRequest(tx_id, TxState.TESTING),
        StateChangeRequest(tx_id, TxState.OK, _ok(tx_id, position)),
    ]


async def _finished_here(store: TransactionStore, count: int, from_position: int = 1) -> list[str]:
    """``count`` local transactions submitted, synced from ``from_position`` on, and OK."""
    ids = [(await store.submit(_body())).tx_id for _ in range(count)]
    for position, tx_id in enumerate(ids, start=from_position):
        await _sync_local(store, tx_id, position)
        await store.advance_states(_finished(tx_id, position), "wd")
    return ids


async def _sync_local(store: TransactionStore, tx_id: str, ts: int) -> TxMeta:
    meta = TxMeta(ts, tx_id, "dc1")
    await store.persist_step(
        ProtocolStep(
            counter=ts,
            incoming=[meta],
            synced_start=store.state.merge_base,
            synced=[meta],
            changes=[
                StateChangeRequest(tx_id, TxState.ACCEPTED),
                StateChangeRequest(tx_id, TxState.ENQUEUED),
            ],
            service="sync-coordinator",
        )
    )
    return meta


async def _sync_foreign(store: TransactionStore, *stamps: int) -> None:
    """dc2's transactions stamped ``stamps`` (in order), synced here and ACCEPTED."""
    metas = [TxMeta(ts, str(uuid.uuid4()), "dc2") for ts in stamps]
    await store.persist_step(
        ProtocolStep(
            counter=stamps[-1], incoming=metas, synced_start=store.state.merge_base,
            synced=metas, changes=[StateChangeRequest(m.tx_id, TxState.ACCEPTED) for m in metas],
            service="sync-coordinator",
        )
    )  # fmt: skip


def test_full_lifecycle_is_recorded_and_survives_restart(tmp_path: Path) -> None:
    async def first(store: TransactionStore) -> str:
        submitted = await store.submit(_body(), "key-1")
        await _sync_local(store, submitted.tx_id, 1)
        await store.advance_states([StateChangeRequest(submitted.tx_id, TxState.TESTING)], "wd")
        await store.advance_states(
            [StateChangeRequest(submitted.tx_id, TxState.OK, _ok())], "worker-dispatch"
        )
        return submitted.tx_id

    tx_id = _run(tmp_path, first)

    async def second(store: TransactionStore) -> None:
        record = store.get(tx_id)
        # TESTING was written with the outcome: the restarted store has the whole history.
        assert [step.state for step in record.history] == list(TxState)[:5]
        assert [step.service for step in record.history] == [
            "transaction-store",
            "sync-coordinator",
            "sync-coordinator",
            "wd",
            "worker-dispatch",
        ]
        assert record.position == 1 and record.outcome is not None
        again = await store.submit(_body(), "key-1")
        assert (again.tx_id, again.created, again.state) == (tx_id, False, TxState.OK)

    _run(tmp_path, second)


def test_testing_is_written_with_the_outcome_a_restart_before_it_finds_enqueued(
    tmp_path: Path,
) -> None:
    """TESTING alone costs no log batch (nor, at low load, an fsync) per transaction: it
    is written with the outcome. Lost with a restart before that, it is recorded again
    when the dispatch, starting at the first unfinished position, tests it again."""

    async def first(store: TransactionStore) -> str:
        submitted = await store.submit(_body(), "key-1")
        await _sync_local(store, submitted.tx_id, 1)
        batches_before = work.counts[work.LOG_BATCHES]
        await store.advance_states([StateChangeRequest(submitted.tx_id, TxState.TESTING)], "wd")
        assert work.counts[work.LOG_BATCHES] == batches_before
        assert store.get(submitted.tx_id).state is TxState.TESTING
        await store.wait(submitted.tx_id, TxState.TESTING, timeout_s=5)
        return submitted.tx_id

    tx_id = _run(tmp_path, first)

    async def second(store: TransactionStore) -> None:
        assert store.get(tx_id).state is TxState.ENQUEUED
        assert store.first_unfinished_position() == 1
        await store.advance_states([StateChangeRequest(tx_id, TxState.TESTING)], "wd2")
        entries_before = work.counts[work.LOG_ENTRIES]
        await store.advance_states([StateChangeRequest(tx_id, TxState.OK, _ok())], "wd2")
        # One entry: the outcome's, which carries TESTING's time.
        assert work.counts[work.LOG_ENTRIES] == entries_before + 1

    _run(tmp_path, second)

    async def third(store: TransactionStore) -> None:
        history = store.get(tx_id).history
        assert [step.state for step in history][-2:] == [TxState.TESTING, TxState.OK]
        assert history[-2].service == "wd2"

    _run(tmp_path, third)


def test_a_state_reported_late_keeps_its_time_within_the_history_and_the_clock(
    tmp_path: Path,
) -> None:
    """worker-dispatch reports TESTING with its outcome and the time it was made; the
    store takes that time, but none before the transaction's last step nor after now."""

    async def scenario(store: TransactionStore) -> list[dict[TxState, int]]:
        ids = [(await store.submit(_body(f"SELECT {n}"))).tx_id for n in range(3)]
        for ts, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, ts)
        enqueued_at = store.get(ids[-1]).history[-1].at_unix_ms
        while time.time_ns() // 1_000_000 <= enqueued_at + 1:  # so that +1 is in the past
            await asyncio.sleep(0.001)
        for tx_id, at in zip(ids, (enqueued_at + 1, 1, 2**62), strict=True):
            await store.advance_states(
                [
                    StateChangeRequest(tx_id, TxState.TESTING, at_unix_ms=at),
                    StateChangeRequest(tx_id, TxState.OK, _ok()),
                ],
                "wd",
            )
        times = [{step.state: step.at_unix_ms for step in store.get(t).history} for t in ids]
        assert times[0][TxState.TESTING] == enqueued_at + 1  # as reported
        assert times[1][TxState.TESTING] == times[1][TxState.ENQUEUED]  # not before it
        assert times[2][TxState.TESTING] <= times[2][TxState.OK]  # not after now
        return times

    times = _run(tmp_path, scenario)

    async def replayed(store: TransactionStore) -> list[dict[TxState, int]]:
        return [
            {step.state: step.at_unix_ms for step in record.history}
            for record in store.state.in_seq_order()
        ]

    assert _run(tmp_path, replayed) == times  # TESTING's time came back from the log


@pytest.mark.parametrize(
    ("moves", "refused"),
    [
        ([TxState.TESTING], TxState.TESTING),  # skips ACCEPTED and ENQUEUED
        ([TxState.OK], TxState.OK),
    ],
)
def test_skipped_transitions_are_refused(
    tmp_path: Path, moves: list[TxState], refused: TxState
) -> None:
    async def scenario(store: TransactionStore) -> None:
        tx_id = (await store.submit(_body())).tx_id
        with pytest.raises(Refusal) as caught:
            await store.advance_states(
                [StateChangeRequest(tx_id, state, _ok()) for state in moves], "wd"
            )
        assert caught.value.kind is Refused.PRECONDITION
        assert f"INCOMING -> {refused.name}" in caught.value.message
        assert store.get(tx_id).state is TxState.INCOMING

    _run(tmp_path, scenario)


def test_backward_transition_is_refused_and_repeat_is_a_no_op(tmp_path: Path) -> None:
    """A repeat changes nothing, and a step back is refused, except for a coordinator's
    ENQUEUED behind the dispatch: the store enqueued it at the body's record already
    (an implied state), and the core's own ENQUEUED may follow after TESTING."""

    async def scenario(store: TransactionStore) -> None:
        tx_id = (await store.submit(_body())).tx_id
        await _sync_local(store, tx_id, 1)
        await store.advance_states([StateChangeRequest(tx_id, TxState.TESTING)], "wd")
        await store.advance_states([StateChangeRequest(tx_id, TxState.TESTING)], "wd")  # retry
        await store.persist_step(
            ProtocolStep(changes=[StateChangeRequest(tx_id, TxState.ENQUEUED)], service="sc")
        )
        await store.advance_states([StateChangeRequest(tx_id, TxState.OK, _ok(tx_id))], "wd")
        with pytest.raises(Refusal) as caught:
            await store.persist_step(
                ProtocolStep(changes=[StateChangeRequest(tx_id, TxState.TESTING)], service="sc")
            )
        assert caught.value.kind is Refused.PRECONDITION
        assert "OK -> TESTING" in caught.value.message
        states = [step.state for step in store.get(tx_id).history]
        assert states == [TxState.INCOMING, TxState.ACCEPTED, TxState.ENQUEUED, TxState.TESTING,
                          TxState.OK]  # fmt: skip

    _run(tmp_path, scenario)


def test_dispatch_repeating_testing_after_the_verdict_is_a_no_op(tmp_path: Path) -> None:
    """A restarted pipeline records TESTING again behind the verdict it recorded before
    (both in one batch, or in two): the repeat changes nothing and refuses nothing. Two
    different verdicts are still refused."""

    async def scenario(store: TransactionStore) -> None:
        tx_id = (await store.submit(_body())).tx_id
        await _sync_local(store, tx_id, 1)
        repeated = [
            StateChangeRequest(tx_id, TxState.TESTING),
            StateChangeRequest(tx_id, TxState.OK, _ok(tx_id)),
            StateChangeRequest(tx_id, TxState.TESTING),
        ]
        await store.advance_states(repeated, "wd")
        await store.advance_states([StateChangeRequest(tx_id, TxState.TESTING)], "wd")
        record = store.get(tx_id)
        assert [step.state for step in record.history][-2:] == [TxState.TESTING, TxState.OK]
        with pytest.raises(Refusal) as caught:
            await store.advance_states([StateChangeRequest(tx_id, TxState.FAILED, _ok())], "wd")
        assert caught.value.kind is Refused.PRECONDITION
        assert "OK -> FAILED" in caught.value.message

    _run(tmp_path, scenario)


def test_bad_protocol_steps_change_nothing(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> None:
        tx_id = (await store.submit(_body())).tx_id
        meta = await _sync_local(store, tx_id, 5)
        before = (store.state.counter, store.state.synced_len, store.files.current_bytes)
        other = TxMeta(9, str(uuid.uuid4()), "dc2")
        cases: list[tuple[dict[str, Any], Refused, str]] = [
            (dict(counter=3), Refused.PRECONDITION, "counters only rise"),
            (dict(synced_start=MergeBase.genesis(), synced=[other]),
             Refused.PRECONDITION, "does not extend the merge base"),
            (dict(synced_start=store.state.merge_base, synced=[meta]),
             Refused.CONFLICT, "already synced"),
            (dict(synced_start=store.state.merge_base, synced=[other, other]),
             Refused.CONFLICT, "already synced"),
            (dict(incoming=[meta]), Refused.CONFLICT, "already synced"),
            (dict(changes=[StateChangeRequest(other.tx_id, TxState.ACCEPTED)]),
             Refused.PRECONDITION, "cannot be ACCEPTED: its meta is not known"),
            # A valid counter with an invalid change: the whole step is refused.
            (dict(counter=50, changes=[StateChangeRequest(tx_id, TxState.OK, _ok())]),
             Refused.PRECONDITION, "ENQUEUED -> OK"),
        ]  # fmt: skip
        for fields, kind, text in cases:
            step: dict[str, Any] = dict(
                counter=0, incoming=[], synced_start=None, synced=[], changes=[]
            )
            step.update(fields)
            with pytest.raises(Refusal) as caught:
                await store.persist_step(ProtocolStep(service="sc", **step))
            assert caught.value.kind is kind, fields
            assert text in caught.value.message, caught.value.message
        after = (store.state.counter, store.state.synced_len, store.files.current_bytes)
        assert after == before

    _run(tmp_path, scenario)


def test_backpressure_refuses_with_a_retry_hint(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> None:
        results = await store.submit_many([(_body(), "", "")] * 5)
        refused = [r for r in results if isinstance(r, Refusal)]
        assert len(refused) == 2
        assert refused[0].kind is Refused.OVERLOADED
        assert refused[0].retry_after_ms == 250
        with pytest.raises(Refusal) as caught:
            await store.submit(_body())
        assert "waiting to be ordered" in caught.value.message
        await store.truncate(0)  # a rotation files every body held (none truncated)
        kept = [tx_id for tx_id in store.state.txs if _body_kept(store, tx_id)]
        assert len(kept) == 3  # refused submits leave no body behind

    _run(tmp_path, scenario, incoming_txs_max=3)


def test_the_workers_backlog_refuses_submits_until_they_finish_some(tmp_path: Path) -> None:
    """Ordered transactions not yet OK or FAILED here count with the INCOMING ones
    against ``unfinished_txs_max``: the store holds them all until its workers pass
    them. A membership change passes (removing a DC must not wait for these workers)."""

    async def scenario(store: TransactionStore) -> None:
        ids = [(await store.submit(_body(), "first")).tx_id, (await store.submit(_body())).tx_id]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
        assert store.state.incoming_state_txs == 0
        third = await store.submit(_body())
        with pytest.raises(Refusal) as caught:
            await store.submit(_body())
        # A retry of a submit taken here is answered whatever the load.
        (retried,) = await store.submit_many([(_body(), "first", "")])
        assert not isinstance(retried, Refusal) and retried.tx_id == ids[0]
        assert not retried.created
        assert caught.value.kind is Refused.OVERLOADED
        assert caught.value.retry_after_ms == 250
        assert "3 transactions are waiting to be ordered or applied at dc1" in str(
            caught.value.message
        )
        (membership,) = await store.submit_many([(_body(), "", "")], admin=True)
        assert not isinstance(membership, Refusal)
        for position, tx_id in enumerate(ids, start=1):  # 2 INCOMING are left
            await store.advance_states(_finished(tx_id, position), "wd")
        fourth = await store.submit(_body())
        assert fourth.created and third.created

    _run(tmp_path, scenario, unfinished_txs_max=3)


def test_the_age_window_keeps_a_bounded_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``history_kept_ms`` keeps what finished within it, but never more than the newest
    HISTORY_KEPT_BY_AGE_MOST positions (or ``history_kept``, if larger): at a batched
    load's rate ten seconds were 17,000 transactions held."""

    async def scenario(store: TransactionStore) -> None:
        await _finished_here(store, 6)
        store.report_progress({"dc2": 6}, 6, peers_reported=True)
        # All six finished within the 60 s: the age window keeps the newest 2 of them.
        assert store.truncation_hold() == TruncationHold(5, "")
        store.config = dataclasses.replace(store.config, history_kept=4)
        assert store.truncation_hold() == TruncationHold(3, "")  # the count keeps more

    monkeypatch.setattr(retention, "HISTORY_KEPT_BY_AGE_MOST", 2)
    _run(tmp_path, scenario, history_kept_ms=60_000)


def test_body_bytes_backpressure(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> None:
        await store.submit(_body("INSERT INTO t VALUES ('" + "x" * 500 + "')"))
        with pytest.raises(Refusal) as caught:
            await store.submit(_body())
        assert caught.value.kind is Refused.OVERLOADED
        assert "bodies take" in caught.value.message

    _run(tmp_path, scenario, open_body_bytes_max=400)


async def _push_body(
    store: TransactionStore, tx_id: str, encoded: bytes, digest: bytes, traceparent: str = ""
) -> bool:
    """A body a peer pushed, as the coordinator hands it over: in a protocol step (of
    its own here). True if the step stored it, False if it was held already."""
    staged = await store.stage_step(ProtocolStep(bodies=[(tx_id, encoded, digest, traceparent)]))
    await store.finish_step(staged)
    return any(entry.WhichOneof("entry") == "body_stored" for entry in staged.entries)


def test_body_exchange_checks_digests(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> None:
        tx_id = str(uuid.uuid4())
        encoded = _body().SerializeToString()
        with pytest.raises(Refusal) as caught:
            await _push_body(store, tx_id, encoded, b"\x00" * 32)
        assert caught.value.kind is Refused.CORRUPT
        assert not store.bodies.holds(tx_id)
        assert await _push_body(store, tx_id, encoded, body_digest(encoded))
        assert not await _push_body(store, tx_id, encoded, body_digest(encoded))
        with pytest.raises(Refusal, match="not an encoded TxBody"):
            await _push_body(store, str(uuid.uuid4()), b"\xff\xff\xff", b"")

    _run(tmp_path, scenario)


def test_an_idempotency_key_with_another_body_is_refused(tmp_path: Path) -> None:
    """A retry sends the same body and gets the first transaction back; a different body
    under a used key is a client's mistake that would silently lose a write."""

    async def scenario(store: TransactionStore) -> None:
        first = await store.submit(_body(), "k")
        again = await store.submit(_body(), "k")
        assert again.tx_id == first.tx_id and not again.created
        with pytest.raises(Refusal, match=f"belongs to tx {first.tx_id}") as caught:
            await store.submit(_body("INSERT INTO t VALUES (2)"), "k")
        assert caught.value.kind is Refused.CONFLICT
        # Within one batch too: the first of the key counts.
        batch = await store.submit_many(
            [
                (_body("SELECT 1"), "b", ""),
                (_body("SELECT 2"), "b", ""),
                (_body("SELECT 1"), "b", ""),
            ]
        )
        assert isinstance(batch[1], Refusal) and batch[1].kind is Refused.CONFLICT
        assert not isinstance(batch[0], Refusal) and not isinstance(batch[2], Refusal)
        assert batch[2].tx_id == batch[0].tx_id
        assert len(list(store.state.in_seq_order())) == 2

    _run(tmp_path, scenario)


def test_a_keyed_body_carries_this_dcs_key_window_and_time(tmp_path: Path) -> None:
    """Every worker remembers a key for the window the store that took it wrote into its
    body, after the time it took it (issue 50), whatever the client sent. A retry here,
    later, is still the same body: it is compared with the first's time."""

    async def scenario(store: TransactionStore) -> None:
        asked_for_more = _body()
        asked_for_more.key_window_ms = 10**12
        asked_for_more.key_taken_unix_ms = 1
        before_ms = time.time_ns() // 1_000_000
        first = await store.submit(asked_for_more, "k")
        body = await store.read_body(first.tx_id)
        assert body is not None and body.key_window_ms == 90_000
        assert before_ms <= body.key_taken_unix_ms <= time.time_ns() // 1_000_000
        record = store.state.txs[first.tx_id]
        assert record.history[0].at_unix_ms == body.key_taken_unix_ms
        while time.time_ns() // 1_000_000 <= body.key_taken_unix_ms:
            await asyncio.sleep(0.001)  # a later call, with another time of its own
        again = await store.submit(_body(), "k")
        assert again.tx_id == first.tx_id and not again.created
        with pytest.raises(Refusal, match="whose body differs"):
            await store.submit(_body("INSERT INTO t VALUES (2)"), "k")
        unkeyed = await store.submit(_body("INSERT INTO t VALUES (3)"))
        read = await store.read_body(unkeyed.tx_id)
        assert read is not None and (read.key_window_ms, read.key_taken_unix_ms) == (0, 0)

    _run(tmp_path, scenario, idempotency_window_ms=90_000)


def test_a_watch_that_does_not_read_is_dropped_not_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_submits, "LOCAL_WATCH_BYTES_MAX", 10_000)

    async def scenario(store: TransactionStore) -> None:
        stalled = store.watch_local_submits()
        first = (await store.submit(_body())).tx_id
        assert [s.tx_id for s in await anext(stalled)] == [first]  # watching from here on
        for n in range(200):  # ~5 kB of bodies per 100: past the bound, unread
            await store.submit(_body(f"INSERT INTO t VALUES ({n}, '{'x' * 30}')"))
        with pytest.raises(Refusal, match="dropped; watch again") as caught:
            await anext(stalled)
        assert caught.value.kind is Refused.OVERLOADED
        # Watching again hands every pending submit anew: nothing is lost.
        again = store.watch_local_submits()
        handed = [s.tx_id for s in await anext(again)]  # the pending, in one message
        assert handed[0] == first and len(set(handed)) == 201
        await stalled.aclose()
        await again.aclose()

    _run(tmp_path, scenario)


def test_a_watch_hands_a_group_commits_submits_in_messages_it_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submits written together go in one message where they fit (the coordinator steps
    them together): at most LOCAL_SUBMITS_PER_MESSAGE and a bound of body bytes
    each, in submit order."""
    monkeypatch.setattr(local_submits, "LOCAL_SUBMITS_PER_MESSAGE", 4)

    async def scenario(store: TransactionStore) -> None:
        watch = store.watch_local_submits()
        first = (await store.submit(_body())).tx_id
        assert [s.tx_id for s in await anext(watch)] == [first]
        bodies = [_body(f"INSERT INTO t VALUES ({n})") for n in range(10)]
        results = await store.submit_many([(b, "", "") for b in bodies])
        submitted = [r.tx_id for r in results if isinstance(r, Submitted)]
        batches = [await anext(watch) for _ in range(3)]
        assert [len(b) for b in batches] == [4, 4, 2]
        assert [s.tx_id for b in batches for s in b] == submitted
        # Body bytes bound a message too; a body over the bound goes alone.
        size = len(bodies[0].SerializeToString())
        monkeypatch.setattr(local_submits, "LOCAL_SUBMIT_BODY_BYTES_PER_MESSAGE", 2 * size)
        await store.submit_many([(b, "", "") for b in bodies[:3]])
        assert [len(await anext(watch)) for _ in range(2)] == [2, 1]
        monkeypatch.setattr(local_submits, "LOCAL_SUBMIT_BODY_BYTES_PER_MESSAGE", size - 1)
        await store.submit_many([(b, "", "") for b in bodies[3:5]])
        assert [len(await anext(watch)) for _ in range(2)] == [1, 1]
        await watch.aclose()

    _run(tmp_path, scenario)


def test_a_watch_hands_a_submit_once_durable_with_its_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator posts a stamped submit without writing it first, so it must not
    hear of it before the submit's write is durable. The stamp is above every counter
    and timestamp staged, and is the transaction's meta. A lone submit (no load) is
    stamped from the counter, not the clock (here far ahead)."""

    async def scenario(store: TransactionStore) -> None:
        await store.persist_step(ProtocolStep(counter=7, local_seq=0))
        gate = hold_writes(monkeypatch)
        watch = store.watch_local_submits()
        handing = asyncio.ensure_future(anext(watch))
        submitting = asyncio.create_task(store.submit(_body()))
        try:
            async with asyncio.timeout(WAIT_S):
                while not store._unhanded:
                    await asyncio.sleep(0)  # staged, its write held
            await asyncio.sleep(0.05)
            assert not handing.done()  # not before its fsync
        finally:
            gate.set()
        (handed,) = await asyncio.wait_for(handing, WAIT_S)
        tx_id = (await submitting).tx_id
        assert (handed.tx_id, handed.ts, handed.local_seq) == (tx_id, 8, 1)
        record = store.get(tx_id)
        assert record.meta == TxMeta(8, tx_id, "dc1") and store.state.counter == 8
        await watch.aclose()

    _run(tmp_path, scenario, stamp_clock_us=lambda: 1_000)


def test_submits_made_durable_together_are_handed_together_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submits staged while a write is on disk go in the next write, and reach the
    coordinator in one watch message once it is durable (a message and a coordinator
    wakeup per transaction cost a lot under load), after the first, in log order. The
    first, alone, is stamped from the counter; the later ones, staged while it is on
    its way (load), at least at the clock (here ahead of every counter), rising in log
    order even where the clock stands still."""

    async def scenario(store: TransactionStore) -> None:
        gate = hold_writes(monkeypatch)
        watch = store.watch_local_submits()
        first = asyncio.create_task(store.submit(_body()))
        try:
            async with asyncio.timeout(WAIT_S):
                while store._writer.writing is False:
                    await asyncio.sleep(0)  # the first write is on disk (held)
            later = [asyncio.create_task(store.submit(_body())) for _ in range(2)]
            async with asyncio.timeout(WAIT_S):
                while len(store.state.unsettled) < 3:
                    await asyncio.sleep(0)  # both staged, behind the held write
        finally:
            gate.set()
        handed = await asyncio.wait_for(anext(watch), WAIT_S)
        assert [s.tx_id for s in handed] == [(await first).tx_id]
        together = await asyncio.wait_for(anext(watch), WAIT_S)
        assert [s.tx_id for s in together] == [(await task).tx_id for task in later]
        assert [s.local_seq for s in (*handed, *together)] == [1, 2, 3]
        assert [s.ts for s in (*handed, *together)] == [1, 1_000, 1_001]
        await watch.aclose()

    _run(tmp_path, scenario, stamp_clock_us=lambda: 1_000)


async def _staged_submit(
    store: TransactionStore, key: str = ""
) -> tuple[asyncio.Task[Submitted], str]:
    """A submit whose write is held (``hold_writes``): its task and its transaction."""
    submitting = asyncio.create_task(store.submit(_body(), key))
    async with asyncio.timeout(WAIT_S):
        while not store.state.unsettled:
            await asyncio.sleep(0)  # staged: in memory, its write held
    (tx_id,) = store.state.unsettled
    return submitting, tx_id


def test_a_retried_submit_is_acknowledged_no_sooner_than_its_first_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry with the same key finds the transaction in memory while its write is
    still on disk: answered then, a crash before the fsync would lose a transaction
    the client was told the store holds."""

    async def scenario(store: TransactionStore) -> None:
        gate = hold_writes(monkeypatch)
        first, tx_id = await _staged_submit(store, "key-1")
        retry = asyncio.create_task(store.submit(_body(), "key-1"))
        await asyncio.sleep(0.05)
        assert not retry.done()
        gate.set()
        assert await asyncio.wait_for(retry, WAIT_S) == Submitted(tx_id, False, TxState.INCOMING)
        assert (await first).tx_id == tx_id

    _run(tmp_path, scenario)


def test_a_wait_is_answered_once_the_state_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory holds what is staged; a wait answers from what is written."""

    async def scenario(store: TransactionStore) -> None:
        gate = hold_writes(monkeypatch)
        submitting, tx_id = await _staged_submit(store)
        waiting = asyncio.create_task(store.wait(tx_id, TxState.INCOMING, WAIT_S))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        gate.set()
        record, reached = await asyncio.wait_for(waiting, WAIT_S)
        assert reached and record is not None and record.tx_id == tx_id
        await submitting

    _run(tmp_path, scenario)


def test_get_and_list_read_what_is_written_not_what_is_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit whose write is on disk is not there yet for Get and List; an outcome
    on its way to disk is not shown either (TESTING, never written alone, is). A state
    read from a staged write is one a crash may take back."""

    async def scenario(store: TransactionStore) -> None:
        gate = hold_writes(monkeypatch)
        submitting, tx_id = await _staged_submit(store, "key-1")
        assert store.state.tx(tx_id) is not None  # in memory
        with pytest.raises(Refusal, match="no transaction") as caught:
            store.get(tx_id)
        assert caught.value.kind is Refused.NOT_FOUND
        with pytest.raises(Refusal, match="idempotency key"):
            store.get_by_key("key-1")
        assert store.list_page(None, 10, 0) == ([], None)
        gate.set()
        await submitting
        assert store.get(tx_id).state is TxState.INCOMING
        assert store.get_by_key("key-1").tx_id == tx_id

        await _sync_local(store, tx_id, 1)
        gate.clear()
        testing = StateChangeRequest(tx_id, TxState.TESTING)
        ok = StateChangeRequest(tx_id, TxState.OK, outcome=_ok())
        advancing = asyncio.create_task(store.advance_states([testing, ok], "worker-dispatch"))

        def staged_ok() -> bool:
            record = store.state.tx(tx_id)  # memory: what is staged
            return record is not None and record.state is TxState.OK

        await until(staged_ok, "OK staged, its write held")
        seen = store.get(tx_id)
        assert (seen.state, seen.outcome, seen.position) == (TxState.TESTING, None, 1)
        assert [step.state for step in seen.history][-2:] == [TxState.ENQUEUED, TxState.TESTING]
        assert store.list_page(TxState.OK, 10, 0) == ([], None)
        assert [r.state for r in store.list_page(TxState.TESTING, 10, 0)[0]] == [TxState.TESTING]
        gate.set()
        await advancing
        seen = store.get(tx_id)
        assert seen.state is TxState.OK and seen.outcome == Outcome.of(_ok())
        assert [r.tx_id for r in store.list_page(TxState.OK, 10, 0)[0]] == [tx_id]

    _run(tmp_path, scenario)


def test_a_position_is_streamed_to_dispatch_only_once_its_synced_entry_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synced append still on its way to disk is one a crash may take back, and the
    agreed order may then put another transaction at that position: a worker fed the
    staged one would have applied the wrong transaction there. So however the follower
    is woken meanwhile, it waits for the write."""

    async def scenario(store: TransactionStore) -> None:
        tx_id = (await store.submit(_body())).tx_id
        gate = hold_writes(monkeypatch)
        syncing = asyncio.create_task(_sync_local(store, tx_id, 1))
        await until(lambda: store.state.synced_len == 1, "the synced append staged, held")
        assert store.state.txs[tx_id].state is TxState.ENQUEUED  # in memory
        follower = store.follow_enqueued(1)
        first = asyncio.create_task(anext(follower))
        await asyncio.sleep(0.05)
        store._notify()  # woken by something else, as any other durable write wakes it
        await asyncio.sleep(0.05)
        assert not first.done(), "streamed a position a crash may take back"
        gate.set()
        [(position, record)] = await asyncio.wait_for(first, WAIT_S)
        assert (position, record.tx_id) == (1, tx_id)
        await syncing
        await follower.aclose()

    _run(tmp_path, scenario)


def test_a_write_whose_caller_hung_up_still_wakes_the_others_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call that staged a write wakes its waiters as it resumes; cancelled (a
    client hanging up), it leaves that to a callback of the write, so a wait on its
    transaction is answered when the write is durable, not at some later write that
    may never come."""

    async def scenario(store: TransactionStore) -> None:
        gate = hold_writes(monkeypatch)
        submitting, tx_id = await _staged_submit(store)
        waiting = asyncio.create_task(store.wait(tx_id, TxState.INCOMING, WAIT_S))
        await asyncio.sleep(0)
        submitting.cancel()
        gate.set()
        _, reached = await asyncio.wait_for(waiting, WAIT_S / 2)
        assert reached

    _run(tmp_path, scenario)


def test_waits_are_bounded_with_a_share_per_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most WAITS_MAX waits, of which one caller holds three quarters at most: a
    client that waits on everything cannot refuse the others (issue 48)."""
    monkeypatch.setattr(store_core, "WAITS_MAX", 4)

    async def scenario(store: TransactionStore) -> None:
        tx_id = (await store.submit(_body())).tx_id

        def wait(caller: str) -> asyncio.Task[list[tuple[TxRecord | None, bool]]]:
            return asyncio.create_task(store.wait_many([tx_id], TxState.OK, 30, caller))

        waits = [wait("hog") for _ in range(3)]
        await asyncio.sleep(0)  # each is waiting now
        with pytest.raises(Refusal, match="hog holds 3 waits on transactions") as caught:
            await store.wait_many([tx_id], TxState.OK, 30, "hog")
        assert caught.value.kind is Refused.OVERLOADED
        waits.append(wait("app"))  # the quarter kept for others
        await asyncio.sleep(0)
        with pytest.raises(Refusal, match=r"in use here \(at most 4\)"):
            await store.wait_many([tx_id], TxState.OK, 30, "third")
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        record, reached = await store.wait(tx_id, TxState.INCOMING, 1)  # room again
        assert reached and record is not None
        assert store.waits.used == 0

    _run(tmp_path, scenario)


def test_a_wait_on_many_ends_when_the_last_arrives_or_at_its_timeout(tmp_path: Path) -> None:
    """``wait_many`` (a waiting ``SubmitBatch``) answers once every transaction reached the
    state, each in the order asked; at its timeout it answers where each one is. Either way
    it leaves no waiter behind."""

    async def scenario(store: TransactionStore) -> None:
        first, second = [(await store.submit(_body())).tx_id for _ in range(2)]
        unknown = str(uuid.uuid4())  # never heard of here
        both = asyncio.create_task(store.wait_many([first, second], TxState.ACCEPTED, 30))
        await _sync_local(store, first, 10)
        await asyncio.sleep(0.05)
        assert not both.done()  # the second is not there yet
        await _sync_local(store, second, 11)
        answers = await asyncio.wait_for(both, WAIT_S)
        assert [(record is not None and record.tx_id, reached) for record, reached in answers] == [
            (first, True),
            (second, True),
        ]

        answers = await store.wait_many([unknown, first], TxState.ACCEPTED, 0.1)
        assert [(record is not None, reached) for record, reached in answers] == [
            (False, False),
            (True, True),
        ]
        partly = await store.wait_many([first, second], TxState.OK, 0.1)
        assert [reached for _, reached in partly] == [False, False]
        assert not store._waiters  # nothing left listed to wake

    _run(tmp_path, scenario)


def test_follow_enqueued_and_local_submit_watch(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> None:
        first = (await store.submit(_body())).tx_id
        watched: list[LocalSubmit] = []

        async def watch() -> None:
            async for submits in store.watch_local_submits():
                watched.extend(submits)
                if len(watched) == 2:
                    return

        watcher = asyncio.create_task(watch())
        second = (await store.submit(_body())).tx_id
        await asyncio.wait_for(watcher, 5)
        assert [submit.tx_id for submit in watched] == [first, second]
        # Each comes with its body (the pending one read back, the new one as submitted),
        # for the coordinator to push without asking the store again.
        for submit in watched:
            assert submit.body == _body().SerializeToString()
            assert submit.digest == body_digest(submit.body)

        followed: list[tuple[int, str]] = []

        async def follow() -> None:
            async for ready in store.follow_enqueued(1):
                followed.extend((position, record.tx_id) for position, record in ready)
                if len(followed) == 2:
                    return

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        assert followed == []  # nothing is ENQUEUED yet
        await _sync_local(store, second, 1)
        await _sync_local(store, first, 2)
        await asyncio.wait_for(follower, 5)
        assert followed == [(1, second), (2, first)]

    _run(tmp_path, scenario)


def test_a_follower_that_gathers_takes_what_finished_meanwhile_in_one_batch(
    tmp_path: Path,
) -> None:
    async def finish(store: TransactionStore, tx_id: str, position: int) -> None:
        await store.advance_states(
            [
                StateChangeRequest(tx_id, TxState.TESTING),
                StateChangeRequest(tx_id, TxState.OK, _ok(tx_id, position)),
            ],
            "wd",
        )

    async def scenario(store: TransactionStore) -> None:
        ids = [(await store.submit(_body())).tx_id for _ in range(4)]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
        batches: asyncio.Queue[list[int]] = asyncio.Queue()

        async def follow(gather_s: float) -> None:
            async for ready in store.follow_enqueued(1, finished_only=True, gather_s=gather_s):
                await batches.put([position for position, _ in ready])

        # Without a gather, each transaction finished by a call of its own is a batch:
        # the follower runs while the next call's write is made durable.
        eager = asyncio.create_task(follow(0.0))
        for position, tx_id in enumerate(ids[:2], start=1):
            await finish(store, tx_id, position)
        assert [await batches.get(), await batches.get()] == [[1], [2]]
        eager.cancel()
        # With one, the first goes at once, and what finishes during the pause after it
        # (here: two calls, far within the longest gather) comes as one.
        gathering = asyncio.create_task(follow(FOLLOW_GATHER_MS_MOST / 1000))
        assert await batches.get() == [1, 2]
        await finish(store, ids[2], 3)
        await finish(store, ids[3], 4)
        assert await asyncio.wait_for(batches.get(), WAIT_S) == [3, 4]
        gathering.cancel()
        with pytest.raises(Refusal, match="gather_ms: at most 1000"):
            await anext(store.follow_enqueued(1, gather_s=1.5))

    _run(tmp_path, scenario)


def test_a_follower_pauses_only_after_a_small_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of ``FOLLOW_GATHER_BELOW`` positions or more says the load batches by
    itself: the next goes without the pause (under batched load a pause after each
    message only idled worker-dispatch's feed)."""
    monkeypatch.setattr(dispatch_calls, "FOLLOW_GATHER_BELOW", 3)

    finished = _finished

    async def scenario(store: TransactionStore) -> None:
        ids = [(await store.submit(_body())).tx_id for _ in range(5)]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
        changes = [c for p, t in enumerate(ids[:3], start=1) for c in finished(t, p)]
        await store.advance_states(changes, "wd")
        batches: asyncio.Queue[list[int]] = asyncio.Queue()

        async def follow() -> None:
            gather_s = FOLLOW_GATHER_MS_MOST / 1000
            async for ready in store.follow_enqueued(1, finished_only=True, gather_s=gather_s):
                await batches.put([position for position, _ in ready])

        following = asyncio.create_task(follow())
        assert await asyncio.wait_for(batches.get(), WAIT_S) == [1, 2, 3]
        # No pause after those three: the follower takes 4 while 5's write is made
        # durable, as a follower that does not gather does. (A pause after 1-3 would
        # have brought 4 and 5 as one batch.)
        await store.advance_states(finished(ids[3], 4), "wd")
        await store.advance_states(finished(ids[4], 5), "wd")
        assert await asyncio.wait_for(batches.get(), WAIT_S) == [4]
        assert await asyncio.wait_for(batches.get(), WAIT_S) == [5]
        following.cancel()

    _run(tmp_path, scenario)


def test_truncation_needs_every_peer_and_worker_past_it(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> list[str]:
        ids = [(await store.submit(_body())).tx_id for _ in range(4)]
        for ts, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, ts)
        with pytest.raises(Refusal) as caught:
            await store.truncate(3)
        assert caught.value.kind is Refused.PRECONDITION
        assert store.report_progress({"dc2": 3, "dc3": 2}, 4) == 0  # none finished
        assert "unfinished transactions at 0" in store.truncation_hold().held_by
        await store.advance_states(_finished(ids[0], 1) + _finished(ids[1], 2), "wd")
        assert store.truncatable_below() == 3
        await store.advance_states(_finished(ids[2], 3), "wd")
        assert store.truncation_hold() == TruncationHold(3, "peer dc3 at 2 (2 behind)")
        dropped, backups = await store.truncate(0)
        assert dropped == 2 and len(backups) == 1
        with pytest.raises(Refusal):
            store.get(ids[0])
        assert store.get(ids[2]).position == 3
        with pytest.raises(Refusal, match="truncated"):
            store.read_synced(1, 10)
        start, entries = store.read_synced(2, 10)
        assert start == MergeBase(2, ids[1]) and [m.tx_id for m in entries] == ids[2:]
        return ids

    ids = _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        assert store.state.synced_len == 4
        assert store.get(ids[3]).position == 4
        assert not _body_kept(store, ids[0]) and _body_kept(store, ids[3])

    _run(tmp_path, after_restart)


def test_automatic_rotation_keeps_everything(tmp_path: Path) -> None:
    async def scenario(store: TransactionStore) -> int:
        for _ in range(40):
            await store.submit(_body())
        # Closing would abandon a rotation still filing bodies: let one finish.
        await until(lambda: any((tmp_path / "txlog").glob("bak-*.dat")), "a rotation")
        return len(store.state.txs)

    count = _run(tmp_path, scenario, log_file_bytes_max=2_000)
    assert count == 40
    assert list((tmp_path / "txlog").glob("bak-*.dat"))

    async def after_restart(store: TransactionStore) -> None:
        assert len([r for r in store.state.in_seq_order()]) == 40

    _run(tmp_path, after_restart)


def test_a_shutdown_abandons_a_rotation_still_filing_bodies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a long partition a rotation files every body since the last one it cannot
    carry (tens of seconds; here it carries none): a graceful shutdown stops it between
    two files instead of waiting, and the log it would have retired stays whole. The
    next rotation keeps what it had filed (checked, not rewritten)."""
    written: list[str] = []
    write = BodyStore.write

    async def scenario(store: TransactionStore) -> list[str]:
        def held(bodies: BodyStore, tx_id: str, encoded: bytes, *, durably: bool = False) -> None:
            # The first file is written as the shutdown begins.
            assert store._closing.wait(WAIT_S), "the store never closed"
            written.append(tx_id)
            write(bodies, tx_id, encoded, durably=durably)

        monkeypatch.setattr(BodyStore, "write", held)
        monkeypatch.setattr(TransactionStore, "_carry_budget", lambda store: 0)
        ids = [(await store.submit(_body())).tx_id for _ in range(40)]
        await until(lambda: store._rotating, "a rotation")
        return ids

    ids = _run(tmp_path, scenario, log_file_bytes_max=2_000)
    assert len(written) == 1 and not list((tmp_path / "txlog").glob("bak-*.dat"))
    monkeypatch.undo()
    monkeypatch.setattr(TransactionStore, "_carry_budget", lambda store: 0)
    # The next rotation keeps the whole file it finds, and rewrites a torn one.
    bodies = BodyStore(tmp_path / "txlog" / "transactions")
    kept = bodies.path(written[0]).stat().st_ino
    torn = next(tx_id for tx_id in ids if tx_id != written[0])
    bodies.path(torn).parent.mkdir(exist_ok=True)
    bodies.path(torn).write_bytes(gzip_body(_body().SerializeToString())[:10])

    async def after_restart(store: TransactionStore) -> None:
        await store.truncate(0)
        assert bodies.path(written[0]).stat().st_ino == kept
        for tx_id in ids:
            assert store.bodies.read(tx_id) == (await store.read_encoded_body(tx_id))

    _run(tmp_path, after_restart)


def test_rotations_asked_at_once_take_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's truncate can meet an automatic rotation: filing the same bodies at
    once, each would truncate the other's temporary file, and one could retire the log
    while the other still rewrote a file it had renamed. (Bodies a rotation carries
    are not filed: here it carries none.)"""
    monkeypatch.setattr(TransactionStore, "_carry_budget", lambda store: 0)

    async def scenario(store: TransactionStore) -> list[str]:
        ids: list[str] = []
        for start in range(0, 300, 50):
            results = await store.submit_many(
                [(_body(f"INSERT INTO t VALUES ({n})"), "", "") for n in range(start, start + 50)]
            )
            ids += [r.tx_id for r in results if isinstance(r, Submitted)]
        assert [
            dropped for dropped, _ in await asyncio.gather(*[store.truncate(0) for _ in range(3)])
        ] == [0] * 3
        assert all(store.bodies.holds(tx_id) for tx_id in ids)
        return ids

    ids = _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        for n, tx_id in enumerate(ids):
            body = await store.read_body(tx_id)
            assert body is not None and body.statements[0].sql.endswith(f"({n})")

    _run(tmp_path, after_restart)


def test_a_rotation_files_the_bodies_it_keeps_and_no_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body lives in its log entry until a rotation retires the entry: only then, and
    only for a transaction the rotation keeps and cannot carry into the new file (here
    none), is its file written (durably, before the
    log is rotated). A truncated transaction never gets one: creating files cost the
    store more CPU than anything else under batched load."""

    monkeypatch.setattr(TransactionStore, "_carry_budget", lambda store: 0)

    async def submit(store: TransactionStore) -> list[str]:
        ids = [(await store.submit(_body(f"INSERT INTO t VALUES ({n})"))).tx_id for n in range(4)]
        assert not any(store.bodies.holds(tx_id) for tx_id in ids)
        return ids

    ids = _run(tmp_path, submit)

    async def after_restart(store: TransactionStore) -> None:
        for n, tx_id in enumerate(ids):  # read back from the log
            body = await store.read_body(tx_id)
            assert body is not None and body.statements[0].sql.endswith(f"({n})")
        assert not any(store.bodies.holds(tx_id) for tx_id in ids)
        for ts, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, ts)
        store.report_progress({"dc2": 4, "dc3": 4}, 2)
        await store.advance_states(_finished(ids[0], 1) + _finished(ids[1], 2), "wd")
        dropped, _ = await store.truncate(0)
        assert dropped == 2
        assert [store.bodies.holds(tx_id) for tx_id in ids] == [False, False, True, True]

    _run(tmp_path, after_restart)

    async def after_rotation(store: TransactionStore) -> None:
        for n, tx_id in enumerate(ids[2:], start=2):  # read back from the files
            body = await store.read_body(tx_id)
            assert body is not None and body.statements[0].sql.endswith(f"({n})")
        assert await store.read_body(ids[0]) is None

    _run(tmp_path, after_rotation)


def _proposal(
    view_no: int,
    members: list[str],
    seal: list[TxMeta],
    *,
    applied_position: int = 0,
    configured_too: tuple[str, ...] = (),
) -> ViewProposal:
    """View ``view_no`` of ``members``, configured with them and ``configured_too``."""
    weights = tuple((node, 1) for node in sorted([*members, *configured_too]))
    return ViewProposal(
        View(view_no, tuple(members)),
        MergeBase.genesis(),
        tuple(seal),
        Configuration(weights, applied_position),
    )


def test_views_votes_and_forgotten_metas_survive_restart_and_rotation(tmp_path: Path) -> None:
    """What a view change makes durable: the vote, the installed view (clearing the vote)
    and forgotten foreign metas; an origin's own transactions are never forgotten."""
    foreign = [TxMeta(n, str(uuid.uuid4()), "dc3") for n in (1, 2)]
    pushed_first = foreign[1]
    vote = PersistViewVote(Ballot(1, 1, "dc2"), None, None)

    async def scenario(store: TransactionStore) -> str:
        local = (await store.submit(_body())).tx_id
        await store.persist_step(
            ProtocolStep(
                counter=2,
                incoming=[*foreign, TxMeta(3, local, "dc1")],
                changes=[StateChangeRequest(m.tx_id, TxState.INCOMING) for m in foreign],
                service="sc",
                vote=vote,
            )
        )
        assert store.state.vote == vote and store.state.view_no == 0
        # A peer's push stored this body just before the core, not yet told, forgot it.
        body = _body("INSERT INTO t VALUES (2)").SerializeToString()
        await _push_body(store, pushed_first.tx_id, body, hashlib.sha256(body).digest())
        for refused in (local, str(uuid.uuid4())):
            with pytest.raises(Refusal) as caught:
                await store.persist_step(
                    ProtocolStep(
                        service="sc",
                        forgotten=[refused],
                    )
                )
            assert caught.value.kind is Refused.PRECONDITION
        await store.persist_step(
            ProtocolStep(
                service="sc",
                forgotten=[m.tx_id for m in foreign],
                installed_view=_proposal(1, ["dc1", "dc2"], []),
            )
        )
        with pytest.raises(Refusal, match="not newer"):
            await store.persist_step(
                ProtocolStep(
                    service="sc",
                    installed_view=_proposal(1, ["dc1", "dc2"], []),
                )
            )
        await store.truncate(0)  # a rotation: the snapshot must carry the view too
        return local

    local = _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        state = store.state
        assert state.view is not None and state.view_no == 1
        assert list(state.view.view.members) == ["dc1", "dc2"]
        assert state.vote is None, "installing a view clears the vote"
        assert set(state.incoming) == {local}
        assert foreign[0].tx_id not in state.txs
        kept = state.txs[pushed_first.tx_id]
        assert kept.body_held and kept.meta is None, "a held body outlives its forgotten meta"

    _run(tmp_path, after_restart)


def test_a_view_install_may_forget_the_largest_incoming_queue_in_one_step(
    tmp_path: Path,
) -> None:
    """An install forgets every foreign meta it cannot get a body for, in one step: up to
    the whole queue the coordinator may hold. The store once took 16,384 forgotten metas
    per step, a quarter of ``--incoming-txs-max``: an install over that was refused, and
    the coordinator, learning of the install again after each restart, stopped again."""
    foreign = [TxMeta(n, str(uuid.uuid4()), "dc3") for n in range(1, INCOMING_TXS_MOST + 1)]

    async def scenario(store: TransactionStore) -> None:
        for start in range(0, len(foreign), PERSIST_METAS_MAX):
            chunk = foreign[start : start + PERSIST_METAS_MAX]
            await store.persist_step(
                ProtocolStep(counter=chunk[-1].ts, incoming=chunk, service="sc")
            )
        assert len(store.state.incoming) == INCOMING_TXS_MOST
        with pytest.raises(Refusal, match=f"at most {INCOMING_TXS_MOST} forgotten") as over:
            await store.persist_step(
                ProtocolStep(
                    service="sc", forgotten=[m.tx_id for m in foreign] + [str(uuid.uuid4())]
                )
            )
        assert over.value.kind is Refused.INVALID
        await store.persist_step(
            ProtocolStep(
                service="sc",
                forgotten=[m.tx_id for m in foreign],
                installed_view=_proposal(1, ["dc1", "dc2"], []),
            )
        )

    _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        assert store.state.view_no == 1
        assert not store.state.incoming
        assert not any(m.tx_id in store.state.txs for m in foreign)

    _run(tmp_path, after_restart)


def _list_all(
    store: TransactionStore, state: TxState | None, page_size: int
) -> tuple[list[str], int]:
    """Every transaction ``List`` pages through, in order, and the calls it took."""
    listed: list[str] = []
    after, calls = 0, 0
    while True:
        page, last = store.list_page(state, page_size, after)
        calls += 1
        listed += [record.tx_id for record in page]
        if last is None:
            return listed, calls
        after = last


def test_list_looks_at_a_bounded_number_of_transactions_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``List`` call looks at no more than ``LIST_SCAN_MAX`` transactions, and starts
    where its token says, not at the first one: paging a rare state through many once
    walked them all on every call. Short pages and forgotten transactions lose nothing,
    before and after a restart from a rotated log (its snapshot)."""
    monkeypatch.setattr(client_calls, "LIST_SCAN_MAX", 4)
    foreign = [TxMeta(n, str(uuid.uuid4()), "dc3") for n in range(1, 11)]
    forgotten = {meta.tx_id for meta in foreign[::2]}

    def in_seq_order(store: TransactionStore) -> list[str]:
        records = [r for r in store.state.txs.values() if r.history]
        return [r.tx_id for r in sorted(records, key=lambda r: r.seq)]

    def check(store: TransactionStore) -> None:
        expected = in_seq_order(store)
        assert len(expected) == 20 and not forgotten & set(expected)
        assert _list_all(store, None, 3) == (expected, 7)  # pages of 3
        assert _list_all(store, None, 1000) == (expected, 5)  # 4 looked at per call
        assert _list_all(store, TxState.ACCEPTED, 1000) == ([], 5)  # none: empty pages
        local = [tx_id for tx_id in expected if store.state.txs[tx_id].local]
        assert _list_all(store, TxState.INCOMING, 1000)[0] == expected and len(local) == 15

    async def scenario(store: TransactionStore) -> None:
        for _ in range(10):
            await store.submit(_body())
        await store.persist_step(ProtocolStep(counter=10, incoming=foreign, service="sc"))
        await store.persist_step(ProtocolStep(service="sc", forgotten=sorted(forgotten)))
        for _ in range(5):
            await store.submit(_body())
        check(store)
        await store.truncate(0)  # the next start replays from its snapshot

    _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        check(store)

    _run(tmp_path, after_restart)


def test_membership_entries_come_one_at_a_time_and_only_from_the_admin_api(
    tmp_path: Path,
) -> None:
    change = common_pb2.MembershipChange(node_id="dc4", weight=1, url="127.0.0.1:7401")

    async def scenario(store: TransactionStore) -> None:
        with pytest.raises(Refusal, match="admin API") as refused:
            await store.submit(common_pb2.TxBody(membership=change))
        assert refused.value.kind is Refused.INVALID
        first = await store.change_membership(change)
        assert store.get(first.tx_id).membership
        with pytest.raises(Refusal, match="one change at a time") as waiting:
            await store.change_membership(common_pb2.MembershipChange(node_id="dc3"))
        assert waiting.value.kind is Refused.PRECONDITION
        meta = await _sync_local(store, first.tx_id, 1)
        with pytest.raises(Refusal, match="one change at a time"):  # synced, not applied
            await store.change_membership(common_pb2.MembershipChange(node_id="dc3"))
        applied = _proposal(1, ["dc1"], [], applied_position=1)
        await store.persist_step(
            ProtocolStep(
                service="sc",
                installed_view=applied,
            )
        )
        await store.change_membership(common_pb2.MembershipChange(node_id="dc3"))
        followed = store.follow_enqueued(1, membership_only=True)
        [(position, record)] = await anext(followed)
        assert (position, record.tx_id) == (1, meta.tx_id)
        await followed.aclose()
        for bad in (
            common_pb2.MembershipChange(node_id="", weight=1),
            common_pb2.MembershipChange(node_id="dc5", weight=5_000),
            common_pb2.MembershipChange(node_id="dc5", weight=1, url="no-port"),
        ):
            with pytest.raises(Refusal) as invalid_change:
                await store.change_membership(bad)
            assert invalid_change.value.kind is Refused.INVALID

    _run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("sql", "found"),
    [
        ("INSERT INTO t VALUES (random())", "random()"),
        ("UPDATE t SET at = CURRENT_TIMESTAMP", "current_timestamp"),
        ("INSERT INTO t VALUES (datetime('now'))", "'now'"),
        ("INSERT INTO t SELECT now()", "now()"),
        ("INSERT INTO t VALUES (last_insert_rowid())", "last_insert_rowid()"),
        ("INSERT INTO t VALUES ('random() is only text here')", None),
        ("INSERT INTO t (randomness, now_column) VALUES (?, ?)", None),
    ],
)
def test_statements_that_differ_per_worker_are_refused_at_submit(
    tmp_path: Path, sql: str, found: str | None
) -> None:
    assert nondeterminism(sql) == found

    async def scenario(store: TransactionStore) -> None:
        if found is None:
            await store.submit(_body(sql))
            return
        with pytest.raises(Refusal, match="as a parameter") as refused:
            await store.submit(_body(sql))
        assert refused.value.kind is Refused.INVALID

    _run(tmp_path, scenario)
    _run(tmp_path / "allowed", lambda store: store.submit(_body(sql)), allow_nondeterministic=True)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE t SET at = CURRENT_TIMESTAMP",
        "INSERT INTO t VALUES (datetime('now'))",
        "CREATE TABLE s (k, at DEFAULT CURRENT_DATE)",
    ],
)
def test_a_body_with_its_own_time_may_read_the_clock(tmp_path: Path, sql: str) -> None:
    """The workers read 'now' and ``CURRENT_*`` as the body's ``now_unix_us``
    (``sqlite_guard``), so the early check lets them through when it is set; the
    machine's zone (``localtimestamp``) and chance stay refused."""
    timed = _body(sql)
    timed.now_unix_us = 1_700_000_000_000_000
    assert nondeterminism(sql, has_now=True) is None
    assert nondeterminism("SELECT localtimestamp", has_now=True) == "localtimestamp"
    assert nondeterminism("SELECT random()", has_now=True) == "random()"
    _run(tmp_path, lambda store: store.submit(timed))


@pytest.mark.parametrize("now_unix_us", [-62_135_596_800_000_001, 253_402_300_800_000_000])
def test_a_time_sqlite_cannot_read_is_refused(tmp_path: Path, now_unix_us: int) -> None:
    body = _body()
    body.now_unix_us = now_unix_us

    async def scenario(store: TransactionStore) -> None:
        with pytest.raises(Refusal, match=r"now_unix_us: .* outside 0001-01-01"):
            await store.submit(body)

    _run(tmp_path, scenario)


def _learn_and_sync(store: TransactionStore, meta: TxMeta, *states: TxState) -> ProtocolStep:
    """A coordinator's step that learns ``meta``, appends it to the synced queue and (as
    the core does) reports ``states`` for it."""
    return ProtocolStep(
        counter=meta.ts,
        incoming=[meta],
        synced_start=store.state.merge_base,
        synced=[meta],
        changes=[StateChangeRequest(meta.tx_id, state) for state in states],
        service="sync-coordinator",
    )


def test_a_synced_body_is_enqueued_by_its_own_record_with_no_coordinator_step(
    tmp_path: Path,
) -> None:
    """ENQUEUED follows from two durable facts, the synced append and the body's record,
    and is written by neither: a coordinator killed between a body's record and its next
    step (the nemesis run once found 14 positions stranded ACCEPTED so) leaves it
    ENQUEUED, and a restart finds it so."""

    async def synced_then_body(store: TransactionStore) -> str:
        tx_id = str(uuid.uuid4())
        meta = TxMeta(1, tx_id, "dc2")
        await store.persist_step(_learn_and_sync(store, meta, TxState.INCOMING, TxState.ACCEPTED))
        assert store.state.txs[tx_id].state is TxState.ACCEPTED
        follow = store.follow_enqueued(1)
        waiting = asyncio.ensure_future(anext(follow))
        await asyncio.sleep(0)
        assert not waiting.done()
        encoded = _body().SerializeToString()
        assert await _push_body(store, tx_id, encoded, body_digest(encoded))
        [(position, record)] = await asyncio.wait_for(waiting, 60)
        assert (position, record.tx_id, record.state) == (1, tx_id, TxState.ENQUEUED)
        await follow.aclose()
        return tx_id  # and the coordinator dies before stepping BodyAcquired

    tx_id = _run(tmp_path, synced_then_body)

    async def after_restart(store: TransactionStore) -> None:
        record = store.state.txs[tx_id]
        states = [(step.state, step.service) for step in record.history]
        assert states == [
            (TxState.INCOMING, "sync-coordinator"),
            (TxState.ACCEPTED, "sync-coordinator"),
            (TxState.ENQUEUED, "sync-coordinator"),
        ]
        await store.load_protocol_state(LOCAL_ADMIT)
        assert store.state.txs[tx_id].state is TxState.ENQUEUED

    _run(tmp_path, after_restart)


def test_a_step_stores_the_peers_bodies_it_acquires_in_its_own_batch(tmp_path: Path) -> None:
    """A pushed body and the step that tells the core of it share one batch, one fsync,
    and the body is held (and enqueued with the synced append) once it is durable; a body
    held already is skipped, and one that fails its checks fails the whole step."""

    async def scenario(store: TransactionStore) -> None:
        tx_id = str(uuid.uuid4())
        encoded = _body().SerializeToString()
        step = _learn_and_sync(store, TxMeta(1, tx_id, "dc2"), TxState.INCOMING)
        batches_before = work.counts[work.LOG_BATCHES]
        await store.persist_step(
            dataclasses.replace(step, bodies=[(tx_id, encoded, body_digest(encoded), "")])
        )
        assert work.counts[work.LOG_BATCHES] == batches_before + 1
        assert store.state.txs[tx_id].state is TxState.ENQUEUED
        assert await store.read_encoded_body(tx_id) == encoded
        entries_before = work.counts[work.LOG_ENTRIES]
        await store.persist_step(
            ProtocolStep(counter=2, bodies=[(tx_id, encoded, body_digest(encoded), "")])
        )
        assert work.counts[work.LOG_ENTRIES] == entries_before + 1  # the counter alone

        other = str(uuid.uuid4())
        before = (store.state.counter, store.files.current_bytes)
        with pytest.raises(Refusal) as caught:
            await store.persist_step(
                ProtocolStep(
                    counter=9,
                    incoming=[TxMeta(9, other, "dc2")],
                    bodies=[(other, encoded, b"\x00" * 32, "")],
                )
            )
        assert caught.value.kind is Refused.CORRUPT
        assert (store.state.counter, store.files.current_bytes) == before
        assert other not in store.state.txs

    _run(tmp_path, scenario)


def test_implied_states_cost_no_entries_and_old_logs_replay_the_same(tmp_path: Path) -> None:
    """A step that learns, syncs and holds a transaction writes its meta and synced
    append but no state entry; a log written before (the same facts followed by the
    coordinator's INCOMING, ACCEPTED and ENQUEUED entries) replays to the same history."""
    tx_id = str(uuid.uuid4())
    meta = TxMeta(1, tx_id, "dc2")
    encoded = _body().SerializeToString()

    async def scenario(store: TransactionStore) -> list[txlog_pb2.LogEntry]:
        assert await _push_body(store, tx_id, encoded, body_digest(encoded))
        staged = await store.stage_step(
            _learn_and_sync(store, meta, TxState.INCOMING, TxState.ACCEPTED, TxState.ENQUEUED)
        )
        await store.finish_step(staged)
        assert [e.WhichOneof("entry") for e in staged.entries] == ["counter", "meta_known",
                                                                   "synced"]  # fmt: skip
        assert store.state.txs[tx_id].state is TxState.ENQUEUED
        return staged.entries

    entries = _run(tmp_path, scenario)
    old_style = [
        *entries,
        *(
            txlog_pb2.LogEntry(
                at_unix_ms=entries[-1].at_unix_ms + 5,
                state=txlog_pb2.StateMoved(
                    tx_id=tx_id, state=common_pb2.TxState.ValueType(s), service="sync-coordinator"
                ),
            )
            for s in (TxState.INCOMING, TxState.ACCEPTED, TxState.ENQUEUED)
        ),
    ]
    new, old = StoreState("dc1"), StoreState("dc1")
    for replayed, log in ((new, entries), (old, old_style)):
        replayed.apply(
            txlog_pb2.LogEntry(
                body_stored=txlog_pb2.BodyStored(
                    tx_id=tx_id, body_digest=body_digest(encoded), body_bytes=len(encoded)
                )
            )
        )
        moved = [m for entry in log for m in replayed.apply(entry)]
        assert [m.step.state for m in moved] == [TxState.INCOMING, TxState.ACCEPTED,
                                                 TxState.ENQUEUED]  # fmt: skip
    assert new.txs[tx_id].history == old.txs[tx_id].history


def test_truncation_follows_the_whole_set_of_peers_and_keeps_the_newest_history(
    tmp_path: Path,
) -> None:
    """The coordinator's report names every peer and replaces the last one (a removed
    peer holds nothing back); the newest ``history_kept`` positions stay whatever was
    passed; a rotation leaves ``backups_kept`` bak- files."""

    async def scenario(store: TransactionStore) -> tuple[object, ...]:
        ids = [(await store.submit(_body(), idempotency_key=f"k{n}")).tx_id for n in range(6)]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
            await store.advance_states(_finished(tx_id, position), "wd")
        assert store.truncation_hold() == TruncationHold(
            0, "the sync-coordinator, which has not reported the peers yet at 0 (6 behind)"
        )
        store.report_progress({"dc2": 6, "dc3": 1}, None, peers_reported=True)
        assert "worker-dispatch" in store.truncation_hold().held_by
        store.report_progress({}, 6)
        assert store.truncation_hold() == TruncationHold(2, "peer dc3 at 1 (5 behind)")
        # dc3 removed. The answer says what the others allow; the core heard of 3 so far.
        allowed = store.report_progress({"dc2": 6}, None, peers_reported=True, core_history_len=3)
        assert allowed == 5
        assert store.truncation_hold() == TruncationHold(
            4, "the sync-coordinator's core at 3 (3 behind)"
        )
        assert store.truncation_hold(with_core=False) == TruncationHold(5, "")  # 2 newest kept
        store.report_progress({"dc2": 6}, None, peers_reported=True, core_history_len=6)
        assert store.truncation_hold() == TruncationHold(5, "")
        for _ in range(3):
            await store.truncate(0)
        assert store.state.synced_offset == 4 and len(store.state.txs) == 2
        assert len(list((tmp_path / "txlog").glob("bak-*.dat"))) == 1
        assert store.progress.truncated_total == 4
        return _state_view(store)

    kept = _run(tmp_path, scenario, history_kept=2, backups_kept=1)

    async def after_restart(store: TransactionStore) -> None:
        assert _state_view(store) == kept  # truncated in place as the snapshot replays

    _run(tmp_path, after_restart)


def test_a_peer_further_behind_than_the_hold_bound_is_let_go(tmp_path: Path) -> None:
    """``--peer-hold-max``: a peer whose order is further behind is let go, and holds
    nothing, if truncation then passes its order's end; one whose order is recent holds
    what its bodies lack, however far; one the coordinator does not name (it sent it
    something lately) is not let go."""

    async def scenario(store: TransactionStore) -> None:
        await _finished_here(store, 6)
        store.report_progress({"dc2": 1}, 6, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(2, "peer dc2 at 1 (5 behind)")
        store.report_progress({"dc2": 1}, None, peers_reported=True, peers_ordered={"dc2": 6})
        assert store.truncation_hold().below == 2  # ordering, and fetching bodies
        # Ordered to 3, the slowest worker at 3: truncating to 3 would leave dc2 served
        # from position 4 on, without the bodies of 2 and 3. It is not let go.
        store.report_progress({"dc2": 1}, 3, peers_reported=True, peers_ordered={"dc2": 3})
        assert store.truncation_hold() == TruncationHold(2, "peer dc2 at 1 (5 behind)")
        store.report_progress({"dc2": 1}, 6, peers_reported=True, peers_ordered={"dc2": 3})
        assert store.truncation_hold() == TruncationHold(7, "", (("peer dc2", 3),))
        await store.truncate(0)
        assert store.state.synced_offset == 5  # past dc2's 3 (the merge base stays)
        store.report_progress({"dc2": 6}, None, peers_reported=True, peers_ordered={"dc2": 6})
        assert store.truncation_hold().let_go == ()

    _run(tmp_path, scenario, history_kept=0, history_kept_ms=0, peer_hold_max=2)


def test_how_far_each_peer_ordered_is_kept_across_restarts(tmp_path: Path) -> None:
    """Each truncation records how far each peer's order came (every peer the
    coordinator heard from, ``peers_posted``), and every snapshot carries it: a
    coordinator that restarted while a peer was away (and never heard from it) names it
    at that length, and the store lets it go past the bound. Before, such a store held
    every transaction until the peer came back (``bench.soak --dc-down-s``). A peer heard
    from again is recorded anew; one out of the configuration goes."""

    async def recorded(store: TransactionStore) -> None:
        await _finished_here(store, 6)
        # dc2 posts every round (sent things lately): not named for letting go.
        store.report_progress({"dc2": 1}, 6, peers_reported=True, peers_posted={"dc2": 3})
        await store.truncate_in_place()
        assert store.state.synced_offset == 1 and store.state.peers_ordered == {"dc2": 3}

    _run(tmp_path, recorded, peer_hold_max=2)

    async def coordinator_restarted(store: TransactionStore) -> None:
        assert store.state.peers_ordered == {"dc2": 3}  # replayed from the entry
        # Not heard from since the coordinator started: 0, and no order named.
        store.report_progress({"dc2": 0}, 6, peers_reported=True)
        assert store.truncation_hold().held_by.startswith("peer dc2 at 0")
        await store.truncate(0)  # a rotation: its snapshot keeps the record
        assert store.state.peers_ordered == {"dc2": 3}
        # Named at the recorded length (``ServedPeers.orders``, 10 s on): let go.
        store.report_progress({"dc2": 0}, 6, peers_reported=True, peers_ordered={"dc2": 3})
        assert store.truncation_hold().let_go == (("peer dc2", 3),)
        await store.truncate_in_place()
        assert store.state.synced_offset == 5 and store.state.peers_ordered == {"dc2": 3}

    _run(tmp_path, coordinator_restarted, peer_hold_max=2)

    async def came_back(store: TransactionStore) -> None:
        assert store.state.peers_ordered == {"dc2": 3}  # replayed from the snapshot too
        await _finished_here(store, 2, from_position=7)
        # Back from a copy at 7, heard from: recorded anew with the next truncation.
        store.report_progress({"dc2": 7}, 8, peers_reported=True, peers_posted={"dc2": 7})
        await store.truncate_in_place()
        assert store.state.synced_offset == 7 and store.state.peers_ordered == {"dc2": 7}

    _run(tmp_path, came_back, peer_hold_max=2)


def test_truncation_passes_a_removed_nodes_order_whole_or_not_at_all(tmp_path: Path) -> None:
    """A node the configuration left out may be added again, and catches up from the
    logs where its order ends past the history's start: bodies it lacks below that start
    were gone everywhere (the simulator: invariant 5, seed 1446 of `membership`). So
    truncation stays where it is until it can pass the synced end at the removal; the
    rotation's snapshot keeps that end across a restart."""

    async def removed(store: TransactionStore) -> None:
        await _finished_here(store, 4)
        await store.persist_step(
            ProtocolStep(service="sc", installed_view=_proposal(1, ["dc1", "dc2", "dc3"], []))
        )
        assert store.state.removed_order_end == 0  # the initial configuration: no change
        store.report_progress({"dc2": 4, "dc3": 2}, 4, peers_reported=True)
        await store.truncate_in_place()
        assert store.state.synced_offset == 2
        # dc3 removed by the entry at 4: it may have ordered up to 4, bodies held to 2.
        without = _proposal(2, ["dc1", "dc2"], [], applied_position=4)
        await store.persist_step(ProtocolStep(service="sc", installed_view=without))
        assert store.state.removed_order_end == 4
        store.report_progress({"dc2": 3}, 4, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(
            3, "a removed node, whose order may reach 4, at 2 (2 behind)"
        )
        await store.truncate(0)  # a rotation: its snapshot keeps the end
        assert store.state.synced_offset == 2

    _run(tmp_path, removed)

    async def restarted(store: TransactionStore) -> None:
        assert store.state.removed_order_end == 4  # from the snapshot
        store.report_progress({"dc2": 3}, 4, peers_reported=True)
        assert store.truncation_hold().below == 3
        await _finished_here(store, 1, from_position=5)
        store.report_progress({"dc2": 5}, 5, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(6, "")  # passes it whole

    _run(tmp_path, restarted)


def test_history_is_truncated_in_place_between_rotations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the reports let ``TRUNCATION_STEP`` more positions go, the store drops them
    from memory by an entry in the current file, with no rotation: memory follows what
    is unfinished and recent, not what the current file covers. Bodies an earlier
    rotation filed go with them; a restart replays to the same state."""
    monkeypatch.setattr(rotation, "TRUNCATION_STEP", 3)
    monkeypatch.setattr(TransactionStore, "_carry_budget", lambda self: 0)  # file them all

    async def scenario(store: TransactionStore) -> tuple[object, ...]:
        ids = [(await store.submit(_body(), idempotency_key=f"k{n}")).tx_id for n in range(8)]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
        await store.truncate(0)  # nothing reported: keeps all, files the first bodies
        assert all(store.bodies.holds(tx_id) for tx_id in ids)
        for position, tx_id in enumerate(ids, start=1):
            await store.advance_states(_finished(tx_id, position), "wd")
        late = (await store.submit(_body(), idempotency_key="late")).tx_id
        backups = sorted((tmp_path / "txlog").glob("bak-*.dat"))
        assert store.report_progress({"dc2": 8}, 2, peers_reported=True) == 3
        assert store._truncation is None, "2 positions may go, fewer than a step"
        store.report_progress({}, 8)  # the slowest worker passed 8: 6 may go, 2 kept
        await until(lambda: store.state.synced_offset == 6, "truncated in place")
        assert sorted((tmp_path / "txlog").glob("bak-*.dat")) == backups, "no rotation"
        assert set(store.state.txs) == {*ids[6:], late}
        # The records that went are let go at once: a list of them in seq order kept
        # them alive, histories and all, until they were as many as the held ones.
        assert [r.tx_id for r in store.state._seq_order] == [*ids[6:], late]
        assert set(store.state.idempotency) == {"k6", "k7", "late"}
        assert sorted(store._unfiled) == [late]
        # Its counters move once the files are deleted, after the deleting thread ends.
        await until(lambda: store._truncation is None, "the truncation finished")
        assert not any(store.bodies.holds(t) for t in ids[:6]), "files deleted"
        assert all(store.bodies.holds(tx_id) for tx_id in ids[6:])
        assert store.progress.truncated_in_place == store.progress.truncated_total == 6
        with pytest.raises(Refusal, match="it was OK, and its history is truncated"):
            store.get(ids[0])
        with pytest.raises(Refusal, match="truncated"):
            store.read_synced(3, 10)
        # A client still waiting on one is answered from its kept verdict, at once.
        assert await store.wait_many([ids[0]], TxState.ACCEPTED, WAIT_S) == [(None, True)]
        verdict = store.truncated_verdicts[ids[0]]
        answered = common_pb2.Outcome()
        verdict.into(answered)
        assert verdict.state is TxState.OK and answered == _ok()
        unknown = str(uuid.uuid4())
        assert await store.wait_many([unknown], TxState.OK, 0.01) == [(None, False)]
        assert await _waited_over_grpc(store, ids[0]) == (True, common_pb2.TX_STATE_OK, 1)
        assert await _waited_over_grpc(store, unknown) == (
            False,
            common_pb2.TX_STATE_UNSPECIFIED,
            0,
        )
        return _state_view(store)

    kept = _run(tmp_path, scenario, history_kept=2)

    async def after_restart(store: TransactionStore) -> None:
        assert _state_view(store) == kept
        assert len(store._unfiled) == 1

    _run(tmp_path, after_restart)


async def _waited_over_grpc(store: TransactionStore, tx_id: str) -> tuple[bool, int, int]:
    """A client's Wait for OK, through the real service: (reached, state, position)."""
    answer = await _wait_over_grpc(
        store,
        client_pb2.WaitRequest(
            tx_id=tx_id, state=common_pb2.TX_STATE_OK, timeout=Duration(nanos=10_000_000)
        ),
    )
    return answer.reached, answer.state, answer.outcome.position


async def _wait_over_grpc(
    store: TransactionStore, request: client_pb2.WaitRequest
) -> client_pb2.WaitResponse:
    """``request`` answered by the store's real ``ClientService`` on a loopback port."""
    server = new_server()
    add_service(server, ClientServicer(store), CLIENT_SERVICE)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return await client_pb2_grpc.ClientServiceStub(channel).Wait(request, timeout=WAIT_S)
    finally:
        await server.stop(None)


def test_batches_wait_undecoded_while_one_is_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three ``SubmitBatch`` calls at once, over the real server: while the first one's
    write is on disk, the other two wait for it as the bytes they came in, decoded
    only when their turn comes (``SUBMIT_BATCHES_STAGED``); then every submit of the
    three is taken once."""

    async def scenario(store: TransactionStore) -> None:
        server = new_server()
        add_service(server, ClientServicer(store), CLIENT_SERVICE, undecoded=UNDECODED)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        queued, decoded = work.counts[work.SUBMIT_BATCHES_QUEUED], work.REQUESTS_DECODED_LATE
        decoded_before = work.counts[decoded]
        gate = hold_writes(monkeypatch)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                calls = [
                    stub.SubmitBatch(
                        client_pb2.SubmitBatchRequest(
                            submits=[
                                client_pb2.SubmitRequest(body=_body(), idempotency_key=f"b{n}-{i}")
                                for i in range(100)
                            ]
                        ),
                        timeout=WAIT_S,
                    )
                    for n in range(3)
                ]
                try:
                    await until(
                        lambda: work.counts[work.SUBMIT_BATCHES_QUEUED] == queued + 2,
                        "two batches queued behind the first",
                    )
                    assert work.counts[decoded] == decoded_before + 1  # the first only
                finally:
                    gate.set()
                answers = [await call for call in calls]
        finally:
            await server.stop(None)
        tx_ids = [result.accepted.tx_id for answer in answers for result in answer.results]
        assert len(set(tx_ids)) == 300 and all(tx_ids)
        assert work.counts[decoded] == decoded_before + 3

    _run(tmp_path, scenario)


async def _cycles_left_by(
    store: TransactionStore,
    calls: Callable[[client_pb2_grpc.ClientServiceAsyncStub], Awaitable[None]],
) -> list[str]:
    """The type names of what ``calls`` (made on the real server of ``store``, after a
    warm-up ``Submit``) left for the cyclic collector: collected with the collector off
    meanwhile, kept (``DEBUG_SAVEALL``) and counted."""
    server = new_server()
    add_service(server, ClientServicer(store), CLIENT_SERVICE, undecoded=UNDECODED)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            await stub.Submit(client_pb2.SubmitRequest(body=_body()), timeout=WAIT_S)
            gc.collect()
            gc.disable()
            try:
                await calls(stub)
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
            finally:
                gc.set_debug(0)
                gc.enable()
            left = [type(o).__name__ for o in gc.garbage]
            gc.garbage.clear()
            return left
    finally:
        await server.stop(None)


def test_a_refused_call_leaves_no_cycle_holding_its_request(tmp_path: Path) -> None:
    """Submits refused (the store is full) over the real server: each is answered
    RESOURCE_EXHAUSTED with its retry hint, and nothing of the call is left for the
    cyclic collector. A refusal raised by the frame that held it, and gRPC's AbortError
    held by its call state, each made a cycle that kept the call's frames, request and
    body until a full collection (2,995 objects for 50 calls)."""

    async def calls(stub: client_pb2_grpc.ClientServiceAsyncStub) -> None:
        # ``except ... as``, not ``pytest.raises``: its kept error would be a cycle
        # of this frame's own, holding the client's request.
        for _ in range(20):
            try:
                await stub.Submit(client_pb2.SubmitRequest(body=_body()), timeout=WAIT_S)
            except grpc.aio.AioRpcError as refused:
                assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                hint = dict(refused.trailing_metadata() or ())
                assert "retry-after-ms" in hint, hint
            else:
                pytest.fail("a submit to a full store was taken")

    async def scenario(store: TransactionStore) -> None:
        left = await _cycles_left_by(store, calls)
        for kind in ("Refusal", "SubmitRequest", "TxBody", "frame"):
            assert kind not in left, f"{left.count(kind)} {kind} in cycles"

    _run(tmp_path, scenario, incoming_txs_max=1, unfinished_txs_max=1)


def test_a_refused_batch_leaves_no_cycle_holding_its_bodies(tmp_path: Path) -> None:
    """``SubmitBatch`` calls over the real server, the store full part way through the
    first (2 of 5 taken after the warm-up's 1, the rest refused one by one) and before
    each of the others (every submit refused at once): nothing of the calls is left for
    the cyclic collector. A refusal raised and caught by the frame that keeps the
    batch's answers was a cycle holding the frame, with its 500 bodies, log entries and
    records, until a full collection: under a batched load's flow control, batches
    stayed alive for minutes and set the store's memory high-water mark."""
    answers: list[client_pb2.SubmitBatchResponse] = []

    async def calls(stub: client_pb2_grpc.ClientServiceAsyncStub) -> None:
        for _ in range(4):
            submits = [client_pb2.SubmitRequest(body=_body()) for _ in range(5)]
            request = client_pb2.SubmitBatchRequest(submits=submits)
            answers.append(await stub.SubmitBatch(request, timeout=WAIT_S))

    async def scenario(store: TransactionStore) -> None:
        left = await _cycles_left_by(store, calls)
        taken = [[r.WhichOneof("result") == "accepted" for r in a.results] for a in answers]
        assert taken == [[True] * 2 + [False] * 3] + [[False] * 5] * 3, taken
        refusals = [r.error for a in answers for r in a.results if r.error]
        assert all(e.startswith("RESOURCE_EXHAUSTED") for e in refusals), refusals
        for kind in ("Refusal", "TxBody", "LogEntry", "TxRecord", "frame"):
            assert kind not in left, f"{left.count(kind)} {kind} in cycles"

    _run(tmp_path, scenario, incoming_txs_max=3)


def test_a_duplicates_answer_carries_the_first_ones_rows_and_error(tmp_path: Path) -> None:
    """A retry whose idempotency key an earlier transaction held finishes as a duplicate
    of it; a client waiting on the retry is told the first one's rows affected and
    error, which its submitter is after (written into the answer from the fields the
    store holds, not from a message built per answer)."""

    async def scenario(store: TransactionStore) -> common_pb2.Outcome:
        first, retry = (await store.submit(_body())).tx_id, (await store.submit(_body())).tx_id
        for position, tx_id in enumerate((first, retry), start=1):
            await _sync_local(store, tx_id, position)
        ran = common_pb2.Outcome(
            state=common_pb2.TX_STATE_OK, position=1, rows_affected=[3], error="warned"
        )
        duplicate = common_pb2.Outcome(
            state=common_pb2.TX_STATE_OK, position=2, duplicate_of=first, state_digest=b"d"
        )
        for tx_id, outcome in ((first, ran), (retry, duplicate)):
            await store.advance_states([StateChangeRequest(tx_id, TxState.TESTING)], "wd")
            await store.advance_states([StateChangeRequest(tx_id, TxState.OK, outcome)], "wd")
        answer = await _wait_over_grpc(
            store, client_pb2.WaitRequest(tx_id=retry, state=common_pb2.TX_STATE_OK)
        )
        assert answer.reached and answer.state == common_pb2.TX_STATE_OK
        return answer.outcome

    told = _run(tmp_path, scenario)
    assert list(told.rows_affected) == [3] and told.error == "warned"
    assert (told.position, told.state_digest) == (2, b"d")
    assert told.duplicate_of  # the retry's own verdict, with the first one's results


def test_truncation_waits_for_a_verdict_on_disk_and_keeps_recent_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict still being written is not finished for truncation (a waiter that the
    staged OK made reached would find no record to answer with: the soak's client
    crashed on the state UNSPECIFIED it got), and a transaction finished within
    ``history_kept_ms`` is kept whatever the peers and workers passed."""

    async def scenario(store: TransactionStore) -> None:
        ids = [(await store.submit(_body())).tx_id for n in range(3)]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
        store.report_progress({"dc2": 3}, 3, peers_reported=True)
        await store.advance_states(_finished(ids[0], 1), "wd")
        gate = hold_writes(monkeypatch)
        advancing = asyncio.create_task(store.advance_states(_finished(ids[1], 2), "wd"))
        await until(lambda: store.state.txs[ids[1]].state is TxState.OK, "OK staged")
        held = TruncationHold(2, "unfinished transactions at 1 (2 behind)")
        assert store.truncation_hold() == held
        gate.set()
        await advancing
        assert store.truncatable_below() == 3
        await store.advance_states(_finished(ids[2], 3), "wd")
        store.config = dataclasses.replace(store.config, history_kept_ms=60_000)
        assert store.truncation_hold() == TruncationHold(0, "")  # all finished just now
        record = store.state.txs[ids[0]]
        old = record.history[-1]
        record.history = History(
            [*record.history[:-1], dataclasses.replace(old, at_unix_ms=old.at_unix_ms - 61_000)]
        )
        assert store.truncation_hold() == TruncationHold(2, "")

    _run(tmp_path, scenario)


def test_a_rotation_carries_the_bodies_it_keeps_into_the_new_file(tmp_path: Path) -> None:
    """Kept bodies up to half a log file go into the new file after its snapshot (one
    sequential write, no file each), are read from there, and survive a restart and the
    next rotation; they do not pace the next rotation."""

    async def scenario(store: TransactionStore) -> list[str]:
        ids = [(await store.submit(_body(f"INSERT INTO t VALUES ({n})"))).tx_id for n in range(4)]
        for position, tx_id in enumerate(ids, start=1):
            await _sync_local(store, tx_id, position)
        await store.advance_states(_finished(ids[0], 1), "wd")
        store.report_progress({"dc2": 4}, 4, peers_reported=True)
        assert await store.truncate(0) == (1, [ANY])
        assert not any(store.bodies.holds(tx_id) for tx_id in ids)
        assert sorted(store._unfiled) == sorted(ids[1:])
        assert store.files.appended_bytes == 0
        return ids

    ids = _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        assert store.files.appended_bytes == 0
        for n, tx_id in enumerate(ids[1:], start=1):
            body = await store.read_body(tx_id)
            assert body is not None and body.statements[0].sql.endswith(f"({n})")
        await store.truncate(0)  # carried again
        assert sorted(store._unfiled) == sorted(ids[1:])

    _run(tmp_path, after_restart)
    _run(tmp_path, after_restart)


def _body_kept(store: TransactionStore, tx_id: str) -> bool:
    """The store holds the body: in the current log file or in a file of its own."""
    return tx_id in store._unfiled or store.bodies.holds(tx_id)


def _state_view(store: TransactionStore) -> tuple[object, ...]:
    state = store.state
    return (
        [meta.tx_id for meta in state.synced], state.synced_offset, state.truncated_last_tx_id,
        {r.tx_id: (r.seq, r.position, r.history, r.idempotency_key) for r in state.txs.values()},
        [r.tx_id for r in state.in_seq_order()], dict(state.idempotency), state.open_body_bytes,
        state.incoming_state_txs, state.merge_base,
    )  # fmt: skip


def test_a_witness_truncates_with_its_peers_alone(tmp_path: Path) -> None:
    """A witness has no workers and finishes nothing: its peers' progress alone counts."""

    async def scenario(store: TransactionStore) -> None:
        metas = [TxMeta(ts, str(uuid.uuid4()), "dc2") for ts in (1, 2)]
        await store.persist_step(
            ProtocolStep(
                counter=2, incoming=metas, synced_start=store.state.merge_base, synced=metas,
                changes=[StateChangeRequest(m.tx_id, TxState.ACCEPTED) for m in metas],
                service="sync-coordinator",
            )
        )  # fmt: skip
        store.report_progress({"dc2": 1}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(2, "peer dc2 at 1 (1 behind)")
        store.report_progress({}, None, peers_reported=True)  # alone
        assert store.truncation_hold() == TruncationHold(3, "")

    _run(tmp_path, scenario, witness=True)


def test_a_membership_entry_holds_truncation_back_until_it_is_applied(tmp_path: Path) -> None:
    """A node the entry adds replays the order from position 1 (``check_can_join``).
    Until the configuration has it, the peers' reports leave it out: this DC keeps its
    whole history meanwhile, after a restart too (the simulator: a node added while
    every DC truncated waited for ever, seed 11 of `membership`)."""
    change = common_pb2.MembershipChange(node_id="dc4", weight=1, url="127.0.0.1:7401")
    entry = ""

    async def scenario(store: TransactionStore) -> None:
        nonlocal entry
        await _sync_foreign(store, 1, 2)
        store.report_progress({"dc2": 2}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(3, "")
        entry = (await store.change_membership(change, adds=True)).tx_id
        await held(store)

    async def held(store: TransactionStore) -> None:
        store.report_progress({"dc2": 2}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(
            0, f"membership change {entry}, not applied yet at 0 (2 behind)"
        )

    async def applied(store: TransactionStore) -> None:
        await held(store)
        await _sync_local(store, entry, 3)
        store.report_progress({"dc2": 3}, None, peers_reported=True)
        assert store.truncation_hold().below == 0  # synced, not applied
        view = _proposal(1, ["dc1", "dc2", "dc4"], [], applied_position=3)
        await store.persist_step(ProtocolStep(service="sc", installed_view=view))
        # Applied; dc4 holds it now, until a report names it (seed 103).
        assert store.truncation_hold() == TruncationHold(
            0, "peer dc4, not reported yet at 0 (3 behind)"
        )
        assert not store.state.membership_entries
        store.report_progress({"dc2": 3, "dc4": 3}, None, peers_reported=True)
        # The store never had a view before this one: whether it removed a node is not
        # known, and truncation waits to pass the order such a node may hold.
        assert store.truncation_hold() == TruncationHold(
            0, "a removed node, whose order may reach 3, at 0 (3 behind)"
        )
        await _sync_foreign(store, 4)
        store.report_progress({"dc2": 4, "dc4": 4}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(5, "")

    _run(tmp_path, scenario, witness=True)
    _run(tmp_path, applied, witness=True)


def test_a_membership_change_waits_for_the_one_before_it_everywhere(tmp_path: Path) -> None:
    """A peer's membership entry synced here holds truncation and refuses a new change
    until the configuration applies it (the simulator, seed 1002 of `membership`: every
    DC truncated between applying an add and installing it), and the node it adds holds
    truncation until a report names it (seed 103). A change is taken against
    the installed configuration (``after_position``), and a node is removed only once
    the others have come as far as that configuration (seed 1510: the DC that took an
    add was removed before the new node had synced anything)."""
    added = common_pb2.MembershipChange(node_id="dc4", weight=1, url="127.0.0.1:7401")
    peer_entry = str(uuid.uuid4())

    async def scenario(store: TransactionStore) -> None:
        meta = TxMeta(1, peer_entry, "dc2")
        encoded = common_pb2.TxBody(membership=added).SerializeToString()
        await store.persist_step(
            ProtocolStep(
                counter=1, incoming=[meta], synced_start=store.state.merge_base, synced=[meta],
                changes=[StateChangeRequest(peer_entry, TxState.ACCEPTED)],
                bodies=[(peer_entry, encoded, body_digest(encoded), "")],
            )
        )  # fmt: skip
        store.report_progress({"dc2": 1, "dc3": 1}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(
            0, f"membership change {peer_entry}, not applied yet at 0 (1 behind)"
        )
        removal = common_pb2.MembershipChange(node_id="dc3")
        with pytest.raises(Refusal, match=f"{peer_entry} is not applied yet"):
            await store.change_membership(removal)

        view = _proposal(2, ["dc1", "dc2", "dc3"], [], applied_position=1, configured_too=("dc4",))
        await store.persist_step(ProtocolStep(installed_view=view))
        # The last report named the peers before the change: dc4 holds everything
        # until the coordinator reports it (the simulator with rotations, seed 103).
        assert store.truncation_hold() == TruncationHold(
            0, "peer dc4, not reported yet at 0 (1 behind)"
        )
        store.report_progress({"dc2": 1, "dc3": 1, "dc4": 0}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(0, "peer dc4 at 0 (1 behind)")
        with pytest.raises(Refusal, match="dc4 has synced 0 positions, short of 1") as early:
            await store.change_membership(removal)
        assert early.value.kind is Refused.PRECONDITION
        weight = common_pb2.MembershipChange(node_id="dc2", weight=2)
        view = await _applied(store, await store.change_membership(weight), 2, view)

        store.report_progress({"dc2": 2, "dc3": 2, "dc4": 2}, None, peers_reported=True)
        assert store.truncation_hold() == TruncationHold(3, "")
        taken = await store.change_membership(removal)
        [(_, body, _)], _ = await store.read_bodies([taken.tx_id])
        assert common_pb2.TxBody.FromString(body).membership.after_position == 2

    async def _applied(
        store: TransactionStore, taken: Submitted, position: int, view: ViewProposal
    ) -> ViewProposal:
        """The view after ``view`` that applies the membership entry ``taken``, synced at
        ``position``, installed."""
        [(_, body, _)], _ = await store.read_bodies([taken.tx_id])
        assert common_pb2.TxBody.FromString(body).membership.after_position == position - 1
        await _sync_local(store, taken.tx_id, position)
        view = dataclasses.replace(
            view,
            view=View(view.view.view_no + 1, view.view.members),
            configuration=dataclasses.replace(view.configuration, applied_position=position),
        )
        await store.persist_step(ProtocolStep(installed_view=view))
        return view

    _run(tmp_path, scenario, witness=True)


def test_bodies_held_stop_at_the_first_synced_body_missing_here(tmp_path: Path) -> None:
    """What the coordinator posts so that the peers keep the bodies this DC may still
    fetch (``StoreState.bodies_held_len``): positions up to the first synced transaction
    whose body is not here, moving on as bodies arrive, and across a restart."""
    peer_bodies = [_body(f"INSERT INTO t VALUES ({n})").SerializeToString() for n in range(3)]
    peer_ids = [str(uuid.uuid4()) for _ in peer_bodies]

    async def scenario(store: TransactionStore) -> None:
        local = (await store.submit(_body())).tx_id
        await _sync_local(store, local, 1)
        assert store.state.bodies_held_len() == 1
        metas = [TxMeta(ts, tx_id, "dc2") for ts, tx_id in enumerate(peer_ids, start=2)]
        changes = [StateChangeRequest(m.tx_id, s) for m in metas
                   for s in (TxState.INCOMING, TxState.ACCEPTED)]  # fmt: skip
        await store.persist_step(
            ProtocolStep(counter=4, incoming=metas, synced_start=store.state.merge_base,
                         synced=metas, changes=changes)
        )  # fmt: skip
        assert store.state.synced_len == 4 and store.state.bodies_held_len() == 1
        # The second arrives first: the held prefix waits for the first.
        await _push_body(store, peer_ids[1], peer_bodies[1], body_digest(peer_bodies[1]))
        assert store.state.bodies_held_len() == 1
        await _push_body(store, peer_ids[0], peer_bodies[0], body_digest(peer_bodies[0]))
        assert store.state.bodies_held_len() == 3

    _run(tmp_path, scenario)

    async def after_restart(store: TransactionStore) -> None:
        assert store.state.bodies_held_len() == 3
        await _push_body(store, peer_ids[2], peer_bodies[2], body_digest(peer_bodies[2]))
        assert store.state.bodies_held_len() == 4

    _run(tmp_path, after_restart)


def test_bodies_held_are_answered_as_the_disk_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer truncates up to what this DC says it holds: a body still on its way to
    the disk is not counted (a crash may lose it, and the peers' copies would be gone)."""
    encoded = _body("INSERT INTO t VALUES (2)").SerializeToString()
    peer_id = str(uuid.uuid4())

    async def scenario(store: TransactionStore) -> None:
        local = (await store.submit(_body())).tx_id
        await _sync_local(store, local, 1)
        meta = TxMeta(2, peer_id, "dc2")
        changes = [StateChangeRequest(peer_id, s) for s in (TxState.INCOMING, TxState.ACCEPTED)]
        await store.persist_step(
            ProtocolStep(counter=2, incoming=[meta], synced_start=store.state.merge_base,
                         synced=[meta], changes=changes)
        )  # fmt: skip
        gate = hold_writes(monkeypatch)
        staged = await store.stage_step(
            ProtocolStep(bodies=[(peer_id, encoded, body_digest(encoded), "")])
        )
        assert store.state.bodies_held_len() == 2  # memory has it
        assert store.bodies_held_durably_len() == 1  # the disk not yet
        gate.set()
        await store.finish_step(staged)
        assert store.bodies_held_durably_len() == 2

    _run(tmp_path, scenario)


def test_a_peer_out_of_the_configuration_is_not_recorded() -> None:
    """``retention.peers_ordered``: what the coordinator reports, else what was recorded,
    for the peers of the configuration only (a coordinator of an earlier release names
    only those it may let go, in ``peer_ordered_len``)."""
    state = StoreState("dc1")
    state.peers_ordered = {"dc2": 3, "dc3": 4, "dc4": 5}
    progress = Progress(
        peer_synced_len={"dc2": 0, "dc4": 9, "dc5": 2},
        peers_reported=True,
        peer_ordered_len={"dc5": 2},
        peer_posted_len={"dc4": 9},
    )
    assert peers_ordered(state, progress) == {"dc2": 3, "dc4": 9, "dc5": 2}
    assert peers_ordered(state, Progress()) == state.peers_ordered  # nothing reported yet
