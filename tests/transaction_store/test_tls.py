"""TLS on the store's client port (issue 17): clients verify the store, tokens travel
encrypted, a client certificate identifies its holder, plaintext to a TLS port fails, and
the CLI speaks TLS with --tls-ca. Over plaintext, a token from another machine is
refused unless the operator allows it."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.support.processes import ServiceProcess, free_port, transaction_store
from txsync import access
from txsync.access import AccessInterceptor, AccessPolicy
from txsync.client import Client, Tls, TxSyncError
from txsync.rpc import health_status
from txsync.tls import is_loopback
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TOKEN = "c-secret"


def _issue(out: Path, *names: str) -> Path:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), "--out", str(out), *names],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out


def _access_file(path: Path) -> Path:
    digest = hashlib.sha256(CLIENT_TOKEN.encode()).hexdigest()
    path.write_text(
        f'[[token]]\nname = "app"\nrole = "client"\nsha256 = "{digest}"\n\n'
        '[[identity]]\ncommon_name = "ops"\nrole = "reader"\n'
    )
    return path


def _tls_store(tmp_path: Path, certs: Path, *client_ca: str) -> ServiceProcess:
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = transaction_store(
        tmp_path, "dc1",
        "--tls-cert", str(certs / "dc1.pem"), "--tls-key", str(certs / "dc1.key"), *client_ca,
        "--access-file", str(_access_file(tmp_path / "access.toml")),
    )  # fmt: skip
    store.start()
    return store


BODY = common_pb2.TxBody(statements=[common_pb2.Statement(sql="CREATE TABLE t (a)")])
NAME = [("grpc.ssl_target_name_override", "dc1")]
"""The development CA's certificates name the node (and localhost), not 127.0.0.1."""


