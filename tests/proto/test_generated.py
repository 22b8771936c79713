"""Generated protobuf code is fresh, importable, and carries every service's contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_service_contract_is_generated() -> None:
    from txsync.v1 import (
        admin_pb2_grpc,
        client_pb2_grpc,
        peer_pb2_grpc,
        store_pb2_grpc,
        worker_pb2_grpc,
    )

    stubs = {
        client_pb2_grpc: ["ClientServiceStub"],
        store_pb2_grpc: ["StoreInternalServiceStub"],
        peer_pb2_grpc: ["PeerServiceStub"],
        worker_pb2_grpc: ["WorkerServiceStub", "DispatchServiceStub"],
        admin_pb2_grpc: ["AdminServiceStub"],
    }
    for module, names in stubs.items():
        for name in names:
            assert hasattr(module, name), f"{module.__name__} lacks {name}"
