"""Access control: with --access-file the client and admin APIs want a token with the
right role, refusals are counted, and the DC's front door passes the caller's token on.
The internal APIs (store, worker, dispatch) answer only the DC's own services, which
present TXSYNC_SERVICE_TOKEN; a whole DC applies transactions so."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.processes import (
    ServiceProcess,
    free_port,
    sync_coordinator,
    transaction_store,
    worker,
    worker_dispatch,
)
from tests.support.store_stream import advance
from txsync.access import CLIENT_WRITES
from txsync.rpc import SERVICE_TOKEN_ENV, health_status
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    store_pb2,
    store_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

TOKENS = {"client": "c-secret", "reader": "r-secret", "admin": "a-secret", "service": "s-secret"}


def _access_file(path: Path) -> Path:
    entries = [
        f'[[token]]\nname = "{role}-user"\nrole = "{role}"\n'
        f'sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
        for role, token in TOKENS.items()
    ]
    path.write_text("\n".join(entries))
    return path


def _as(role: str | None) -> tuple[tuple[str, str], ...]:
    return () if role is None else (("authorization", f"Bearer {TOKENS[role]}"),)


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def test_tokens_and_roles_guard_the_client_and_admin_apis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SERVICE_TOKEN_ENV, TOKENS["service"])  # the coordinator's
    access = _access_file(tmp_path / "access.toml")
    coordinator_port = free_port()
    metrics = f"127.0.0.1:{free_port()}"
    store = transaction_store(
        tmp_path / "store", "dc1", "--access-file", str(access), "--metrics-listen", metrics,
        "--coordinator", f"127.0.0.1:{coordinator_port}",
    )  # fmt: skip
    store.start()
    coordinator = sync_coordinator(
        tmp_path, "dc1", store.address, coordinator_port, {},
        "--plaintext", "--access-file", str(access),
    )  # fmt: skip
    coordinator.start()
    try:
        with grpc.insecure_channel(store.address) as channel:
            client = client_pb2_grpc.ClientServiceStub(channel)
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])

            def submit(role: str | None) -> grpc.StatusCode:
                request = client_pb2.SubmitRequest(body=body)
                return _code(lambda: client.Submit(request, metadata=_as(role), timeout=5))

            def status(role: str | None) -> grpc.StatusCode:
                request = admin_pb2.GetStatusRequest()
                return _code(lambda: admin.GetStatus(request, metadata=_as(role), timeout=5))

            def pause(role: str | None) -> grpc.StatusCode:
                request = admin_pb2.PauseSyncRequest()
                return _code(lambda: admin.PauseSync(request, metadata=_as(role), timeout=5))

            def submit_each(role: str | None) -> grpc.StatusCode:
                each = client_pb2.SubmitEachRequest(
                    call_id=1, submit=client_pb2.SubmitRequest(body=body)
                )
                return _code(
                    lambda: list(client.SubmitEach(iter([each]), metadata=_as(role), timeout=5))
                )

            assert submit(None) is grpc.StatusCode.UNAUTHENTICATED
            assert submit("reader") is grpc.StatusCode.PERMISSION_DENIED
            assert submit("client") is grpc.StatusCode.OK
            assert submit("admin") is grpc.StatusCode.OK
            assert submit_each("reader") is grpc.StatusCode.PERMISSION_DENIED
            assert submit_each("client") is grpc.StatusCode.OK
            wrong = (("authorization", "Bearer not-a-token"),)
            assert (
                _code(lambda: client.Submit(client_pb2.SubmitRequest(body=body), metadata=wrong))
                is grpc.StatusCode.UNAUTHENTICATED
            )

            assert status("client") is grpc.StatusCode.PERMISSION_DENIED
            assert status("reader") is grpc.StatusCode.OK
            local = admin.GetStatus(admin_pb2.GetStatusRequest(), metadata=_as("reader")).local
            assert local.view.members == ["dc1"], "the coordinator answered the forwarded call"
            assert pause("reader") is grpc.StatusCode.PERMISSION_DENIED
            assert pause("admin") is grpc.StatusCode.OK  # forwarded with the admin's token
            local = admin.GetStatus(admin_pb2.GetStatusRequest(), metadata=_as("admin")).local
            assert local.mode == admin_pb2.SYNC_MODE_PAUSED
            assert health_status(channel) == 1, "health checks need no token"

            internal = store_pb2_grpc.StoreInternalServiceStub(channel)

            def record_ok(role: str | None) -> grpc.StatusCode:
                # A transaction that never ran, made to show OK: only a service may.
                change = store_pb2.StateChange(tx_id="x", state=common_pb2.TX_STATE_OK)
                batch = store_pb2.AdvanceStatesRequest(changes=[change], service="x")
                return _code(lambda: advance(internal, batch, metadata=_as(role)))

            def read_bodies(role: str | None) -> grpc.StatusCode:
                request = store_pb2.ReadBodiesRequest(tx_ids=[str(uuid.uuid4())])
                return _code(lambda: internal.ReadBodies(request, metadata=_as(role)))

            assert record_ok(None) is grpc.StatusCode.UNAUTHENTICATED
            assert record_ok("admin") is grpc.StatusCode.PERMISSION_DENIED
            assert read_bodies("client") is grpc.StatusCode.PERMISSION_DENIED
            assert read_bodies("service") is grpc.StatusCode.OK

        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as answer:
            scraped = answer.read().decode()

        refused = {
            reason: float(line.rsplit(" ", 1)[1])
            for line in scraped.splitlines()
            if line.startswith("txsync_access_refused_total{")
            for reason in ("unauthenticated", "forbidden")
            if f'reason="{reason}"' in line
        }
        assert refused == {"unauthenticated": 3, "forbidden": 6}, refused
        assert "refused /txsync.v1.AdminService/PauseSync" in store.log()

        def cli(*token: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "txsync.cli.main", "status", "--local",
                 "--endpoints", store.address, *token],
                capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip

        without = cli()
        assert without.returncode == 1 and "UNAUTHENTICATED" in without.stdout
        paused = cli("--token", TOKENS["reader"])
        assert paused.returncode == 1 and "PAUSED" in paused.stdout  # unhealthy: paused
    finally:
        coordinator.terminate()
        store.terminate()


def test_every_client_method_is_a_read_or_a_write_on_purpose() -> None:
    """A ClientService method not in ``CLIENT_WRITES`` is open to readers: a new one that
    writes must be added there (``SubmitEach`` nearly was not)."""
    service = client_pb2.DESCRIPTOR.services_by_name["ClientService"]
    reads = {method.name for method in service.methods} - CLIENT_WRITES
    assert reads == {"Get", "Wait", "WaitBatch", "List", "Query"}


def test_a_bad_access_file_stops_the_service_with_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "access.toml"
    bad.write_text('[[token]]\nname = "x"\nrole = "root"\nsha256 = "00"\n')
    result = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "transaction-store", "--node-id", "dc1",
         "--data", str(tmp_path / "data"), "--listen", "127.0.0.1:0",
         "--access-file", str(bad)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "role must be client, reader, admin or service" in result.stderr


@dataclass
class OneDc:
    store: ServiceProcess
    worker: ServiceProcess
    dispatch: ServiceProcess


@contextlib.contextmanager
def _one_dc(
    tmp_path: Path, *flags: str, coordinator: bool = True, internal: str | None = None
) -> Iterator[OneDc]:
    """A DC of real processes (store, coordinator, worker, dispatch), each given ``flags``;
    ``internal``: the store serves its internal API there, where the others reach it."""
    store_flags = ("--internal-listen", internal) if internal else ()
    store = transaction_store(tmp_path / "store", "dc1", *flags, *store_flags)
    started: list[ServiceProcess] = [store]
    try:
        store.start()
        internal_api = internal or store.address
        if coordinator:
            started.append(sync_coordinator(
                tmp_path, "dc1", internal_api, free_port(), {}, "--plaintext", *flags
            ))  # fmt: skip
            started[-1].start()
        the_worker = worker(tmp_path / "w1", "w1", *flags)
        started.append(the_worker)
        the_worker.start()
        dispatch = worker_dispatch(
            tmp_path / "dispatch", internal_api, {"w1": the_worker.address}, *flags
        )
        started.append(dispatch)
        dispatch.start()
        yield OneDc(store, the_worker, dispatch)
    finally:
        for process in reversed(started):
            if process.process is not None:
                process.terminate()


BODY = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])


def _submit_ok(address: str, *credentials: tuple[str, str]) -> None:
    with grpc.insecure_channel(address) as channel:
        client = client_pb2_grpc.ClientServiceStub(channel)
        request = client_pb2.SubmitRequest(body=BODY, wait_for=common_pb2.TX_STATE_OK)
        answer = client.Submit(request, metadata=credentials, timeout=120)
        assert answer.state == common_pb2.TX_STATE_OK


def test_a_dc_under_access_control_applies_and_its_worker_answers_only_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store, coordinator, dispatch and worker all with --access-file: the services find
    each other with the service token, and a worker refuses anyone else's Apply."""
    monkeypatch.setenv(SERVICE_TOKEN_ENV, TOKENS["service"])
    access = str(_access_file(tmp_path / "access.toml"))
    with _one_dc(tmp_path, "--access-file", access) as dc:
        _submit_ok(dc.store.address, *_as("client"))
        with grpc.insecure_channel(dc.worker.address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            beat = worker_pb2.HeartbeatRequest()
            assert _code(lambda: stub.Heartbeat(beat)) is grpc.StatusCode.UNAUTHENTICATED
            apply = worker_pb2.ApplyRequest(position=2, tx_id="x", body=BODY.SerializeToString())
            without = _code(lambda: list(stub.Apply(iter([apply]))))
            assert without is grpc.StatusCode.UNAUTHENTICATED
            as_admin = _code(lambda: list(stub.Apply(iter([apply]), metadata=_as("admin"))))
            assert as_admin is grpc.StatusCode.PERMISSION_DENIED
            query = worker_pb2.WorkerServiceQueryRequest(
                statement=common_pb2.Statement(sql="SELECT count(*) FROM t")
            )
            assert stub.Query(query, metadata=_as("reader")).position == 1
            assert stub.Heartbeat(beat, metadata=_as("service")).position == 1


def test_with_an_internal_listener_the_client_port_has_no_internal_api(tmp_path: Path) -> None:
    """--internal-listen: the coordinator and dispatch reach the internal API there, and
    a client on the client port finds no such service at all."""
    internal = f"127.0.0.1:{free_port()}"
    with _one_dc(tmp_path, internal=internal) as dc:
        _submit_ok(dc.store.address)
        with grpc.insecure_channel(dc.store.address) as channel:
            internal_api = store_pb2_grpc.StoreInternalServiceStub(channel)
            request_bodies = store_pb2.ReadBodiesRequest(tx_ids=[str(uuid.uuid4())])
            refused = _code(lambda: internal_api.ReadBodies(request_bodies))
            assert refused is grpc.StatusCode.UNIMPLEMENTED
        assert "internal API on " + internal in dc.store.log()


def test_every_internal_method_wants_the_service_token(tmp_path: Path) -> None:
    """Each method of the internal APIs, called without a token, is refused before it
    runs (the hostile-input list of issue 17: unauthenticated calls to every internal and
    worker method)."""
    access = str(_access_file(tmp_path / "access.toml"))
    with _one_dc(tmp_path, "--access-file", access, coordinator=False) as dc:
        served = [
            (dc.store.address, store_pb2.DESCRIPTOR.services_by_name["StoreInternalService"]),
            (dc.worker.address, worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]),
            (dc.dispatch.address, worker_pb2.DESCRIPTOR.services_by_name["DispatchService"]),
        ]
        called = 0
        for address, service in served:
            with grpc.insecure_channel(address) as channel:
                for method in service.methods:
                    if method.name == "Query":  # a read the store forwards for clients
                        continue
                    path = f"/{service.full_name}/{method.name}"
                    code = _code(functools.partial(_call_empty, channel, path, method))
                    assert code is grpc.StatusCode.UNAUTHENTICATED, (path, code)
                    called += 1
        assert called == sum(len(service.methods) for _, service in served) - 1


