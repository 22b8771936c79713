"""The client library against a real 3-DC cluster: submits and their verdicts, reads
that see the caller's writes, errors that name what happened, batching, and failover."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from tests.support.processes import free_port, transaction_store
from tests.support.waiting import wait_until
from txsync.client import (
    AsyncClient,
    Backpressure,
    BatchFailed,
    Client,
    InvalidRequest,
    KeyConflict,
    NotFound,
    State,
    Statement,
    Submitted,
    Timeout,
    TransactionFailed,
    TxInfo,
    Unavailable,
    key_for,
)
from txsync.client.results import SqlValue
from txsync.v1 import admin_pb2, admin_pb2_grpc

CALLERS = 48
WAIT_S = 120.0
"""Generous: a condition is polled, never slept for."""


def _table(client: Client) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    client.submit(f"CREATE TABLE {name} (k INTEGER PRIMARY KEY, v TEXT)", wait="ok")
    return name


def test_a_submit_is_answered_at_the_state_asked_for_and_read_back_anywhere(
    cluster_file: Path,
) -> None:
    with (
        Client(str(cluster_file), dc="dc1") as writer,
        Client(str(cluster_file), dc="dc3") as reader,
    ):
        table = _table(writer)
        durable = writer.submit(f"INSERT INTO {table} VALUES (?, ?)", 1, "one", wait=None)
        assert durable.state is State.INCOMING and durable.dc == "dc1" and durable.created
        # Read at dc3 at once after a transaction dc3 has likely not heard of yet.
        early = reader.query(f"SELECT v FROM {table} WHERE k = 1", after=durable.tx_id)
        assert early.rows == (("one",),)
        accepted = writer.submit(
            [Statement(f"INSERT INTO {table} VALUES (?, ?)", (2, "two")),
             Statement(f"UPDATE {table} SET v = ? WHERE k = ?", ("uno", 1))],
        )  # fmt: skip
        assert accepted.state in (State.ACCEPTED, State.ENQUEUED, State.TESTING, State.OK)
        # Read-your-writes at another DC: the read waits until a worker there applied it.
        read = reader.query(f"SELECT k, v FROM {table} ORDER BY k", after=accepted)
        assert read.rows == ((1, "uno"), (2, "two")) and read.columns == ("k", "v")
        assert read.worker.startswith("dc3-")
        applied = writer.submit(f"UPDATE {table} SET v = ? WHERE k = ?", None, 2, wait="ok")
        assert applied.outcome is not None and applied.outcome.rows_affected == (1,)
        info = reader.get(applied.tx_id, body=True)
        assert info.position == applied.outcome.position and info.origin == "dc1"
        assert info.statements[0].params == (None, 2) and info.idempotency_key == applied.key
        assert reader.wait(applied.tx_id, "ok").state is State.OK


def test_the_current_time_is_when_the_client_made_the_transaction(cluster_file: Path) -> None:
    """The library stamps each body with its time (``now_unix_us``): CURRENT_TIMESTAMP
    and 'now' are accepted, and every DC's workers write that same time."""
    made = datetime.now(UTC).replace(tzinfo=None)
    with Client(str(cluster_file), dc="dc1") as writer:
        table = f"t_{uuid.uuid4().hex[:8]}"
        done = writer.submit(
            [Statement(f"CREATE TABLE {table} (k, at DEFAULT CURRENT_TIMESTAMP, ms)"),
             Statement(f"INSERT INTO {table} (k, ms) VALUES (1, strftime('%f', 'now'))")],
            wait="ok",
        )  # fmt: skip
        seen = set()
        for dc in ("dc1", "dc2", "dc3"):
            with Client(str(cluster_file), dc=dc) as reader:
                seen.add(reader.query(f"SELECT at, ms FROM {table}", after=done).rows)
    assert len(seen) == 1, seen
    ((at, _),) = seen.pop()
    written = datetime.fromisoformat(str(at))
    assert abs((written - made).total_seconds()) < 3600, (written, made)


