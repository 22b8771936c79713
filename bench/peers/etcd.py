"""etcd 3.4 (Debian's ``etcd-server``): an N-member Raft cluster on 127.0.0.1.

Each member listens for peers on a port of its own and advertises the link emulator's
port in front of it (``--initial-advertise-peer-urls``), so every Raft message between
members crosses a delayed link; clients reach members directly, each client being local
to the member it talks to. Election and heartbeat timeouts are sized for the round trip,
as etcd's tuning guide advises (heartbeat about the RTT, election 10x).

The client side speaks etcd's gRPC API (``etcdserverpb.KV/Put``) with the message types
built at run time from their field numbers (``put_stub``), so no etcd stubs are generated
or vendored: a put is what ``etcdctl put`` sends.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench.peers import stop_processes
from tests.support.processes import free_port
from txsync.link_emulator import LinkEmulator, LinkSettings

START_TIMEOUT_S = 60.0
PACKAGES = ("etcd-server", "etcd-client")


@dataclass
class EtcdMember:
    name: str
    data: Path
    client_port: int
    peer_port: int
    advertised_peer_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    pid: int = 0

    @property
    def client_address(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class EtcdCluster:
    root: Path
    size: int
    emulator: LinkEmulator
    one_way_delay_ms: float
    members: list[EtcdMember] = field(default_factory=list)

    def start(self) -> None:
        if shutil.which("etcd") is None:
            raise RuntimeError(f"no etcd: apt-get install -y {' '.join(PACKAGES)}")
        self.root.mkdir(parents=True, exist_ok=True)
        for n in range(self.size):
            member = EtcdMember(f"etcd{n + 1}", self.root / f"etcd{n + 1}", free_port(),
                                free_port())  # fmt: skip
            member.advertised_peer_port = self.emulator.add_link(
                "*", member.name, member.peer_port, LinkSettings(delay_ms=self.one_way_delay_ms)
            )
            self.members.append(member)
        initial = ",".join(
            f"{m.name}=http://127.0.0.1:{m.advertised_peer_port}" for m in self.members
        )
        rtt_ms = 2 * self.one_way_delay_ms
        heartbeat_ms = max(100, int(rtt_ms * 1.5))
        for member in self.members:
            log = (self.root / f"{member.name}.log").open("wb")
            member.process = subprocess.Popen(
                ["etcd", "--name", member.name, "--data-dir", str(member.data),
                 "--listen-client-urls", f"http://{member.client_address}",
                 "--advertise-client-urls", f"http://{member.client_address}",
                 "--listen-peer-urls", f"http://127.0.0.1:{member.peer_port}",
                 "--initial-advertise-peer-urls",
                 f"http://127.0.0.1:{member.advertised_peer_port}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", "txsync-bench",
                 "--heartbeat-interval", str(heartbeat_ms),
                 "--election-timeout", str(heartbeat_ms * 10),
                 "--logger", "zap", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            member.pid = member.process.pid
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.leader() is None:
            for member in self.members:
                assert member.process is not None
                if member.process.poll() is not None:
                    raise RuntimeError(f"{member.name} exited: see {self.root}/{member.name}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd elected no leader in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.3)

    def leader(self) -> str | None:
        """The leader's name, or None while there is none (``etcdctl endpoint status``)."""
        endpoints = ",".join(f"http://{m.client_address}" for m in self.members)
        result = subprocess.run(
            ["etcdctl", "--endpoints", endpoints, "endpoint", "status", "-w", "json"],
            capture_output=True, text=True, timeout=20, check=False,
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        if result.returncode != 0:
            return None
        for status in json.loads(result.stdout):
            header = status["Status"]["header"]
            if status["Status"].get("leader") == header["member_id"]:
                address = status["Endpoint"].removeprefix("http://")
                return next(m.name for m in self.members if m.client_address == address)
        return None

    def revision(self) -> int:
        """The cluster's latest revision (one per committed put)."""
        result = subprocess.run(
            ["etcdctl", "--endpoints", f"http://{self.members[0].client_address}",
             "endpoint", "status", "-w", "json"],
            capture_output=True, text=True, timeout=20, check=True,
            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        return int(json.loads(result.stdout)[0]["Status"]["header"]["revision"])

    def stop(self) -> None:
        stop_processes((m.process for m in self.members), timeout_s=30)
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def pids(self) -> dict[str, int]:
        return {m.name: m.pid for m in self.members}


def txn_stub(channel: grpc.Channel) -> Callable[[list[tuple[bytes, bytes]]], int]:
    """``txn(puts)``: every (key, value) put in one etcd transaction (``KV/Txn`` with no
    compare, one raft entry); returns the revision it was committed at."""
    request_type, response_type = _txn_types()
    call: grpc.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
        "/etcdserverpb.KV/Txn",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=response_type.FromString,
    )

    def txn(puts: list[tuple[bytes, bytes]]) -> int:
        request = request_type()
        for key, value in puts:
            put = request.success.add().request_put
            put.key, put.value = key, value
        return int(call(request, timeout=30).header.revision)

    return txn


def range_stub(channel: grpc.Channel, *, serializable: bool) -> Callable[[bytes], int]:
    """``get(key)``: one ``KV/Range`` of ``key``; how many keys it found. Linearizable
    (etcd's default: the member confirms with the leader that it is current) or
    ``serializable`` (the member answers from its own store, possibly stale)."""
    request_type, response_type = _range_types()
    call: grpc.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
        "/etcdserverpb.KV/Range",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=response_type.FromString,
    )

    def get(key: bytes) -> int:
        return int(call(request_type(key=key, serializable=serializable), timeout=30).count)

    return get