def _call_empty(open_channel: grpc.Channel, path: str, method: Any) -> object:
    """Call ``path`` with one empty message, in whatever shape the method takes."""
    channel: Any = open_channel  # raw bytes in and out: no stub's types apply
    if method.client_streaming and method.server_streaming:
        return list(channel.stream_stream(path)(iter([b""]), timeout=10))
    if method.client_streaming:
        return channel.stream_unary(path)(iter([b""]), timeout=10)
    if method.server_streaming:
        return list(channel.unary_stream(path)(b"", timeout=10))
    return channel.unary_unary(path)(b"", timeout=10)


def test_a_dc_that_refuses_the_callers_token_is_listed_not_left_out(tmp_path: Path) -> None:
    """``tx get`` gathers the transaction from every DC with the caller's token: a DC whose
    access file does not know it (a release that generated its own) and a DC that is down
    each show with why, not as if they were not there (issue 49)."""
    other = tmp_path / "other.toml"
    digest = hashlib.sha256(b"another-admin").hexdigest()
    other.write_text(f'[[token]]\nname = "theirs"\nrole = "admin"\nsha256 = "{digest}"\n')
    dc2 = transaction_store(tmp_path / "dc2", "dc2", "--access-file", str(other))
    dc2.start()
    down = f"127.0.0.1:{free_port()}"
    dc1 = transaction_store(
        tmp_path / "dc1", "dc1",
        "--access-file", str(_access_file(tmp_path / "access.toml")),
        "--peer-store", f"dc2={dc2.address}", "--peer-store", f"dc3={down}",
    )  # fmt: skip
    dc1.start()
    try:
        with grpc.insecure_channel(dc1.address) as channel:
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])
            tx_id = (
                client_pb2_grpc.ClientServiceStub(channel)
                .Submit(client_pb2.SubmitRequest(body=body), metadata=_as("client"), timeout=30)
                .tx_id
            )
            found = admin_pb2_grpc.AdminServiceStub(channel).GetTransaction(
                admin_pb2.GetTransactionRequest(tx_id=tx_id), metadata=_as("reader"), timeout=30
            )
        by_dc = {dc.node_id: dc for dc in found.dcs}
        assert sorted(by_dc) == ["dc1", "dc2", "dc3"]
        assert not by_dc["dc1"].unanswered and by_dc["dc1"].state == common_pb2.TX_STATE_INCOMING
        assert "refused" in by_dc["dc2"].unanswered, by_dc["dc2"]
        assert "unreachable" in by_dc["dc3"].unanswered, by_dc["dc3"]
    finally:
        dc1.terminate()
        dc2.terminate()


