"""Mutual TLS between DCs: peers prove who they are, and no one speaks for another."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import LocalCluster, submit_at
from tests.support.peer_stream import post
from txsync.protocol import GENESIS_TX_ID
from txsync.v1 import common_pb2, peer_pb2, peer_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _dev_ca(out: Path, *nodes: str, ca_name: str = "TxSync development CA") -> Path:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), "--out", str(out),
         "--ca-name", ca_name, *nodes],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("certs")
    _dev_ca(root / "foreign", "dc2", ca_name="Somebody else's CA")
    return _dev_ca(root, "dc1", "dc2", "dc3", "dc9")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("tls"), 3, tls_dir=certs)
    yield cluster
    cluster.stop()


def _post(sender: str) -> peer_pb2.PostRequest:
    return peer_pb2.PostRequest(
        sender=sender,
        epoch=1,
        seq=1,
        base=common_pb2.MergeBase(synced_len=0, last_tx_id=GENESIS_TX_ID),
    )


def _call_as(
    cluster: LocalCluster, ca: Path, cert: Path | None, key: Path | None, sender: str
) -> tuple[grpc.StatusCode, str]:
    """Post to dc1 as ``sender`` with these credentials; the refusal's code and text."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    address = cluster.dcs[0].coordinator.address
    options = [("grpc.ssl_target_name_override", "dc1")]
    with (
        grpc.secure_channel(address, credentials, options=options) as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        post(peer_pb2_grpc.PeerServiceStub(channel), _post(sender), timeout=5)
    error: grpc.Call = caught.value  # type: ignore[assignment]  # every RpcError is a Call
    return error.code(), error.details() or ""


def test_three_dcs_agree_over_mutual_tls(cluster: LocalCluster) -> None:
    acked: list[str] = []
    lock = threading.Lock()
    threads = [threading.Thread(target=submit_at, args=(dc, 15, acked, lock)) for dc in cluster.dcs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cluster.wait_converged(set(acked))) == 45
    assert "PLAINTEXT" not in cluster.dcs[0].coordinator.log()


def test_a_node_the_configuration_does_not_name_is_refused(
    cluster: LocalCluster, certs: Path
) -> None:
    code, details = _call_as(cluster, certs / "ca.pem", certs / "dc9.pem", certs / "dc9.key", "dc9")
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert "'dc9' is not a configured peer" in details
    assert "refused a call" in cluster.dcs[0].coordinator.log()


def test_a_peer_cannot_speak_for_another(cluster: LocalCluster, certs: Path) -> None:
    code, details = _call_as(cluster, certs / "ca.pem", certs / "dc2.pem", certs / "dc2.key", "dc3")
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert "certificate names 'dc2', but the call claims to be 'dc3'" in details


def test_a_certificate_from_another_ca_or_none_fails_the_handshake(
    cluster: LocalCluster, certs: Path
) -> None:
    foreign = certs / "foreign"
    code, _ = _call_as(cluster, certs / "ca.pem", foreign / "dc2.pem", foreign / "dc2.key", "dc2")
    assert code is grpc.StatusCode.UNAVAILABLE
    code, _ = _call_as(cluster, certs / "ca.pem", None, None, "dc2")
    assert code is grpc.StatusCode.UNAVAILABLE


def test_plaintext_must_be_asked_for(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "sync-coordinator", "--node-id", "dc1",
         "--store", "127.0.0.1:1", "--peer", "dc2=127.0.0.1:2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--plaintext for local development" in result.stderr
