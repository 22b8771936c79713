"""Crash safety: SIGKILL the real transaction-store at random moments of a submit storm.

After every kill the store restarts from its files, and then:

* every acknowledged submit is present, INCOMING, with a history of one transition;
* every idempotency key ever sent maps to exactly one transaction (re-submitting it
  returns the same id), so nothing is duplicated, and the store lists exactly the
  transactions of those keys: nothing lost, nothing extra.

The log file limit is small, so kills also land in the middle of log rotations; a second
test kills only after a rotation has completed (a new ``bak-`` file).
``TXSYNC_KILL_POINTS`` sets the number of kills of the first (50 in CI; the issue asks
200 locally).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.support.clients import list_tx_ids
from tests.support.processes import ServiceProcess, transaction_store
from tests.support.waiting import wait_until
from txsync.v1 import client_pb2, client_pb2_grpc, common_pb2

KILL_POINTS = int(os.environ.get("TXSYNC_KILL_POINTS", "50"))
SINGLE_CLIENTS = 4
BATCH_CLIENTS = 2
BATCH_SIZE = 20
ROTATION_KILL_POINTS = 10
"""Kills after a completed rotation: every transaction stays held, so each rotation
writes the whole state and they grow slower cycle by cycle."""
ROTATION_WAIT_S = 120.0


def _body(key: str) -> common_pb2.TxBody:
    """Each key's one body: a retry must send the same body (another is refused)."""
    return common_pb2.TxBody(
        statements=[
            common_pb2.Statement(
                sql="INSERT INTO t (v) VALUES (?)", params=[common_pb2.SqlValue(text_value=key)]
            )
        ]
    )


class Storm:
    """Clients submitting with unique idempotency keys until the server dies."""

    def __init__(self, address: str, cycle: int) -> None:
        self.address = address
        self.cycle = cycle
        self.attempted: list[str] = []
        self.acked: dict[str, str] = {}
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._single, args=(n,)) for n in range(SINGLE_CLIENTS)
        ] + [threading.Thread(target=self._batch, args=(n,)) for n in range(BATCH_CLIENTS)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), "a client hung after the kill"

    def _keys(self, client: str, count: int, n: int) -> list[str]:
        keys = [f"c{self.cycle}-{client}-{n}-{i}" for i in range(count)]
        with self._lock:
            self.attempted.extend(keys)
        return keys

    def _single(self, worker: int) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for n in range(100_000):
                (key,) = self._keys(f"s{worker}", 1, n)
                try:
                    answer = stub.Submit(
                        client_pb2.SubmitRequest(body=_body(key), idempotency_key=key), timeout=10
                    )
                except grpc.RpcError:
                    return
                with self._lock:
                    self.acked[key] = answer.tx_id

    def _batch(self, worker: int) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = client_pb2_grpc.ClientServiceStub(channel)
            for n in range(100_000):
                keys = self._keys(f"b{worker}", BATCH_SIZE, n)
                request = client_pb2.SubmitBatchRequest(
                    submits=[
                        client_pb2.SubmitRequest(body=_body(key), idempotency_key=key)
                        for key in keys
                    ]
                )
                try:
                    results = stub.SubmitBatch(request, timeout=10).results
                except grpc.RpcError:
                    return
                with self._lock:
                    for key, result in zip(keys, results, strict=True):
                        assert result.HasField("accepted"), result.error
                        self.acked[key] = result.accepted.tx_id


def _rotations(data: Path) -> int:
    return len(list((data / "txlog").glob("bak-*.dat")))


def _wait_for_a_rotation(data: Path, before: int) -> None:
    """Until a rotation started after ``before`` bak files has completed."""
    wait_until(
        "a log rotation completed", lambda: _rotations(data) > before, ROTATION_WAIT_S, poll_s=0.02
    )


def _verify(process: ServiceProcess, storm: Storm, known: dict[str, str]) -> None:
    with grpc.insecure_channel(process.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        for key, tx_id in storm.acked.items():
            got = stub.Get(client_pb2.GetRequest(tx_id=tx_id))
            assert got.state == common_pb2.TX_STATE_INCOMING, key
            assert [t.state for t in got.history] == [common_pb2.TX_STATE_INCOMING], key
        # Every key sent maps to one transaction: re-sending returns it (creating the
        # transaction only if the first submit never became durable).
        for start in range(0, len(storm.attempted), 1000):
            keys = storm.attempted[start : start + 1000]
            request = client_pb2.SubmitBatchRequest(
                submits=[client_pb2.SubmitRequest(body=_body(k), idempotency_key=k) for k in keys]
            )
            for key, result in zip(keys, stub.SubmitBatch(request).results, strict=True):
                assert result.HasField("accepted"), (key, result.error)
                tx_id = result.accepted.tx_id
                if key in storm.acked:
                    assert (tx_id, result.accepted.created) == (storm.acked[key], False), key
                known[key] = tx_id
        listed = list_tx_ids(stub)
    assert len(listed) == len(set(listed)), "a transaction is listed twice"
    assert sorted(listed) == sorted(known.values()), "lost or extra transactions"


def _storms_and_kills(tmp_path: Path, cycles: int, *, after_rotations: bool) -> str:
    """``cycles`` storms, each ended by a SIGKILL at a random moment (with
    ``after_rotations``, a moment after a log rotation completed in that storm), each
    followed by a restart and ``_verify``; then a clean shutdown. Returns a summary."""
    rng = random.Random(20261122)
    # Nothing orders these transactions, so they all stay INCOMING: lift the backpressure
    # limits, which are not what this test is about. Rotations are counted by the bak-
    # files they leave: keep every one.
    process = transaction_store(
        tmp_path, "dc1", "--log-file-bytes-max", "60000", "--incoming-max", "10000000",
        "--unfinished-max", "10000000", "--backups-kept", "100000",
    )  # fmt: skip
    known: dict[str, str] = {}
    acked_total = 0
    process.start()
    try:
        for cycle in range(cycles):
            storm = Storm(process.address, cycle)
            rotations = _rotations(tmp_path)
            storm.start()
            if after_rotations:
                _wait_for_a_rotation(tmp_path, rotations)
            time.sleep(rng.uniform(0.02, 0.3))  # the kill's moment, at random
            process.kill()
            storm.join()
            process.start()
            _verify(process, storm, known)
            acked_total += len(storm.acked)
        assert process.terminate() == 0  # and after all that, a clean shutdown
    finally:
        process.kill()  # only if something above failed half-way
    assert acked_total > cycles  # the storms really ran
    rotated = _rotations(tmp_path)
    if after_rotations:
        assert rotated >= cycles
    torn_tails = process.log().count("TORN TAIL")
    return (
        f"{cycles} kills: {acked_total} acknowledged submits, {len(known)} keys, "
        f"0 lost, 0 duplicated; {torn_tails} torn tails cut; {rotated} log rotations"
    )


@pytest.mark.slow
def test_sigkill_during_submit_storms_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    print("\n" + _storms_and_kills(tmp_path, KILL_POINTS, after_rotations=False))


@pytest.mark.slow
def test_sigkill_after_completed_rotations_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    """The storms write bodies faster than a rotation cut short by the next kill files
    them, so in the test above kills land in rotations but rarely after a completed one.
    Here every kill follows one (and may land in the next): recovery then starts from a
    rotated file's snapshot, with bak- files beside it. Every transaction stays held, so
    by the last kills the snapshot is over 16 MiB and written in parts (about 130,000
    transactions, 17 MiB, three frames, on this machine)."""
    print("\n" + _storms_and_kills(tmp_path, ROTATION_KILL_POINTS, after_rotations=True))