def test_with_the_shared_secret_one_dc_gathers_from_the_others(tmp_path: Path) -> None:
    """The counterpart of the refusal above: both DCs given the access file of one
    ``txsync access secret``, as the chart's multi-DC install requires, and dc1 gathers
    the transaction from dc2 with the caller's admin token (issue 49)."""
    made = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "access", "secret"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    tokens = json.loads(made.stdout)["stringData"]
    shared = tmp_path / "access.toml"
    shared.write_text(tokens["access.toml"])
    dc2 = transaction_store(tmp_path / "dc2", "dc2", "--access-file", str(shared))
    dc2.start()
    dc1 = transaction_store(
        tmp_path / "dc1", "dc1", "--access-file", str(shared),
        "--peer-store", f"dc2={dc2.address}",
    )  # fmt: skip
    dc1.start()
    admin = (("authorization", f"Bearer {tokens['admin-token']}"),)
    try:
        with grpc.insecure_channel(dc1.address) as channel:
            body = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])
            tx_id = (
                client_pb2_grpc.ClientServiceStub(channel)
                .Submit(client_pb2.SubmitRequest(body=body), metadata=admin, timeout=30)
                .tx_id
            )
            found = admin_pb2_grpc.AdminServiceStub(channel).GetTransaction(
                admin_pb2.GetTransactionRequest(tx_id=tx_id), metadata=admin, timeout=30
            )
        by_dc = {dc.node_id: dc for dc in found.dcs}
        assert sorted(by_dc) == ["dc1", "dc2"]
        assert not by_dc["dc1"].unanswered, by_dc["dc1"]
        # dc2 let the token in and answered for itself: no coordinator runs, so it has not
        # seen the transaction (what the refusal test's dc2 never got to say).
        assert "does not know" in by_dc["dc2"].unanswered, by_dc["dc2"]
        assert "refused" not in by_dc["dc2"].unanswered
    finally:
        dc1.terminate()
        dc2.terminate()
