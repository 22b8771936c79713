"""worker-dispatch following its workers' StatefulSet, and `txsync workers scale`.

Against a STAND-IN for the Kubernetes API (tests/support/kube_api_standin.py): no API
server can run here. The workers, store, coordinator and dispatch are real processes;
each "pod" is a real worker listening on its own loopback address (127.0.0.x), as pods
have their own IPs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from tests.support.cluster import LocalCluster
from tests.support.kube_api_standin import KubeApiStandIn
from tests.support.processes import ServiceProcess, free_port, worker_dispatch
from txsync.v1 import admin_pb2, admin_pb2_grpc, client_pb2, client_pb2_grpc, common_pb2

NAMESPACE = "txsync-dc1"
STATEFULSET = "txsync-dc1-workers"


def _worker(root: Path, name: str, ip: str, port: int) -> ServiceProcess:
    data = root / name
    data.mkdir(parents=True)
    return ServiceProcess(
        ["worker", "--worker-id", name, "--data", str(data)], data, name, listen=f"{ip}:{port}"
    )


def test_dispatch_follows_the_pods_of_its_worker_statefulset(tmp_path: Path) -> None:
    port = free_port()  # every worker pod listens on the same port, each at its own IP
    cluster = LocalCluster(tmp_path, 1)
    store = cluster.dcs[0].store.address
    pods = {f"{STATEFULSET}-{n}": f"127.0.0.{n + 2}" for n in range(3)}
    workers = {name: _worker(tmp_path, name, ip, port) for name, ip in pods.items()}
    with KubeApiStandIn(NAMESPACE, STATEFULSET, {"app.kubernetes.io/component": "worker"}) as api:
        dispatch = worker_dispatch(
            tmp_path / "dispatch", store, {},
            "--kubernetes-workers", STATEFULSET, "--kubernetes-namespace", NAMESPACE,
            "--kubernetes-api", api.url, "--worker-port", str(port),
        )  # fmt: skip
        try:
            first, second, third = pods
            for name in (first, second):
                workers[name].start()
                api.add_pod(name, pods[name], ready=True)
            dispatch.start()

            def listed() -> dict[str, admin_pb2.WorkerStatus]:
                with grpc.insecure_channel(dispatch.address) as channel:
                    answer = admin_pb2_grpc.AdminServiceStub(channel).ListWorkers(
                        admin_pb2.ListWorkersRequest(), timeout=5
                    )
                return {w.worker_id: w for w in answer.workers}

            cluster.wait_for("both pods registered", lambda: set(listed()) == {first, second})
            assert listed()[first].url == f"{pods[first]}:{port}"
            tx_ids = _submit(store, 5)
            cluster.wait_for("applied on both", lambda: _all_at(listed(), 5))

            # Scale up: the pod is created (not ready yet), its worker starts, it turns
            # ready and is registered and brought up to date.
            api.add_pod(third, pods[third], ready=False)
            workers[third].start()
            assert third not in listed(), "a pod that is not ready is only expected"
            api.set_ready(third)
            cluster.wait_for("the new pod caught up", lambda: _all_at(listed(), 5, count=3))

            # Scale down: the pod is deleted while its worker still answers heartbeats;
            # dispatch drains it at once instead of waiting for it to stop answering.
            api.delete_pod(second)
            cluster.wait_for("drained at once", lambda: second not in listed(), timeout_s=3)
            still = workers[second].process
            assert still is not None and still.poll() is None, "its worker still runs"
            more = _submit(store, 3)
            cluster.wait_for("the rest go on", lambda: _all_at(listed(), 8, count=2))
            assert len(set(tx_ids + more)) == 8
            assert "drained at once" in dispatch.log()

            scaled = subprocess.run(
                [sys.executable, "-m", "txsync.cli.main", "workers", "scale", "--dc", "dc1",
                 "--replicas", "4", "--kubernetes-api", api.url],
                capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip
            assert scaled.returncode == 0, scaled.stderr
            assert api.replicas == 4 and "txsync-dc1/txsync-dc1-workers: 0 -> 4" in scaled.stdout
        finally:
            if dispatch.process is not None:
                dispatch.terminate()
            for process in workers.values():
                if process.process is not None and process.process.poll() is None:
                    process.terminate()
            cluster.stop()


def _submit(store: str, count: int) -> list[str]:
    with grpc.insecure_channel(store) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        statement = common_pb2.Statement(sql="CREATE TABLE IF NOT EXISTS t (a INTEGER)")
        body = common_pb2.TxBody(statements=[statement])
        return [stub.Submit(client_pb2.SubmitRequest(body=body)).tx_id for _ in range(count)]


def _all_at(workers: dict[str, admin_pb2.WorkerStatus], position: int, count: int = 2) -> bool:
    return len(workers) == count and all(
        w.position == position and w.healthy for w in workers.values()
    )
