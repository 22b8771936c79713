"""A STAND-IN for the Kubernetes API server, for tests only.

No API server can run on these machines, so worker-dispatch's StatefulSet watch and
`txsync workers scale` are tested against this small HTTP server. It speaks just the
endpoints they use, in the API's JSON shapes: read a StatefulSet, read and patch its
scale, list pods by label selector, and watch pods (newline-delimited JSON events on a
response kept open). It is not Kubernetes: there is no scheduler, no controller and no
admission; the tests create, ready and delete the pods themselves, as the StatefulSet
controller and the kubelet would.
"""

from __future__ import annotations

import json
import queue
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support.processes import free_port


class KubeApiStandIn:
    def __init__(self, namespace: str, statefulset: str, labels: dict[str, str]) -> None:
        self.namespace = namespace
        self.statefulset = statefulset
        self.labels = labels
        self.replicas = 0
        self.pods: dict[str, dict[str, Any]] = {}
        self._version = 1
        self._lock = threading.Lock()
        self._watchers: list[queue.Queue[dict[str, Any] | None]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> KubeApiStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            for watcher in self._watchers:
                watcher.put(None)
        self._server.shutdown()
        self._server.server_close()

    # --- what the StatefulSet controller and the kubelet would do -------------------

    def add_pod(self, name: str, ip: str, *, ready: bool) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": self.labels},
            "spec": {"containers": [{"name": "worker", "image": "txsync:dev"}]},
            "status": {"podIP": ip, "conditions": []},
        }
        self._change("ADDED", name, pod)
        if ready:
            self.set_ready(name)

    def set_ready(self, name: str) -> None:
        pod = json.loads(json.dumps(self.pods[name]))
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        self._change("MODIFIED", name, pod)

    def delete_pod(self, name: str) -> None:
        """Graceful deletion: the pod is marked terminating first, then goes."""
        pod = json.loads(json.dumps(self.pods[name]))
        pod["metadata"]["deletionTimestamp"] = datetime.now(UTC).isoformat()
        self._change("MODIFIED", name, pod)
        self._change("DELETED", name, None)

    def _change(self, kind: str, name: str, pod: dict[str, Any] | None) -> None:
        with self._lock:
            self._version += 1
            if pod is None:
                pod = self.pods.pop(name)
            else:
                self.pods[name] = pod
            pod["metadata"]["resourceVersion"] = str(self._version)
            for watcher in self._watchers:
                watcher.put({"type": kind, "object": pod})

    # --- the API ----------------------------------------------------------------------

    def _statefulset(self) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": self.statefulset, "namespace": self.namespace},
            "spec": {
                "replicas": self.replicas,
                "serviceName": self.statefulset,
                "selector": {"matchLabels": self.labels},
                "template": {
                    "metadata": {"labels": self.labels},
                    "spec": {"containers": [{"name": "worker", "image": "txsync:dev"}]},
                },
            },
        }

    def _scale(self) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": self.statefulset, "namespace": self.namespace},
            "spec": {"replicas": self.replicas},
            "status": {"replicas": self.replicas},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self
        base = f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets/{self.statefulset}"
        pods = f"/api/v1/namespaces/{self.namespace}/pods"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # a watch's events go out as chunks

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, body: dict[str, Any], status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                if url.path == base:
                    self._json(api._statefulset())
                elif url.path == base + "/scale":
                    self._json(api._scale())
                elif url.path == pods and query.get("watch") == ["true"]:
                    self._watch(float(query.get("timeoutSeconds", ["60"])[0]))
                elif url.path == pods:
                    with api._lock:
                        items = list(api.pods.values())
                        version = str(api._version)
                    listed = {"metadata": {"resourceVersion": version}, "items": items}
                    self._json({"apiVersion": "v1", "kind": "PodList", **listed})
                else:
                    self._json({"kind": "Status", "code": 404, "message": url.path}, 404)

            def _watch(self, timeout_s: float) -> None:
                events: queue.Queue[dict[str, Any] | None] = queue.Queue()
                with api._lock:
                    api._watchers.append(events)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while True:
                        try:
                            event = events.get(timeout=timeout_s)
                        except queue.Empty:
                            event = None
                        if event is None:
                            self.wfile.write(b"0\r\n\r\n")
                            return
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                finally:
                    with api._lock:
                        api._watchers.remove(events)

            def do_PATCH(self) -> None:
                if urlparse(self.path).path != base + "/scale":
                    self._json({"kind": "Status", "code": 404}, 404)
                    return
                patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if isinstance(patch, list):  # JSON patch
                    for op in patch:
                        if op.get("path") == "/spec/replicas":
                            api.replicas = int(op["value"])
                else:  # merge patch
                    api.replicas = int(patch["spec"]["replicas"])
                self._json(api._scale())

        return Handler