def _range_types() -> tuple[type[Any], type[Any]]:
    """``RangeRequest`` / ``RangeResponse`` with the fields a point read uses (by their
    numbers in etcd's rpc.proto; the answer's key-values are kept as unknown fields)."""
    pool, file = _pool_with_put()
    request = file.message_type.add(name="RangeRequest")
    request.field.add(name="key", number=1, label=1,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES)  # fmt: skip
    request.field.add(name="serializable", number=7, label=1,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL)  # fmt: skip
    response = file.message_type.add(name="RangeResponse")
    _add_header(response)
    response.field.add(name="count", number=4, label=1,
                       type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64)  # fmt: skip
    return _message_types(pool, file, "Range")


def _txn_types() -> tuple[type[Any], type[Any]]:
    """``TxnRequest`` / ``TxnResponse`` with what a transaction of puts uses (fields by
    their numbers in etcd's rpc.proto)."""
    pool, file = _pool_with_put()
    op = file.message_type.add(name="RequestOp")
    op.oneof_decl.add(name="request")
    op.field.add(name="request_put", number=2, label=1, oneof_index=0,
                 type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                 type_name=".etcdserverpb.PutRequest")  # fmt: skip
    request = file.message_type.add(name="TxnRequest")
    request.field.add(name="success", number=2, label=3,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                      type_name=".etcdserverpb.RequestOp")  # fmt: skip
    response = file.message_type.add(name="TxnResponse")
    _add_header(response)
    response.field.add(name="succeeded", number=2, label=1,
                       type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL)  # fmt: skip
    return _message_types(pool, file, "Txn")


def _put_types() -> tuple[type[Any], type[Any]]:
    """``etcdserverpb.PutRequest`` / ``PutResponse`` with the fields a put uses, by their
    numbers in etcd's rpc.proto (unknown fields of the answer are kept, not needed)."""
    pool, file = _pool_with_put()
    return _message_types(pool, file, "Put")


def _pool_with_put() -> tuple[descriptor_pool.DescriptorPool, descriptor_pb2.FileDescriptorProto]:
    """A pool and a file (not yet added) with PutRequest, ResponseHeader, PutResponse."""
    file = descriptor_pb2.FileDescriptorProto(name="txsync_bench_etcd_kv.proto",
                                              package="etcdserverpb", syntax="proto3")  # fmt: skip
    request = file.message_type.add(name="PutRequest")
    for number, name, kind in ((1, "key", "TYPE_BYTES"), (2, "value", "TYPE_BYTES"),
                               (3, "lease", "TYPE_INT64")):  # fmt: skip
        request.field.add(name=name, number=number, label=1,
                          type=descriptor_pb2.FieldDescriptorProto.Type.Value(kind))  # fmt: skip
    header = file.message_type.add(name="ResponseHeader")
    for number, name in ((1, "cluster_id"), (2, "member_id"), (3, "revision"), (4, "raft_term")):
        header.field.add(name=name, number=number, label=1,
                         type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT64)  # fmt: skip
    response = file.message_type.add(name="PutResponse")
    _add_header(response)
    return descriptor_pool.DescriptorPool(), file


def _add_header(response: descriptor_pb2.DescriptorProto) -> None:
    """The ``header`` (field 1) every etcd response starts with."""
    response.field.add(name="header", number=1, label=1,
                       type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                       type_name=".etcdserverpb.ResponseHeader")  # fmt: skip


def _message_types(
    pool: descriptor_pool.DescriptorPool, file: descriptor_pb2.FileDescriptorProto, call: str
) -> tuple[type[Any], type[Any]]:
    """``file`` added to ``pool``; the classes of ``<call>Request`` and ``<call>Response``."""
    pool.Add(file)

    def message_class(name: str) -> type[Any]:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"etcdserverpb.{name}"))

    return message_class(f"{call}Request"), message_class(f"{call}Response")


def put_stub(channel: grpc.Channel) -> Callable[[bytes, bytes], int]:
    """``put(key, value)`` over ``channel``; returns the revision it was committed at."""
    request_type, response_type = _put_types()
    call: grpc.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
        "/etcdserverpb.KV/Put",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=response_type.FromString,
    )

    def put(key: bytes, value: bytes) -> int:
        return int(call(request_type(key=key, value=value), timeout=30).header.revision)

    return put
