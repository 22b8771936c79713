"""Kubernetes awareness: worker-dispatch follows its DC's worker StatefulSet.

In a cluster (``--kubernetes-workers STATEFULSET``) dispatch reads the StatefulSet's pod
selector once, then lists and watches its pods through the API server:

* a pod being deleted (``kubectl scale`` down, a node drain) is drained at once, instead
  of being fed until its heartbeats stop;
* a new pod is expected as soon as it is created, and registered (at ``podIP:PORT``) the
  moment it is Ready, then brought up to date like any joining worker (from a snapshot
  when far behind);
* a pod whose IP changed (rescheduled) is registered again at the new address.

Workers also register themselves over gRPC (``--dispatch``), so nothing depends on this
watch: it makes scaling prompt. Outside a cluster it is off. The watch runs in a thread
of its own (the client is synchronous) and hands events to the event loop; it re-lists
after any error or when the API server ends the watch.

``scale_workers`` patches the StatefulSet's scale subresource: ``txsync workers scale``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

log = logging.getLogger("txsync.worker_dispatch.kubernetes")

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_TIMEOUT_S = 60
"""The API server ends each watch after this long; the thread then re-lists."""
RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class PodEvent:
    name: str
    address: str | None
    """``podIP:PORT`` when the pod is Ready and not terminating, else None."""
    gone: bool
    """Deleted, or being deleted."""


def api_client(api_url: str | None) -> client.ApiClient:
    """The in-cluster client, or one for ``api_url`` (tests and out-of-cluster use)."""
    if api_url is None:
        config.load_incluster_config()
        return client.ApiClient()
    configuration = client.Configuration()
    configuration.host = api_url
    return client.ApiClient(configuration)


def current_namespace(given: str | None) -> str:
    if given:
        return given
    try:
        return NAMESPACE_FILE.read_text().strip()
    except OSError:
        return "default"


def pod_event(kind: str, pod: Any, port: int) -> PodEvent:
    name = pod.metadata.name
    gone = kind == "DELETED" or pod.metadata.deletion_timestamp is not None
    ready = any(
        condition.type == "Ready" and condition.status == "True"
        for condition in (pod.status.conditions or [])
    )
    address = f"{pod.status.pod_ip}:{port}" if ready and pod.status.pod_ip and not gone else None
    return PodEvent(name, address, gone)


class WorkerPodWatch:
    def __init__(self, api: client.ApiClient, namespace: str, statefulset: str, port: int) -> None:
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._namespace = namespace
        self._statefulset = statefulset
        self._port = port
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.events: asyncio.Queue[PodEvent] = asyncio.Queue(maxsize=1024)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._follow, name="k8s-workers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _put(self, event: PodEvent) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.events.put_nowait, event)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                statefulset = self._apps.read_namespaced_stateful_set(
                    self._statefulset, self._namespace
                )
                labels = statefulset.spec.selector.match_labels or {}
                selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
                listed = self._core.list_namespaced_pod(self._namespace, label_selector=selector)
                for pod in listed.items:
                    self._put(pod_event("ADDED", pod, self._port))
                self._watch = watch.Watch()
                for change in self._watch.stream(
                    self._core.list_namespaced_pod,
                    self._namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version if listed.metadata else None,
                    timeout_seconds=WATCH_TIMEOUT_S,
                ):
                    if self._stop.is_set():
                        return
                    self._put(pod_event(change["type"], change["object"], self._port))
            except Exception as error:  # any API or network failure: list again
                if self._stop.is_set():
                    return
                log.warning("watching %s's pods: %s; retrying", self._statefulset, error)
                self._stop.wait(RETRY_S)


async def follow_worker_pods(dispatch: Any, pods: WorkerPodWatch) -> None:
    """Apply the pod events to ``dispatch`` (``register``/``drain``) as they come."""
    expected: set[str] = set()
    while True:
        event = await pods.events.get()
        log.debug("pod event %s", event)
        if event.gone:
            expected.discard(event.name)
            if await dispatch.drain(event.name):
                log.info("worker %s is leaving its StatefulSet: drained at once", event.name)
        elif event.address is not None:
            expected.discard(event.name)
            known = dispatch.workers.get(event.name)
            if known is None or known.address != event.address:
                await dispatch.register(event.name, event.address)
        elif event.name not in expected and event.name not in dispatch.workers:
            expected.add(event.name)
            log.info("worker %s was created: expecting it once it is ready", event.name)


def scale_workers(api: client.ApiClient, namespace: str, statefulset: str, replicas: int) -> int:
    """Set the worker StatefulSet's replicas; returns what it was before."""
    apps = client.AppsV1Api(api)
    spec = apps.read_namespaced_stateful_set_scale(statefulset, namespace).spec
    before = spec.replicas if spec is not None else 0
    apps.patch_namespaced_stateful_set_scale(
        statefulset, namespace, {"spec": {"replicas": replicas}}
    )
    return int(before or 0)
