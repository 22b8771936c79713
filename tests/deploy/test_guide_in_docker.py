"""The guide as a test: k8s/README.md, "One Kubernetes cluster per DC", walked in Docker
(issue 49). No Kubernetes runs here; what each step makes is stood in for as closely as
Docker allows, with exactly the chart's rendered pods, secrets and defaults (TLS and
access control on):

- each DC's cluster is a Docker network of its own; its pods are the rendered pod specs
  (tests/support/docker_pods.py), found by the in-cluster DNS names the chart gives them;
- the DC's LoadBalancer Services (client port 7001, peer port 7002) are one small
  forwarder on that network and on a shared "internet" network, where it answers to the
  DC's public name from the example values (``dc1.txsync.example.net``); the other DCs'
  coordinators and stores reach a DC through it alone, by that name;
- the certificates are scripts/dev_ca.py's, one per DC naming its id (guide step 2),
  and the access secret is made once by ``txsync access secret`` and given to every DC.

Every DC is installed with the previous release's image (built from its commit,
tests/support/releases.py) and upgraded to this checkout's one DC at a time, the pods
replaced on their volumes, each upgraded DC taking a submit while the others still run
the previous release. It then checks, from outside (this host, through the forwarders'
published ports): ``txsync status`` through dc1 healthy for all three DCs, a submit at
each DC applied at every DC, a client that fails over under TLS while dc1 is down, a
worker added to dc2 (what ``kubectl scale`` would start) registered and caught up, then
stopped as a deleted pod is (SIGTERM) and drained, and dc1 back and the whole cluster
healthy again.
When the guide changes, this test changes with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import docker
import pytest
from docker.models.containers import Container
from docker.models.networks import Network

from tests.support.chart import ROOT, example_values, merged, render
from tests.support.docker_pods import Pod, run_pod, wait_ready
from txsync.client import Client, State, Tls, TxSyncError

pytestmark = pytest.mark.docker

DCS = ("dc1", "dc2", "dc3")
NAMESPACE = "txsync"
"""The guide's namespace in every DC's cluster."""
WORKERS = 1
"""Worker pods per DC at the start (the example says 2: one keeps 3 DCs light)."""
SETTLE_S = 300.0
"""For the cluster to come up and agree: generous, for a loaded 2-core machine."""

FORWARDER = """
import asyncio, sys
target = sys.argv[1]
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()
async def forward(reader, writer, port):
    try:
        target_reader, target_writer = await asyncio.open_connection(target, port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, target_writer), pipe(target_reader, writer))
async def main():
    servers = [
        await asyncio.start_server(lambda r, w, p=port: forward(r, w, p), "0.0.0.0", port)
        for port in map(int, sys.argv[2:])
    ]
    await asyncio.gather(*(server.serve_forever() for server in servers))
asyncio.run(main())
"""
"""A LoadBalancer Service: each port forwarded to the same port of the master pod."""


@dataclass
class DcCluster:
    """One DC's "Kubernetes cluster"."""

    dc: str
    network: Network
    objects: dict[str, list[dict[str, Any]]]
    """What the chart renders, by image: the previous release's and this checkout's
    (``helm upgrade --set image.tag=...``)."""
    public_name: str
    image: str
    """The image the DC runs now."""
    balancer: Container | None = None
    pods: list[Pod] = field(default_factory=list)

    @property
    def network_name(self) -> str:
        return str(self.network.name)

    @property
    def release(self) -> str:
        return f"txsync-{self.dc}"

    def spec(self, name: str) -> dict[str, Any]:
        found = next(
            o
            for o in self.objects[self.image]
            if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name
        )
        spec: dict[str, Any] = found["spec"]["template"]["spec"]
        return spec

    def service_host(self, statefulset: str, ordinal: int) -> str:
        """The pod's stable in-cluster name (its StatefulSet's headless Service)."""
        return f"{statefulset}-{ordinal}.{statefulset}.{NAMESPACE}.svc.cluster.local"

    def balancer_address(self, port: int) -> str:
        assert self.balancer is not None
        self.balancer.reload()
        published = self.balancer.attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]
        return f"127.0.0.1:{published['HostPort']}"


