"""Access control: with --access-file the client and admin APIs want a token with the
right role, refusals are counted, and the DC's front door passes the caller's token on."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc

from tests.support.processes import free_port, sync_coordinator, transaction_store
from txsync.rpc import health_status
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

TOKENS = {"client": "c-secret", "reader": "r-secret", "admin": "a-secret"}


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


def test_tokens_and_roles_guard_the_client_and_admin_apis(tmp_path: Path) -> None:
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

            assert submit(None) is grpc.StatusCode.UNAUTHENTICATED
            assert submit("reader") is grpc.StatusCode.PERMISSION_DENIED
            assert submit("client") is grpc.StatusCode.OK
            assert submit("admin") is grpc.StatusCode.OK
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

        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as answer:
            scraped = answer.read().decode()
        refused = {
            reason: float(line.rsplit(" ", 1)[1])
            for line in scraped.splitlines()
            if line.startswith("txsync_access_refused_total{")
            for reason in ("unauthenticated", "forbidden")
            if f'reason="{reason}"' in line
        }
        assert refused == {"unauthenticated": 2, "forbidden": 3}, refused
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
    assert "role must be client, reader or admin" in result.stderr
