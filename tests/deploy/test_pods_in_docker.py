"""The chart's pod specs, rendered by Helm's engine, run under Docker (no Kubernetes can
run here): a broken command, argument, env variable, port or probe fails this test.

The master pod (store, coordinator with mutual TLS from the secret, dispatch) and a
worker pod of dc1 start from the rendered specs; every container answers its gRPC
readiness probe; the worker registers with the master's dispatch by the DNS name the
chart gives it; the `helm test` pod's command runs against the DC.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest

from tests.support.chart import ROOT, example_values, merged, render
from tests.support.docker_pods import Pod, pod_env, run_pod, wait_ready
from txsync.v1 import admin_pb2, admin_pb2_grpc

pytestmark = pytest.mark.docker
RELEASE = NAMESPACE = "txsync-dc1"


@pytest.fixture
def network() -> Iterator[str]:
    name = f"txsync-test-{uuid.uuid4().hex[:8]}"
    created = docker.from_env().networks.create(name, driver="bridge")
    yield name
    created.remove()


def _spec(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
    spec: dict[str, Any] = (
        found["spec"]["template"]["spec"] if kind == "StatefulSet" else found["spec"]
    )
    return spec


def _secret(path: Path) -> Path:
    """The TLS secret's files (ca.crt, tls.crt, tls.key) from the development CA."""
    issued = path / "issued"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), "--out", str(issued), "dc1"],
        check=True, capture_output=True,
    )  # fmt: skip
    secret = path / "tls"
    secret.mkdir()
    shutil.copy(issued / "ca.pem", secret / "ca.crt")
    shutil.copy(issued / "dc1.pem", secret / "tls.crt")
    shutil.copy(issued / "dc1.key", secret / "tls.key")
    return secret


def test_rendered_pods_start_and_answer_their_probes(
    image: str, network: str, tmp_path: Path
) -> None:
    values = merged(example_values("three-dcs", "dc1.yaml"), {"image": {"tag": "dev"}})
    objects = render(values, RELEASE, NAMESPACE)
    master_spec = _spec(objects, "StatefulSet", f"{RELEASE}-master")
    worker_spec = _spec(objects, "StatefulSet", f"{RELEASE}-workers")
    test_spec = _spec(objects, "Pod", f"{RELEASE}-test-status")
    pods: list[Pod] = []
    tls = _secret(tmp_path)
    # Access control is on by default. The example names the one access secret every DC
    # shares, made as the guide makes it (`txsync access secret`), mounted and filling
    # the env as Kubernetes would.
    assert not [o for o in objects if o["kind"] == "Secret"]
    made = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "access", "secret"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    access = json.loads(made.stdout)
    assert access["metadata"]["name"] == values["access"]["secretName"]
    tokens = access["stringData"]
    secrets = {access["metadata"]["name"]: tokens}
    (tmp_path / "access").mkdir()
    (tmp_path / "access" / "access.toml").write_text(tokens["access.toml"])
    admin_token = (("authorization", f"Bearer {tokens['admin-token']}"),)
    try:
        (tmp_path / "master-data").mkdir()
        master = run_pod(
            master_spec, f"{RELEASE}-master-0", namespace=NAMESPACE, network=network,
            volumes={"data": tmp_path / "master-data", "tls": tls, "access": tmp_path / "access"},
            secrets=secrets,
        )  # fmt: skip
        pods.append(master)
        wait_ready(master, master_spec)
        master_host = f"{RELEASE}-master-0.{RELEASE}-master.{NAMESPACE}.svc.cluster.local"
        worker_name = f"{RELEASE}-workers-0"
        (tmp_path / "worker-data").mkdir()
        worker = run_pod(
            worker_spec, worker_name, namespace=NAMESPACE, network=network,
            volumes={"data": tmp_path / "worker-data", "access": tmp_path / "access"},
            extra_hosts={master_host: master.ip(network)}, secrets=secrets,
        )  # fmt: skip
        pods.append(worker)
        wait_ready(worker, worker_spec)

        # The client port speaks TLS; the certificate names the DC.
        credentials = grpc.ssl_channel_credentials((tls / "ca.crt").read_bytes())
        name = [("grpc.ssl_target_name_override", "dc1")]
        with grpc.secure_channel(master.address(7001), credentials, name) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            deadline = time.monotonic() + 30
            while True:
                listed = admin.ListWorkers(
                    admin_pb2.ListWorkersRequest(), timeout=5, metadata=admin_token
                ).workers
                if [w.worker_id for w in listed] == [worker_name]:
                    break
                assert time.monotonic() < deadline, master.logs() + worker.logs()
                time.sleep(0.5)
            assert listed[0].url.startswith(f"{worker_name}.{RELEASE}-workers.{NAMESPACE}.svc")
            deadline = time.monotonic() + 30
            while True:  # the others are silent: after the exclusion timeout, a minority
                local = admin.GetStatus(
                    admin_pb2.GetStatusRequest(), timeout=5, metadata=admin_token
                ).local
                if local.quorum == admin_pb2.QUORUM_STATE_MINORITY:
                    break
                assert time.monotonic() < deadline, local
                time.sleep(0.5)
            assert local.node_id == "dc1" and local.workers_total == 1

        # The `helm test` pod: a lone DC of three is unhealthy, and says so.
        status = test_spec["containers"][0]
        mounts = {str(tls): {"bind": m["mountPath"], "mode": "ro"}
                  for m in status.get("volumeMounts", []) if m["name"] == "tls"}  # fmt: skip
        assert mounts, "the helm test pod reads the CA to check the store's certificate"
        tester = docker.from_env().containers.run(
            status["image"], command=status["args"], network=network, detach=True,
            extra_hosts={RELEASE: master.ip(network)}, volumes=mounts,
            environment=pod_env(status, "test-status", NAMESPACE, secrets),
        )  # fmt: skip
        try:
            exit_status = tester.wait(timeout=60)["StatusCode"]
            printed = tester.logs().decode()
        finally:
            tester.remove(force=True)
        assert exit_status == 1 and "dc1" in printed and "MINORITY" in printed, printed
        for pod in pods:
            for container in pod.containers:
                container.reload()
                assert container.status == "running", pod.logs()
    finally:
        for pod in pods:
            pod.remove()