def _load_balanced_ports(dc: DcCluster) -> list[int]:
    """The ports the chart's LoadBalancer Services expose, each checked to reach the same
    container port of the master pod (the forwarder maps port to port)."""
    master = dc.spec(f"{dc.release}-master")
    named = {p["name"]: p["containerPort"] for c in master["containers"] for p in c["ports"]}
    ports = []
    for service in (o for o in dc.objects[dc.image] if o["kind"] == "Service"):
        if service["spec"].get("type") != "LoadBalancer":
            continue
        for port in service["spec"]["ports"]:
            assert named[port["targetPort"]] == port["port"], port
            ports.append(port["port"])
    assert sorted(ports) == [7001, 7002], ports
    return ports


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[tuple[Path, list[DcCluster], Network]]:
    client = docker.from_env()
    suffix = uuid.uuid4().hex[:8]
    internet = client.networks.create(f"txsync-guide-internet-{suffix}", driver="bridge")
    clusters: list[DcCluster] = []
    try:
        yield tmp_path, clusters, internet
    finally:
        for cluster in clusters:
            for pod in cluster.pods:
                pod.remove()
            if cluster.balancer is not None:
                cluster.balancer.remove(force=True)
            cluster.network.remove()
        internet.remove()


def _tls_secret(certs: Path, dc: str, into: Path) -> Path:
    """The guide's `kubectl create secret generic txsync-tls` for one DC."""
    into.mkdir(parents=True)
    shutil.copy(certs / "ca.pem", into / "ca.crt")
    shutil.copy(certs / f"{dc}.pem", into / "tls.crt")
    shutil.copy(certs / f"{dc}.key", into / "tls.key")
    return into


