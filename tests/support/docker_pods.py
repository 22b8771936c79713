"""Running a rendered Kubernetes pod spec under Docker, as the kubelet would (in part).

No Kubernetes can run here, so the chart's pod templates are started as Docker
containers instead: the same image, args (with ``$(VAR)`` expanded from the container's
env, as Kubernetes does), env (``fieldRef`` filled in), ports, user, read-only root and
dropped capabilities; the containers of one pod share a network namespace through a
first "pause" container, as in a pod. Volumes become host directories (PVCs, secrets)
or tmpfs (emptyDir). Then the test asks each container's gRPC readiness port for health.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import docker
import grpc
from docker.models.containers import Container
from grpc_health.v1 import health_pb2

from txsync.rpc import health_status

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "txsync:dev"
_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def ensure_image() -> None:
    """Docker running and the image built from this tree (offline, scripts/build_image.sh)."""
    subprocess.run([str(ROOT / "scripts" / "build_image.sh"), IMAGE], check=True, cwd=ROOT)


@dataclass
class Pod:
    name: str
    containers: list[Container] = field(default_factory=list)
    pause: Container | None = None

    def address(self, port: int) -> str:
        """Where the pod's ``port`` is published on this host."""
        assert self.pause is not None
        self.pause.reload()
        published = self.pause.attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]
        return f"127.0.0.1:{published['HostPort']}"

    def ip(self, network: str) -> str:
        assert self.pause is not None
        self.pause.reload()
        return str(self.pause.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])

    def logs(self) -> str:
        return "\n".join(
            f"--- {c.name}:\n{c.logs().decode(errors='replace')[-3000:]}" for c in self.containers
        )

    def remove(self) -> None:
        for container in [*self.containers, *([self.pause] if self.pause else [])]:
            container.remove(force=True)


def _expand(text: str, env: dict[str, str]) -> str:
    """``$(NAME)`` replaced by the variable's value, as Kubernetes does in args and env."""

    def value(match: re.Match[str]) -> str:
        return env.get(match[1], match[0])

    return _VARIABLE.sub(value, text)


def pod_env(
    container: dict[str, Any],
    pod_name: str,
    namespace: str,
    secrets: dict[str, dict[str, str]] | None = None,
) -> dict[str, str]:
    """The container's environment as Kubernetes fills it: values, ``fieldRef`` and
    ``secretKeyRef`` (from ``secrets``: name -> key -> value; an optional key may lack)."""
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = _expand(entry["value"], env)
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            value = (secrets or {}).get(ref["name"], {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise KeyError(f"secret {ref['name']} has no key {ref['key']}")
            if value is not None:
                env[entry["name"]] = value
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def run_pod(
    spec: dict[str, Any],
    pod_name: str,
    *,
    namespace: str,
    network: str,
    volumes: dict[str, Path],
    extra_hosts: dict[str, str] | None = None,
    secrets: dict[str, dict[str, str]] | None = None,
    dns_names: tuple[str, ...] = (),
) -> Pod:
    """Start the pod ``spec`` (a pod template's spec). ``volumes`` maps each non-emptyDir
    volume name to a host directory; ``secrets`` gives the secrets env refers to;
    ``dns_names`` are names the other containers of ``network`` find the pod by (what
    a Service and the cluster's DNS give a pod)."""
    client = docker.from_env()
    security = spec.get("securityContext", {})
    user = f"{security.get('runAsUser', 0)}:{security.get('runAsGroup', 0)}"
    for path in volumes.values():  # as fsGroup would: the pod's group owns its volumes
        shutil.chown(path, security.get("runAsUser", 0), security.get("fsGroup", 0))
        for child in path.rglob("*"):
            shutil.chown(child, security.get("runAsUser", 0), security.get("fsGroup", 0))
    ports = [p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])]
    pod = Pod(pod_name)
    pod.pause = client.containers.run(
        spec["containers"][0]["image"],
        entrypoint=["sleep", "infinity"],
        name=f"{namespace}-{pod_name}-pause",
        hostname=pod_name,
        network=network,
        networking_config={network: client.api.create_endpoint_config(aliases=list(dns_names))},
        # Published on loopback only, each on a free host port (the stubs lack None).
        ports=cast(Any, {f"{port}/tcp": ("127.0.0.1", None) for port in ports}),
        extra_hosts=extra_hosts or {},
        detach=True,
    )
    emptied = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    for container in spec["containers"]:
        env = pod_env(container, pod_name, namespace, secrets)
        args = [_expand(arg, env) for arg in container["args"]]
        context = container.get("securityContext", {})
        mounts: dict[str, dict[str, str]] = {}
        tmpfs: dict[str, str] = {}
        for mount in container.get("volumeMounts", []):
            if mount["name"] in emptied:
                tmpfs[mount["mountPath"]] = f"uid={security.get('runAsUser', 0)}"
            else:
                mode = "ro" if mount.get("readOnly") else "rw"
                mounts[str(volumes[mount["name"]])] = {"bind": mount["mountPath"], "mode": mode}
        pod.containers.append(
            client.containers.run(
                container["image"],
                command=args,
                name=f"{namespace}-{pod_name}-{container['name']}",
                environment=env,
                user=user,
                read_only=bool(context.get("readOnlyRootFilesystem")),
                cap_drop=context.get("capabilities", {}).get("drop", []),
                security_opt=["no-new-privileges"]
                if context.get("allowPrivilegeEscalation") is False
                else [],
                network_mode=f"container:{pod.pause.id}",
                volumes=mounts,
                tmpfs=tmpfs,
                detach=True,
            )
        )
    return pod


def _probe_passes(probe: dict[str, Any], address: str, channel: grpc.Channel) -> bool:
    """A gRPC probe: the health service says SERVING; a TCP one: the port takes a
    connection (what the kubelet checks for each)."""
    if "tcpSocket" in probe:
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return True
        except OSError:
            return False
    try:
        return health_status(channel) == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def wait_ready(pod: Pod, spec: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Each container's readiness probe (gRPC or TCP), asked through the published port."""
    for container, running in zip(spec["containers"], pod.containers, strict=True):
        probe = container["readinessProbe"]
        port = (probe.get("grpc") or probe["tcpSocket"])["port"]
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(pod.address(port)) as channel:
            while True:
                if _probe_passes(probe, pod.address(port), channel):
                    break
                running.reload()
                if running.status == "exited" or time.monotonic() > deadline:
                    raise AssertionError(
                        f"{container['name']} not ready on {port} ({running.status}):\n"
                        + pod.logs()
                    )
                time.sleep(0.2)
