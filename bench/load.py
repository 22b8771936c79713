"""Closed-loop clients: each sends one transaction, waits for its commit, and sends the
next, for a fixed time. A process per node runs that node's clients as threads (so the
clients of three nodes use more than one core, and the link emulator in the suite's own
process is not slowed by them).

What "committed" means per system, as each one's client sees it:

* TxSync: the client library's ``submit(..., wait="accepted")`` to the client's DC:
  answered once that DC has it ACCEPTED (ordered: in the agreed order, which no DC can
  change); one ``Submit`` call each. With ``wait="ok"``: answered once the client's own
  DC applied it (its workers ran it), as the peers apply before they answer. Batched:
  ``submit_many`` of ``batch`` transactions, one ``SubmitBatch`` call, answered once all
  are ACCEPTED; or (``rows_per_tx``) one transaction of ``batch`` upserts, the peers'
  batch shape.
* etcd: ``KV/Put`` answered (committed by a Raft majority). Batched: one ``KV/Txn`` of
  ``batch`` puts.
* Galera: ``INSERT ... ON DUPLICATE KEY UPDATE`` with autocommit answered (certified by
  the group); a deadlock answer (a certification conflict) is retried and counted.
  Batched: one such statement of ``batch`` rows, one transaction.

Reads (``Plan.read``): one row by key at the client's own node, as each system offers
it: TxSync's ``query`` (answered by its DC's worker), Galera's local SELECT, etcd's
linearizable and serializable Range.

Batched against batched is the like-for-like comparison of throughput (issue 20): each
system commits ``batch`` writes per call, in its own way; the suite reports rows and
transactions a second apart (issue 52), since TxSync's batch is ``batch`` transactions
and the peers' is one.

Each node's process also measures its own CPU time inside the window (``cpu_s``): what
the harness's clients cost, reported beside the systems' own CPU.

Latencies are measured inside the window only; every loop stops by itself at its end.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import grpc

from bench.systems import (
    GALERA_SELECT,
    GALERA_UPSERT,
    KEYS,
    TXSYNC_SELECT,
    TXSYNC_UPSERT,
    VALUE_BYTES,
)
from txsync.client import Client, Statement

GALERA_DEADLOCK = 1213
"""ER_LOCK_DEADLOCK: how Galera tells a client its transaction lost certification."""


@dataclass(frozen=True)
class Plan:
    system: str
    """"TxSync", "etcd" or "Galera"."""
    node: str
    address: str
    clients: int
    measure_from: float
    """Wall-clock time (``time.time()``) the measured window opens; clients start at once
    and warm up until then."""
    stop_at: float
    batch: int = 1
    """Rows written per call."""
    rows_per_tx: int = 1
    """TxSync only: 1 sends a batch as ``batch`` transactions (``SubmitBatch``); ``batch``
    sends it as one transaction of ``batch`` statements. etcd's and Galera's batch is
    always one transaction."""
    wait: str = "accepted"
    """TxSync only: what the client waits for at its own DC ("accepted" or "ok")."""
    read: str = ""
    """Not "": each call reads one row by key at the client's own node instead of
    writing: TxSync ``query`` (its DC's worker), Galera a local SELECT, etcd a Range,
    "linearizable" or "serializable"."""


@dataclass
class NodeResult:
    node: str
    latencies_ms: list[float] = field(default_factory=list)
    committed: int = 0
    """Rows this node's clients saw committed inside the window."""
    aborts: int = 0
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    """CPU time of this node's client process inside the window."""


def run(plans: list[Plan]) -> list[NodeResult]:
    """Every plan's clients at once, one process per plan (node)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(plans), mp_context=context) as pool:
        return list(pool.map(_run_node, plans))


def _run_node(plan: Plan) -> NodeResult:
    result = NodeResult(plan.node)
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_client, args=(plan, n, result, lock), daemon=True)
        for n in range(plan.clients)
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, plan.measure_from - time.time()))
    cpu_from = time.process_time()
    time.sleep(max(0.0, plan.stop_at - time.time()))
    result.cpu_s = time.process_time() - cpu_from
    for thread in threads:
        thread.join(timeout=max(0.0, plan.stop_at - time.time()) + 60)
    return result


def _client(plan: Plan, n: int, result: NodeResult, lock: threading.Lock) -> None:
    rng = random.Random(hash((plan.node, n)))
    try:
        send = _sender(plan, rng)
    except Exception as error:  # reported, not raised: this runs in a child process
        with lock:
            result.errors.append(f"connect: {error!r}")
        return
    latencies: list[float] = []
    committed = aborts = 0
    while (now := time.time()) < plan.stop_at:
        started = time.perf_counter()
        try:
            count, retried = send()
        except Exception as error:  # counted; the client goes on
            with lock:
                result.errors.append(repr(error)[:300])
            time.sleep(0.1)
            continue
        took = time.perf_counter() - started
        if now >= plan.measure_from:
            latencies.append(took * 1000)
            committed += count
            aborts += retried
    with lock:
        result.latencies_ms += latencies
        result.committed += committed
        result.aborts += aborts


def value_of(rng: random.Random) -> str:
    """A new 100-byte value each time: an upsert that writes what the row holds already
    changes nothing, and MariaDB would then replicate nothing (and be measured doing so)."""
    return f"{rng.randrange(10**12):012d}".ljust(VALUE_BYTES, "x")


def _sender(plan: Plan, rng: random.Random) -> Callable[[], tuple[int, int]]:
    """A function that commits one transaction (or batch) and returns (how many, aborts)."""
    if plan.system == "TxSync":
        return _txsync_sender(plan, rng)
    if plan.system == "etcd":
        from bench.peers.etcd import put_stub, range_stub, txn_stub  # noqa: PLC0415

        channel = grpc.insecure_channel(plan.address)
        put, txn = put_stub(channel), txn_stub(channel)
        if plan.read:
            get = range_stub(channel, serializable=plan.read == "serializable")

            def etcd_get() -> tuple[int, int]:
                get(b"t/%d" % rng.randrange(KEYS))
                return 1, 0

            return etcd_get

        def etcd_put() -> tuple[int, int]:
            put(b"t/%d" % rng.randrange(KEYS), value_of(rng).encode())
            return 1, 0

        def etcd_txn() -> tuple[int, int]:
            # Distinct keys: etcd refuses a transaction that puts one key twice.
            txn([(b"t/%d" % key, value_of(rng).encode())
                 for key in rng.sample(range(KEYS), plan.batch)])  # fmt: skip
            return plan.batch, 0

        return etcd_txn if plan.batch > 1 else etcd_put
    if plan.system == "Galera":
        import pymysql  # noqa: PLC0415 - only the Galera clients need it

        host, port = plan.address.rsplit(":", 1)
        connection = pymysql.connect(host=host, port=int(port), user="root", autocommit=True)
        cursor = connection.cursor()

        def galera_select() -> tuple[int, int]:
            cursor.execute(GALERA_SELECT, (rng.randrange(KEYS),))
            cursor.fetchall()
            return 1, 0

        if plan.read:
            return galera_select

        def galera_upsert() -> tuple[int, int]:
            aborts = 0
            rows = [(rng.randrange(KEYS), value_of(rng)) for _ in range(plan.batch)]
            while True:
                try:
                    # A batch is one multi-row statement (PyMySQL's executemany of an
                    # INSERT), so one autocommit transaction and one round trip.
                    cursor.executemany(GALERA_UPSERT, rows)
                    return plan.batch, aborts
                except pymysql.err.OperationalError as error:
                    if error.args[0] != GALERA_DEADLOCK:
                        raise
                    aborts += 1

        return galera_upsert
    raise ValueError(f"no such system {plan.system!r}")


_CLIENTS: dict[str, Client] = {}
_CLIENTS_LOCK = threading.Lock()


def _txsync_client(plan: Plan) -> Client:
    """The client library (``txsync_client``), one per node process, shared by that
    node's callers. Each call carries one caller's work, as etcd's and Galera's clients'
    calls do: one transaction (``batch_max`` 1), or one batch of ``plan.batch``."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(plan.address)
        if client is None:
            per_call = plan.batch if plan.rows_per_tx == 1 else 1  # transactions per call
            client = _CLIENTS[plan.address] = txsync_client(plan.address, plan.clients, per_call)
    return client


def txsync_client(address: str, callers: int, batch: int) -> Client:
    """The client library as the benchmark's callers use it: no idempotency keys (the
    other systems have none to pay for), a call in flight per caller, ``batch`` per call."""
    return Client(address, batch_max=batch, in_flight_max=callers, idempotent=False, timeout=40)


def _txsync_sender(plan: Plan, rng: random.Random) -> Callable[[], tuple[int, int]]:
    client = _txsync_client(plan)
    wait = "ok" if plan.wait == "ok" else "accepted"

    def submit_one() -> tuple[int, int]:
        client.submit(TXSYNC_UPSERT, rng.randrange(KEYS), value_of(rng), wait=wait)
        return 1, 0

    def submit_batch() -> tuple[int, int]:
        upserts = [(TXSYNC_UPSERT, (rng.randrange(KEYS), value_of(rng))) for _ in range(plan.batch)]
        return len(client.submit_many(upserts, wait=wait)), 0

    def submit_statements() -> tuple[int, int]:
        # Distinct keys, as etcd's Txn needs them: one transaction of ``batch`` rows.
        keys = rng.sample(range(KEYS), plan.batch)
        client.submit([Statement(TXSYNC_UPSERT, (key, value_of(rng))) for key in keys], wait=wait)
        return plan.batch, 0

    def query_one() -> tuple[int, int]:
        client.query(TXSYNC_SELECT, rng.randrange(KEYS))
        return 1, 0

    if plan.read:
        return query_one
    if plan.batch == 1:
        return submit_one
    return submit_statements if plan.rows_per_tx > 1 else submit_batch