def _txsync(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", *args],
        check=False, capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip


class NotYet(Exception):
    """A check's answer that its condition does not hold yet, saying why: the last one is
    shown if the wait runs out."""


def _wait_for(what: str, check: Any, logs: Any, timeout_s: float = SETTLE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except NotYet as not_yet:
            last = str(not_yet)
        else:
            if last:
                return last
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last {last!r}\n{logs()}")


def test_the_one_cluster_per_dc_guide_works_as_written(
    image: str, previous_image: str, workspace: tuple[Path, list[DcCluster], Network]
) -> None:
    tmp_path, clusters, internet = workspace
    client = docker.from_env()
    # Step 2: certificates naming each DC, signed by one CA.
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), "--out", str(tmp_path / "certs"),
         *DCS],
        check=True, capture_output=True,
    )  # fmt: skip
    # Step 3: one access secret for every DC, then one release per DC.
    made = _txsync("access", "secret", env={})
    assert made.returncode == 0, made.stderr
    access = json.loads(made.stdout)
    tokens: dict[str, str] = access["stringData"]
    (tmp_path / "access").mkdir()
    (tmp_path / "access" / "access.toml").write_text(tokens["access.toml"])
    secrets = {access["metadata"]["name"]: tokens}
    for dc in DCS:
        objects = {}
        for tag in (previous_image, image):
            repository, _, version = tag.partition(":")
            values = merged(
                example_values("one-cluster-per-dc", f"{dc}.yaml"),
                # No Jaeger runs here (the guide's step 5): no traces to send.
                {
                    "image": {"repository": repository, "tag": version},
                    "workers": {"replicas": WORKERS},
                    "otel": {"endpoint": ""},
                },
            )
            assert values["access"]["secretName"] == access["metadata"]["name"]
            objects[tag] = render(values, f"txsync-{dc}", NAMESPACE)
        public = next(d["storeUrl"] for d in values["dcs"] if d["id"] == dc).rsplit(":", 1)[0]
        network = client.networks.create(f"txsync-guide-{dc}-{uuid.uuid4().hex[:8]}")
        # Installed with the previous release, upgraded DC by DC below.
        clusters.append(DcCluster(dc, network, objects, public, previous_image))
    public_names = {cluster.public_name for cluster in clusters}

    # The LoadBalancers first: the other DCs find this one by its public name through them.
    for cluster in clusters:
        ports = _load_balanced_ports(cluster)
        master_host = cluster.service_host(f"{cluster.release}-master", 0)
        cluster.balancer = client.containers.run(
            image, entrypoint=["python", "-c", FORWARDER, master_host, *map(str, ports)],
            name=f"{cluster.network_name}-lb", network=cluster.network_name,
            ports=cast(Any, {f"{port}/tcp": ("127.0.0.1", None) for port in ports}),
            detach=True,
        )  # fmt: skip
        internet.connect(cluster.balancer, aliases=[cluster.public_name])

    def logs() -> str:
        """Every container's log in the test's directory; the coordinators' ends here."""
        (tmp_path / "logs").mkdir(exist_ok=True)
        ends = []
        for container in (
            c for cluster in clusters for pod in cluster.pods for c in pod.containers
        ):
            name, text = str(container.name), container.logs().decode(errors="replace")
            (tmp_path / "logs" / f"{name}.log").write_text(text)
            if name.endswith("sync-coordinator"):
                ends.append(f"--- {name}:\n" + "\n".join(text.splitlines()[-15:]))
        return f"(logs in {tmp_path / 'logs'})\n" + "\n".join(ends)

    # The master pods, then the workers: each reaches the internet (its egress) where the
    # other DCs' public names lead to their load balancers.
    for cluster in clusters:
        _tls_secret(tmp_path / "certs", cluster.dc, tmp_path / cluster.dc / "tls")
        _start_master(cluster, tmp_path, secrets, internet)
    for cluster in clusters:
        wait_ready(cluster.pods[0], cluster.spec(f"{cluster.release}-master"), timeout_s=SETTLE_S)
        for ordinal in range(WORKERS):
            _start_worker(cluster, ordinal, tmp_path, secrets)
    assert public_names == {f"{dc}.txsync.example.net" for dc in DCS}

    # Step 6: the admin API from outside, TLS checked against each DC's name.
    outside = {
        "TXSYNC_TLS_CA": str(tmp_path / "certs" / "ca.pem"),
        "TXSYNC_TLS_SERVER_NAME": "{dc}",
        "TXSYNC_TOKEN": tokens["admin-token"],
    }
    endpoints = ",".join(f"{c.dc}={c.balancer_address(7001)}" for c in clusters)
    first = f"dc1={clusters[0].balancer_address(7001)}"

    def healthy() -> str:
        status = _txsync("status", "--endpoints", first, env=outside)
        if status.returncode != 0:
            raise NotYet(
                f"exit {status.returncode}: {status.stdout[-1500:]}{status.stderr[-1500:]}"
            )
        return status.stdout

    def insert(cluster: DcCluster, value: str) -> None:
        """``txsync submit`` at the DC, waiting for OK there."""
        submitted = _txsync(
            "submit", "--endpoints", f"{cluster.dc}={cluster.balancer_address(7001)}",
            "--sql", f"INSERT INTO t (dc) VALUES ('{value}')", "--wait", "ok", env=outside,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr + logs()

    printed = _wait_for("txsync status through dc1 healthy", healthy, logs)
    for dc in DCS:
        assert dc in printed, printed

    # The upgrade (docs/operations.md, "Upgrades"): one DC at a time, its pods replaced
    # by this checkout's image on the same volumes, the cluster healthy before the next;
    # meanwhile the DCs run different releases, and each upgraded DC takes a submit.
    table = _txsync(
        "submit", "--endpoints", first, "--sql", "CREATE TABLE t (dc TEXT PRIMARY KEY)",
        "--wait", "ok", env=outside,
    )  # fmt: skip
    assert table.returncode == 0, table.stdout + table.stderr + logs()
    for cluster in clusters:
        for pod in cluster.pods:
            pod.remove()
        cluster.pods.clear()
        cluster.image = image
        _start_master(cluster, tmp_path, secrets, internet)
        wait_ready(cluster.pods[0], cluster.spec(f"{cluster.release}-master"), timeout_s=SETTLE_S)
        for ordinal in range(WORKERS):
            _start_worker(cluster, ordinal, tmp_path, secrets)
        _wait_for(f"the cluster healthy with {cluster.dc} upgraded", healthy, logs)
        insert(cluster, f"{cluster.dc} upgraded")

    # A submit at each DC, applied at every DC.
    for cluster in clusters:
        insert(cluster, cluster.dc)
    tls = Tls(ca=(tmp_path / "certs" / "ca.pem").read_bytes(), server_name="{dc}")
    for cluster in clusters:
        at = f"{cluster.dc}={cluster.balancer_address(7001)}"
        with Client(at, tls=tls, token=tokens["admin-token"]) as reader:
            _wait_for(
                f"every DC's row at {cluster.dc}",
                lambda reader=reader: (
                    [r[0] for r in reader.query("SELECT dc FROM t ORDER BY dc").rows]
                    == sorted([*DCS, *(f"{dc} upgraded" for dc in DCS)])
                ),
                logs,
            )

    # dc1 goes down (its master pod's containers stop): a client that named every DC
    # fails over, checking dc2's certificate for dc2, once dc2 and dc3 excluded dc1.
    # (Stopping dc1's load balancer alone, so that dc1 still reached the others but they
    # no longer reached it, stopped the cluster: see docs/operations.md, "One-way
    # reachability".)
    dc1_master = clusters[0].pods[0]
    for container in dc1_master.containers:
        container.stop(timeout=10)
    with Client(endpoints, tls=tls, token=tokens["admin-token"]) as app:
        try:
            result = app.submit(
                "INSERT INTO t (dc) VALUES ('failed over')", wait="ok", timeout=SETTLE_S
            )
        except TxSyncError as error:
            raise AssertionError(f"{error}\n{logs()}") from None
        assert result.dc != "dc1" and result.state is State.OK, result
    for container in dc1_master.containers:
        container.start()

    # `kubectl scale` stood in for: a second worker pod in dc2 registers and catches up.
    dc2 = clusters[1]
    _start_worker(dc2, WORKERS, tmp_path, secrets)
    added = f"{dc2.release}-workers-{WORKERS}"

    def caught_up() -> bool:
        listed = _txsync("workers", "--endpoints", endpoints, "--dc", "dc2", env=outside)
        return listed.returncode == 0 and added in listed.stdout  # 0: all healthy, in sync

    _wait_for(f"{added} registered and healthy", caught_up, logs)
    # Scaled back down: Kubernetes stops the deleted pod with SIGTERM, and the worker
    # drains itself from the dispatch (DrainWorker); dc2 stays healthy without it.
    worker = dc2.pods.pop()
    for container in worker.containers:
        container.stop(timeout=30)
    worker.remove()

    def drained() -> bool:
        listed = _txsync("workers", "--endpoints", endpoints, "--dc", "dc2", env=outside)
        return listed.returncode == 0 and added not in listed.stdout

    _wait_for(f"{added} drained and dc2's workers healthy", drained, logs)
    # dc1 is back in the view and caught up: the whole cluster healthy again.
    _wait_for("txsync status through dc1 healthy at the end", healthy, logs)


def _start_master(
    cluster: DcCluster, tmp_path: Path, secrets: dict[str, dict[str, str]], internet: Network
) -> None:
    """The master pod on the DC's image, on its volume (kept across an upgrade), reaching
    the internet too (its egress)."""
    data = tmp_path / cluster.dc / "master-data"
    data.mkdir(parents=True, exist_ok=True)
    master = run_pod(
        cluster.spec(f"{cluster.release}-master"), f"{cluster.release}-master-0",
        namespace=NAMESPACE, network=cluster.network_name,
        volumes={"data": data, "tls": tmp_path / cluster.dc / "tls",
                 "access": tmp_path / "access"},
        secrets=secrets, dns_names=(cluster.service_host(f"{cluster.release}-master", 0),),
    )  # fmt: skip
    cluster.pods.append(master)
    assert master.pause is not None
    internet.connect(master.pause)


def _start_worker(
    cluster: DcCluster, ordinal: int, tmp_path: Path, secrets: dict[str, dict[str, str]]
) -> None:
    statefulset = f"{cluster.release}-workers"
    spec = cluster.spec(statefulset)
    data = tmp_path / cluster.dc / f"worker-{ordinal}"
    data.mkdir(parents=True, exist_ok=True)
    worker = run_pod(
        spec, f"{statefulset}-{ordinal}", namespace=NAMESPACE, network=cluster.network_name,
        volumes={"data": data, "access": tmp_path / "access"}, secrets=secrets,
        dns_names=(cluster.service_host(statefulset, ordinal),),
    )  # fmt: skip
    cluster.pods.append(worker)
    wait_ready(worker, spec, timeout_s=SETTLE_S)