def test_the_client_port_over_tls_with_tokens(tmp_path: Path) -> None:
    certs = _issue(tmp_path / "certs", "dc1")
    store = _tls_store(tmp_path / "store", certs)
    try:
        ca = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        with grpc.secure_channel(store.address, ca, NAME) as chan:
            token = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
            submitted = client_pb2_grpc.ClientServiceStub(chan).Submit(
                client_pb2.SubmitRequest(body=BODY), metadata=token, timeout=30
            )
            assert submitted.created
        with grpc.insecure_channel(store.address) as chan, pytest.raises(grpc.RpcError) as clear:
            client_pb2_grpc.ClientServiceStub(chan).Get(client_pb2.GetRequest(), timeout=10)
        assert clear.value.code() is grpc.StatusCode.UNAVAILABLE
        cli = subprocess.run(
            [sys.executable, "-m", "txsync.cli.main", "submit", "--sql", "CREATE TABLE u (a)",
             "--endpoints", store.address, "--tls-ca", str(certs / "ca.pem"),
             "--tls-server-name", "dc1", "--token", CLIENT_TOKEN, "--wait", "incoming"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert "INCOMING" in cli.stdout, cli.stdout
        assert "(TLS)" in store.log()
    finally:
        store.terminate()


def test_with_a_client_ca_a_certificate_names_the_caller(tmp_path: Path) -> None:
    certs = _issue(tmp_path / "certs", "dc1", "ops")
    store = _tls_store(tmp_path / "store", certs, "--tls-client-ca", str(certs / "ca.pem"))
    try:
        ca = (certs / "ca.pem").read_bytes()
        identity = grpc.ssl_channel_credentials(
            ca, (certs / "ops.key").read_bytes(), (certs / "ops.pem").read_bytes()
        )
        with grpc.secure_channel(store.address, identity, NAME) as chan:
            admin = admin_pb2_grpc.AdminServiceStub(chan)
            status = admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=30)
            assert status.local.node_id == "dc1", "the certificate alone names a reader"
            with pytest.raises(grpc.RpcError) as refused:
                client_pb2_grpc.ClientServiceStub(chan).Submit(
                    client_pb2.SubmitRequest(body=BODY), timeout=30
                )
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        anonymous = grpc.ssl_channel_credentials(ca)
        with (
            grpc.secure_channel(store.address, anonymous, NAME) as chan,
            pytest.raises(grpc.RpcError) as no_certificate,
        ):
            client_pb2_grpc.ClientServiceStub(chan).Get(client_pb2.GetRequest(), timeout=10)
        assert no_certificate.value.code() is grpc.StatusCode.UNAVAILABLE
        cli = subprocess.run(
            [sys.executable, "-m", "txsync.cli.main", "status", "--local",
             "--endpoints", store.address, "--tls-ca", str(certs / "ca.pem"),
             "--tls-server-name", "dc1", "--tls-cert", str(certs / "ops.pem"),
             "--tls-key", str(certs / "ops.key")],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert "dc1" in cli.stdout, cli.stdout + cli.stderr
    finally:
        store.terminate()


def test_a_client_fails_over_to_a_dc_whose_certificate_names_that_dc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's certificates name their DC: ``{dc}`` gives each DC its own name, where
    one name for every DC fails the second DC's handshake (issues 49 and 50). A client
    given no ``tls`` takes it from the variables the CLI reads."""
    certs = _issue(tmp_path / "certs", "dc1", "dc2")
    stores = {}
    for dc in ("dc1", "dc2"):
        stores[dc] = transaction_store(
            tmp_path / dc, dc,
            "--tls-cert", str(certs / f"{dc}.pem"), "--tls-key", str(certs / f"{dc}.key"),
        )  # fmt: skip
        stores[dc].start()
    endpoints = ",".join(f"{dc}={store.address}" for dc, store in stores.items())
    ca = (certs / "ca.pem").read_bytes()
    try:
        with Client(endpoints, tls=Tls(ca, server_name="{dc}"), timeout=60) as client:
            assert client.submit("CREATE TABLE t (a)", wait="incoming").created
            assert client.current.dc == "dc1"
            stores["dc1"].terminate()
            assert client.submit("CREATE TABLE u (a)", wait="incoming").created
            assert client.current.dc == "dc2", "failed over, and dc2's handshake passed"
        with (
            Client(endpoints, tls=Tls(ca, server_name="dc1"), timeout=10) as one_name,
            pytest.raises(TxSyncError),
        ):
            one_name.submit("CREATE TABLE v (a)", wait="incoming")
        monkeypatch.setenv("TXSYNC_TLS_CA", str(certs / "ca.pem"))
        monkeypatch.setenv("TXSYNC_TLS_SERVER_NAME", "{dc}")
        with Client(endpoints, timeout=60) as from_environment:
            assert from_environment.submit("CREATE TABLE w (a)", wait="incoming").dc == "dc2"
        cli = subprocess.run(
            [sys.executable, "-m", "txsync.cli.main", "status", "--local", "--dc", "dc2",
             "--endpoints", endpoints, "--tls-ca", str(certs / "ca.pem"),
             "--tls-server-name", "{dc}"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0 and "dc2" in cli.stdout, cli.stdout + cli.stderr
    finally:
        for store in stores.values():
            store.terminate()


def test_probes_that_speak_no_tls_ask_a_plaintext_port_that_serves_health_alone(
    tmp_path: Path,
) -> None:
    """The kubelet's gRPC probe speaks no TLS: the chart points it at ``--health-listen``
    (a TCP probe would pass before the log is recovered)."""
    certs = _issue(tmp_path / "certs", "dc1")
    health_address = f"127.0.0.1:{free_port()}"
    store = _tls_store(tmp_path / "store", certs, "--health-listen", health_address)
    try:
        with grpc.insecure_channel(health_address) as chan:
            for service in ("", "txsync.v1.ClientService"):
                status = health_status(chan, service, timeout_s=10)
                assert status == health_pb2.HealthCheckResponse.SERVING, service
            with pytest.raises(grpc.RpcError) as nothing_else:
                client_pb2_grpc.ClientServiceStub(chan).Get(client_pb2.GetRequest(), timeout=10)
            assert nothing_else.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(store.address) as chan, pytest.raises(grpc.RpcError):
            health_status(chan)  # the client port itself speaks only TLS
    finally:
        store.terminate()


def test_peers_are_told_apart_from_loopback() -> None:
    assert is_loopback("ipv4:127.0.0.1:5000") and is_loopback("ipv6:[::1]:5000")
    assert is_loopback("unix:/run/txsync.sock")
    assert not is_loopback("ipv4:10.1.2.3:5000") and not is_loopback("ipv6:[fd00::1]:5000")


def test_a_token_over_plaintext_from_another_machine_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server and client on loopback, the only network a test may use here; the
    peer is taken for another machine's (``is_loopback`` answers no), which is what the
    rule looks at."""
    policy = AccessPolicy.load(_access_file(tmp_path / "access.toml"))
    monkeypatch.setattr(access, "is_loopback", lambda peer: False)

    async def call(refuse: bool) -> grpc.StatusCode:
        interceptor = AccessInterceptor(policy, refuse_plaintext_tokens=refuse)
        server = grpc.aio.server(interceptors=[interceptor])
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        # Health is not governed; the client API is, so serve a stand-in of its name.
        generic = grpc.method_handlers_generic_handler(
            "txsync.v1.ClientService",
            {"Get": grpc.unary_unary_rpc_method_handler(_answer_empty)},
        )
        server.add_generic_rpc_handlers((generic,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as chan:
                get: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = chan.unary_unary(
                    "/txsync.v1.ClientService/Get"
                )
                try:
                    await get(b"", metadata=(("authorization", f"Bearer {CLIENT_TOKEN}"),))
                except grpc.aio.AioRpcError as error:
                    return error.code()
                return grpc.StatusCode.OK
        finally:
            await server.stop(None)

    assert asyncio.run(call(refuse=True)) is grpc.StatusCode.UNAUTHENTICATED
    assert asyncio.run(call(refuse=False)) is grpc.StatusCode.OK


async def _answer_empty(request: bytes, context: object) -> bytes:
    return b""


def test_health_needs_no_token(tmp_path: Path) -> None:
    """Probes keep working over plaintext with access control on."""
    store = transaction_store(
        tmp_path / "store", "dc1", "--access-file", str(_access_file(tmp_path / "a.toml"))
    )
    store.start()
    try:
        with grpc.insecure_channel(store.address) as chan:
            assert health_status(chan) == health_pb2.HealthCheckResponse.SERVING
    finally:
        store.terminate()