def test_errors_name_what_happened(cluster_file: Path) -> None:
    with Client(str(cluster_file)) as client:
        table = _table(client)
        client.submit(f"INSERT INTO {table} VALUES (1, 'x')", wait="ok")
        with pytest.raises(TransactionFailed, match="UNIQUE") as failed:
            client.submit(f"INSERT INTO {table} VALUES (1, 'again')", wait="ok")
        assert not failed.value.outcome.ok and failed.value.tx_id
        with pytest.raises(InvalidRequest, match="statement"):
            client.submit("")
        with pytest.raises(InvalidRequest, match="random"):
            client.submit(f"INSERT INTO {table} VALUES (random(), 'r')")
        key = f"k-{uuid.uuid4()}"
        client.submit(f"INSERT INTO {table} VALUES (2, 'y')", key=key)
        with pytest.raises(KeyConflict, match="a retry must send the same body") as conflict:
            client.submit(f"INSERT INTO {table} VALUES (3, 'z')", key=key)
        assert conflict.value.key == key  # an error about a submit names its key
        with pytest.raises(InvalidRequest) as generated:
            client.submit("")
        assert len(generated.value.key) == 32  # the one the library made for it
        with pytest.raises(NotFound):
            client.get(str(uuid.uuid4()))
        with pytest.raises(TypeError, match="parameter"):
            client.submit(f"INSERT INTO {table} VALUES (?, ?)", 4, object())  # type: ignore[arg-type]


def test_no_dc_answering_is_unavailable_once_the_deadline_passed() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with Client(address, timeout=1.0) as client, pytest.raises(Unavailable):
        client.submit("INSERT INTO t VALUES (1)")


