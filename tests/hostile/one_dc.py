"""One DC of real processes for the hostile suites: a transaction-store, its
sync-coordinator, worker-dispatch and two workers (SQLite, or PostgreSQL databases on
one server). Each case must end in a clear error or a FAILED verdict, and after it the
DC must apply the next transaction with both workers healthy and in sync
(``Dc.healthy_and_applying``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from tests.support.cluster import LocalCluster
from tests.support.processes import ServiceProcess, free_port, worker, worker_dispatch
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

OK, FAILED = common_pb2.TX_STATE_OK, common_pb2.TX_STATE_FAILED
WAIT_S = 120
CONTENT_CHECK_EVERY = 5
"""The content check every few positions: a case that breaks it shows at once."""


@dataclass
class Dc:
    cluster: LocalCluster
    dispatch: ServiceProcess
    channel: grpc.Channel

    @property
    def client(self) -> client_pb2_grpc.ClientServiceStub:
        return client_pb2_grpc.ClientServiceStub(self.channel)

    def submit(self, *sql: str, key: str = "", now_unix_us: int = 0) -> client_pb2.SubmitResponse:
        body = common_pb2.TxBody(
            statements=[common_pb2.Statement(sql=s) for s in sql], now_unix_us=now_unix_us
        )
        return self.submit_body(body, key=key)

    def submit_body(self, body: common_pb2.TxBody, key: str = "") -> client_pb2.SubmitResponse:
        request = client_pb2.SubmitRequest(
            body=body, idempotency_key=key, wait_for=OK, wait_timeout=Duration(seconds=WAIT_S)
        )
        return self.client.Submit(request, timeout=WAIT_S + 10)

    def fails_alone(self, statements: tuple[str, ...], words: str) -> None:
        """The transaction is FAILED with ``words`` in its error, and the DC goes on."""
        answer = self.submit(*statements)
        assert answer.state == FAILED, answer
        assert words in answer.outcome.error, answer.outcome.error
        self.healthy_and_applying()

    def healthy_and_applying(self) -> None:
        """The next transaction reaches OK and both workers agree on it."""
        answer = self.submit(f"INSERT INTO t VALUES ('{uuid.uuid4()}')")
        assert answer.state == OK, answer
        position = answer.outcome.position

        def agreed() -> bool:
            with grpc.insecure_channel(self.dispatch.address) as channel:
                listed = admin_pb2_grpc.AdminServiceStub(channel).ListWorkers(
                    admin_pb2.ListWorkersRequest(), timeout=10
                )
            workers = listed.workers
            return (
                not listed.alarms
                and all(w.healthy and not w.out_of_sync for w in workers)
                and {(w.position, w.state_digest) for w in workers}
                == {(position, answer.outcome.state_digest)}
            )

        self.cluster.wait_for("both workers healthy, in sync, at the next transaction", agreed)


@contextmanager
def one_dc(root: Path, *worker_flags: str, postgres: tuple[str, str] = ("", "")) -> Iterator[Dc]:
    """The DC, with ``CREATE TABLE t (v text)`` applied; ``postgres``: the two workers'
    conninfos (SQLite in ``root`` if empty)."""
    dispatch_port = free_port()
    cluster = LocalCluster(
        root, 1, store_args={"dc1": ("--dispatch", f"127.0.0.1:{dispatch_port}")}
    )
    flags = ("--content-check-every", str(CONTENT_CHECK_EVERY), *worker_flags)
    workers = {
        name: worker(root / name, name, *flags, port=free_port(), postgres=conninfo)
        for name, conninfo in zip(("w1", "w2"), postgres, strict=True)
    }
    dispatch = None
    try:
        for process in workers.values():
            process.start()
        addresses = {name: process.address for name, process in workers.items()}
        dispatch = worker_dispatch(
            root / "dispatch", cluster.dcs[0].store.address, addresses, port=dispatch_port
        )
        dispatch.start()
        with grpc.insecure_channel(cluster.dcs[0].store.address) as channel:
            dc = Dc(cluster, dispatch, channel)
            assert dc.submit("CREATE TABLE t (v text)").state == OK
            yield dc
    finally:
        if dispatch is not None:
            dispatch.terminate()
        for process in workers.values():
            process.terminate()
        cluster.stop()