def test_one_key_at_two_dcs_at_once_has_one_effect(cluster_file: Path) -> None:
    """The same transaction with the same key submitted at dc1 and dc2 together (a
    client that retried elsewhere before the first answer): both are ordered, the first
    in the order runs, the other is its duplicate at every DC, and both callers are
    answered with the first one's id and outcome."""
    with Client(str(cluster_file), dc="dc1") as one, Client(str(cluster_file), dc="dc2") as two:
        table = _table(one)
        key = f"transfer-{uuid.uuid4()}"
        sql = f"INSERT INTO {table} VALUES (?, ?)"
        answers = {}

        def submit(name: str, client: Client) -> None:
            answers[name] = client.submit(sql, 1, "once", key=key, wait="ok")

        threads = [threading.Thread(target=submit, args=a) for a in (("one", one), ("two", two))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        first, second = answers["one"], answers["two"]
        assert first.tx_id == second.tx_id, "both callers are told of the same transaction"
        assert [first.duplicate, second.duplicate].count(True) == 1
        counted = one.query(f"SELECT count(*) FROM {table}", after=first.tx_id)
        assert counted.rows == ((1,),)
        _each_dc_records_one_duplicate(cluster_file, first.tx_id, key)


def test_a_keys_time_window_is_the_taking_dcs_and_travels_to_every_dc(
    cluster_file: Path,
) -> None:
    """Every worker remembers a key for the window of the DC that took the submit (the
    dev cluster's default, an hour), counted from when that DC took it: the window is
    in the body, so every DC reads the same (issue 50)."""
    with Client(str(cluster_file), dc="dc1") as one, Client(str(cluster_file), dc="dc3") as three:
        table = _table(one)
        sent = one.submit(f"INSERT INTO {table} VALUES (?, ?)", 7, "kept", wait="ok")
        here = one.get(sent.tx_id, body=True)
        taken = next(t.at for t in here.history if t.state is State.INCOMING)
        assert here.key_remembered_until == taken + timedelta(hours=1)
        three.wait(sent.tx_id, "ok")
        there = three.get(sent.tx_id, body=True)
        assert there.key_remembered_until == here.key_remembered_until
        assert one.get(sent.tx_id).key_remembered_until is None, "shown with the body only"


def _each_dc_records_one_duplicate(cluster_file: Path, first_id: str, key: str) -> None:
    """At every DC: exactly the transaction ``first_id`` ran under ``key`` and every
    other one with the key names it (the same verdict everywhere). Each caller was
    answered once its own DC finished; another DC may finish the later one after, so
    each is waited for until both are finished there (written: ``List`` shows no
    outcome still on its way to disk)."""
    for dc in ("dc1", "dc2", "dc3"):
        with Client(str(cluster_file), dc=dc) as client:

            def finished_with_key() -> list[TxInfo]:
                keyed = [
                    client.get(info.tx_id, body=True)
                    for info in client.list()
                    if info.position and info.state is not None and info.state.final
                ]
                return [t for t in keyed if t.idempotency_key == key]

            wait_until(f"both finished at {dc}", lambda: len(finished_with_key()) >= 2, WAIT_S)
            mine = finished_with_key()
            runs = [t for t in mine if t.outcome is not None and not t.outcome.duplicate_of]
            assert [t.tx_id for t in runs] == [first_id], f"{dc}: {mine}"
            assert all(
                t.outcome is not None and t.outcome.duplicate_of == first_id
                for t in mine if t.tx_id != first_id
            )  # fmt: skip


def test_many_callers_share_batches_and_each_gets_its_own_answer(cluster_file: Path) -> None:
    async def main() -> None:
        async with AsyncClient(str(cluster_file), dc="dc2") as client:
            created = await client.submit(
                f"CREATE TABLE b_{uuid.uuid4().hex[:8]} (k INTEGER PRIMARY KEY)", wait="ok"
            )
            table = (await client.get(created.tx_id, body=True)).statements[0].sql.split()[2]
            answers = await asyncio.gather(
                *(client.submit(f"INSERT INTO {table} VALUES (?)", n) for n in range(CALLERS * 4))
            )
            assert len({a.tx_id for a in answers}) == CALLERS * 4
            assert client.calls < CALLERS * 4 / 2, "concurrent submits travelled together"
            applied = await asyncio.gather(*(client.wait(a.tx_id, "ok") for a in answers))
            last = max(applied, key=lambda a: a.outcome.position if a.outcome else 0)
            counted = await client.query(f"SELECT count(*) FROM {table}", after=last.tx_id)
            assert counted.rows == ((CALLERS * 4,),)

    asyncio.run(main())


def test_list_pages_through_everything(cluster_file: Path) -> None:
    with Client(str(cluster_file), dc="dc3") as client:
        table = _table(client)
        client.submit_many([(f"INSERT INTO {table} VALUES (?, ?)", (n, "x")) for n in range(7)])
        everything = list(client.list(page_size=3))
        assert len({t.tx_id for t in everything}) == len(everything) >= 8
        page, token = client.list_page(page_size=3)
        assert len(page) == 3 and token
        assert [t.tx_id for t in page] == [t.tx_id for t in everything[:3]]


def _pids_of(dc_store: str) -> list[int]:
    """The DC's transaction-store and sync-coordinator (found by the store's address on
    their command lines)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"txsync.cli.main" not in args:
            continue
        role = args[args.index(b"txsync.cli.main") + 1]
        flag = {b"transaction-store": b"--listen", b"sync-coordinator": b"--store"}.get(role)
        if flag in args and args[args.index(flag) + 1] == dc_store.encode():
            pids.append(int(entry.name))
    return pids


def test_a_retry_after_a_dc_fails_goes_elsewhere_and_has_one_effect(cluster_file: Path) -> None:
    """dc3 takes a submit and then stops answering (its store and coordinator frozen):
    the client, told to wait for the outcome, fails over to the next DC with the same
    key. When dc3 comes back its own copy is ordered too, and is the duplicate: one
    effect, at every DC."""
    with Client(str(cluster_file), dc="dc3", attempt_s=1.0, timeout=120) as client:
        table = _table(client)
        key = f"payment-{uuid.uuid4()}"
        sql = f"INSERT INTO {table} VALUES (?, ?)"
        taken = client.submit(sql, 7, "paid", key=key, wait=None)
        assert taken.dc == "dc3"
        frozen = _pids_of(client.endpoints[0].address)
        assert len(frozen) == 2, frozen
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            retried = client.submit(sql, 7, "paid", key=key, wait="ok")
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        assert retried.dc != "dc3" and retried.outcome is not None and retried.outcome.ok
        # dc3's own copy, ordered once dc3 is back, repeats the first one's verdict.
        again = client.wait(taken.tx_id, "ok")
        assert retried.tx_id in (again.tx_id, taken.tx_id)
        counted = client.query(f"SELECT count(*) FROM {table}", after=taken.tx_id)
        assert counted.rows == ((1,),)
    _each_dc_records_one_duplicate(cluster_file, retried.tx_id, key)


@contextlib.contextmanager
def _admin(address: str) -> Iterator[admin_pb2_grpc.AdminServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield admin_pb2_grpc.AdminServiceStub(channel)


def test_a_read_after_a_failover_is_never_older_than_the_last_write_seen(
    cluster_file: Path,
) -> None:
    """A client writes at dc1, whose store and coordinator then stop answering; its
    next read fails over to the next DC, whose sync is paused (its workers are behind
    the write). The read does not answer from before the write there: it waits, and
    moves on to a DC that applied it. The same read with ``session=False`` at the
    lagging DC shows what it would have answered."""
    with Client(str(cluster_file), dc="dc1", attempt_s=1.0, timeout=60) as client:
        table = _table(client)
        lagging = client.endpoints[1]
        with Client(lagging.address) as there:  # the table is there too
            there.query(f"SELECT count(*) FROM {table}", after_position=client.seen_position)
        with _admin(lagging.address) as admin:
            admin.PauseSync(admin_pb2.PauseSyncRequest(), timeout=30)
            try:
                written = client.submit(f"INSERT INTO {table} VALUES (1, 'x')", wait="ok")
                assert written.position and client.seen_position >= written.position
                with Client(lagging.address) as there:
                    stale = there.query(f"SELECT count(*) FROM {table}", session=False)
                assert stale.rows == ((0,),), "the lagging DC had not applied the write"
                frozen = _pids_of(client.endpoints[0].address)
                assert len(frozen) == 2, frozen
                for pid in frozen:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    read = client.query(f"SELECT count(*) FROM {table}")
                finally:
                    for pid in frozen:
                        os.kill(pid, signal.SIGCONT)
            finally:
                admin.ResumeSync(admin_pb2.ResumeSyncRequest(), timeout=30)
        assert read.rows == ((1,),) and read.position >= written.position
        assert not read.worker.startswith("dc1-")


def test_submit_many_leaves_in_one_call_and_keys_can_be_left_out(cluster_file: Path) -> None:
    with Client(str(cluster_file), dc="dc1") as client:
        table = _table(client)
        before = client.calls
        answers = client.submit_many(
            [(f"INSERT INTO {table} VALUES (?, ?)", (n, "x")) for n in range(50)],
            keys=[f"{table}-{n}" for n in range(50)],
        )
        assert client.calls == before + 1, "50 submits handed over together: one SubmitBatch"
        assert [a.key for a in answers] == [f"{table}-{n}" for n in range(50)]
        refused = client.submit_many(
            [f"INSERT INTO {table} VALUES (100, 'y')", ""], raise_errors=False, wait=None
        )
        assert isinstance(refused[0], Submitted) and isinstance(refused[1], InvalidRequest)
    with Client(str(cluster_file), dc="dc1", idempotent=False) as plain:
        bare = plain.submit(f"INSERT INTO {table} VALUES (?, ?)", 200, "z", wait="ok")
        assert bare.key == "" and plain.get(bare.tx_id).idempotency_key == ""


SLOW = (
    "INSERT INTO {t} SELECT count(*), '{v}' FROM (WITH RECURSIVE c(x) AS "
    "(SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) SELECT x FROM c)"
)
"""A transaction that takes about a second to apply (``n`` 3,000,000)."""


def test_a_batch_retried_whole_after_a_failure_in_its_middle_applies_each_once(
    cluster_file: Path,
) -> None:
    """The natural retry of ``submit_many``: ten inserts, the sixth slow to apply, waited
    for "ok" with too short a timeout. ``BatchFailed`` holds every answer and key; the
    whole batch sent again with those keys applies each transaction once."""
    with Client(str(cluster_file), dc="dc2", timeout=120) as client:
        table = _table(client)
        batch: list[tuple[str, tuple[SqlValue, ...]]] = [
            (f"INSERT INTO {table} VALUES (?, ?)", (n, "x")) for n in range(10)
        ]
        batch[5] = (SLOW.format(t=table, v="slow", n=3_000_000), ())
        with pytest.raises(BatchFailed) as failed:
            client.submit_many(batch, wait="ok", timeout=0.3)
        error = failed.value
        assert len(error.results) == 10 and len(set(error.keys)) == 10 and all(error.keys)
        # Not applied within the 0.3 s: its wait timed out, or on a busy machine the DC
        # had not even answered the submit by then. Either way its key is kept.
        assert isinstance(error.results[5], (Timeout, Unavailable)), error.results[5]
        for result, key in zip(error.results, error.keys, strict=True):
            assert result.key == key  # what a retry of each must send again
        assert error.unkeyed == 0 and "retry with keys=error.keys" in str(error)
        again = client.submit_many(batch, keys=error.keys, wait="ok")
        assert [a.key for a in again] == error.keys
        taken = [n for n, r in enumerate(error.results) if isinstance(r, Submitted)]
        assert all(not again[n].created or again[n].duplicate for n in taken)
        counted = client.query(f"SELECT count(*) FROM {table}", after=again[-1]).rows
        assert counted == ((10,),), "each transaction of the batch applied once"


def test_submits_refused_for_load_go_again_after_a_pause_key_or_no_key(tmp_path: Path) -> None:
    """A store over ``--unfinished-max`` (nothing orders here: a lone store) refuses the
    rest of a batch for load. The DC stored nothing of those, so the client sends them
    again after a pause, with or without a key, until its deadline; then each is a
    ``Backpressure`` (not "sent once"), and the store was asked a few times, not
    hammered. A single submit without a key is sent again the same way."""
    store = transaction_store(tmp_path / "store", "dc1", "--unfinished-max", "3")
    store.start()
    try:
        with Client(store.address, idempotent=False, timeout=2.0) as client:
            results = client.submit_many(
                [f"INSERT INTO t VALUES ({n})" for n in range(5)], wait=None, raise_errors=False
            )
            assert [type(r).__name__ for r in results] == ["Submitted"] * 3 + ["Backpressure"] * 2
            assert 2 <= client.calls <= 6, "sent again after pauses of 0.25 s, doubling"
            calls = client.calls
            with pytest.raises(Backpressure):  # a single unkeyed submit goes again too
                client.submit("INSERT INTO t VALUES (5)", wait=None)
            assert 2 <= client.calls - calls <= 6, "sent again after pauses of 0.25 s"
    finally:
        store.terminate()


def test_a_client_follows_a_dc_that_moved_to_another_address(tmp_path: Path) -> None:
    """A long-lived client outlives a DC that comes back elsewhere (a rescheduled pod's
    new address): after a round in which no DC answered, it reads its cluster file (or
    looks its DNS name up) again and goes on with what it finds."""
    cluster_file = tmp_path / "cluster.json"

    def publish(address: str) -> None:
        cluster_file.write_text(json.dumps({"dcs": {"dc1": {"store": address}}}))

    first, second, third = (transaction_store(tmp_path / n, "dc1") for n in ("a", "b", "c"))
    first.start()
    publish(first.address)
    try:
        with Client(str(cluster_file), timeout=60) as client:
            assert client.submit("INSERT INTO t VALUES (1)", wait=None).created
            first.terminate()
            second.start()
            publish(second.address)
            moved = client.submit("INSERT INTO t VALUES (2)", wait=None)
            assert moved.created and client.current.address == second.address
            assert client.get(moved.tx_id).tx_id == moved.tx_id

        async def the_async_client_too() -> None:
            async with AsyncClient(str(cluster_file), timeout=60) as client:
                await client.submit("INSERT INTO t VALUES (3)", wait=None)
                second.terminate()
                third.start()
                publish(third.address)
                await client.submit("INSERT INTO t VALUES (4)", wait=None)
                assert client.current.address == third.address

        asyncio.run(the_async_client_too())
    finally:
        for store in (first, second, third):
            store.terminate()


def test_keys_derived_from_the_callers_data_are_stable_and_distinct() -> None:
    assert key_for("orders", 42) == key_for("orders", 42)
    assert key_for("ab", "c") != key_for("a", "bc") != key_for("a", "b", "c")
    assert key_for("42") != key_for(42) != key_for(b"42")
    assert key_for("queue", "message-1").startswith("k-") and len(key_for("x")) == 34
    with pytest.raises(ValueError, match="at least one part"):
        key_for()
    with pytest.raises(TypeError, match="not float"):
        key_for(1.5)  # type: ignore[arg-type]


def test_submits_not_ordered_in_one_attempt_are_waited_for(cluster_file: Path) -> None:
    """A transaction that takes about a second to apply, waited for "ok" with 0.2 s per
    attempt: the DC answers "not yet", and the client waits on (it does not resend)."""
    slow = SLOW
    with Client(str(cluster_file), dc="dc2", attempt_s=0.2, timeout=120) as client:
        table = _table(client)
        single = client.submit(slow.format(t=table, v="one", n=3_000_000), wait="ok")
        many = client.submit_many([slow.format(t=table, v="many", n=2_900_000)], wait="ok")
        assert single.outcome is not None and many[0].outcome is not None
        rows = client.query(f"SELECT k, v FROM {table} ORDER BY k", after=many[0]).rows
        assert rows == ((2_900_000, "many"), (3_000_000, "one"))
