"""Traces without Jaeger: ``txsync dev up --traces`` and ``txsync dev trace TX_ID``.

Where Jaeger is not installed (no image can be pulled, or no Docker), ``dev up
--traces`` runs this collector in its own process: an OTLP/gRPC trace receiver on
loopback (what Jaeger's port 4317 is) that its services export to through the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``, writing each span as a JSON line to
``<data>/traces.jsonl``. ``txsync dev trace TX_ID`` then prints that transaction's trace
as a waterfall: its submit, each DC's states, each worker's apply, with offsets and
durations, indented by parent.

The file stops growing at ``TRACE_FILE_BYTES_MAX`` (spans after that are counted and
dropped, and the collector says so once): a cluster left running with tracing on must
not fill the disk.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

log = logging.getLogger("txsync.traces")

TRACE_FILE_BYTES_MAX = 256 * 1024 * 1024
TRACE_FILE_NAME = "traces.jsonl"
EXPORT_BYTES_MAX = 16 * 1024 * 1024
"""One export call (the SDK's batches are 512 spans, a few hundred KB)."""


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def attributes_of(pairs: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    """OTLP key-values (a span's or a resource's attributes) as a plain dict."""
    return {pair.key: _value(pair.value) for pair in pairs}


def span_record(resource: dict[str, Any], span: trace_pb2.Span) -> dict[str, Any]:
    """A span as one JSON line holds it."""
    return {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_id": span.parent_span_id.hex(),
        "name": span.name,
        "service": resource.get("service.name", ""),
        "dc": resource.get("txsync.dc", ""),
        "start_ns": span.start_time_unix_nano,
        "end_ns": span.end_time_unix_nano,
        "error": span.status.code == trace_pb2.Status.STATUS_CODE_ERROR,
        "attributes": attributes_of(span.attributes),
        "links": [
            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in span.links
        ],
    }


class TraceFileCollector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver on loopback that appends every span to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self._bytes = path.stat().st_size
        self._lock = threading.Lock()
        self.dropped = 0
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="traces"),
            options=[("grpc.max_receive_message_length", EXPORT_BYTES_MAX)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

    def start(self) -> None:
        self._server.start()

    def close(self) -> None:
        self._server.stop(grace=2).wait()
        with self._lock:
            self._file.close()

    def Export(  # noqa: N802 - the OTLP service's method
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        lines = [
            json.dumps(span_record(attributes_of(spans.resource.attributes), span)) + "\n"
            for spans in request.resource_spans
            for scope in spans.scope_spans
            for span in scope.spans
        ]
        text = "".join(lines)
        with self._lock:
            if self._file.closed:
                return trace_service_pb2.ExportTraceServiceResponse()
            if self._bytes + len(text) > TRACE_FILE_BYTES_MAX:
                if not self.dropped:
                    log.warning("%s is full (%d bytes): spans from now on are dropped",
                                self.path, TRACE_FILE_BYTES_MAX)  # fmt: skip
                self.dropped += len(lines)
            else:
                self._file.write(text)
                self._file.flush()
                self._bytes += len(text)
        return trace_service_pb2.ExportTraceServiceResponse()


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.endswith("\n"):  # a line being written is not read half
                yield json.loads(line)


def transaction_trace(path: Path, tx_id: str) -> list[dict[str, Any]]:
    """Every span of the trace(s) that ``tx_id``'s spans belong to, by start."""
    records = list(_records(path))
    traces = {r["trace_id"] for r in records if r["attributes"].get("txsync.tx_id") == tx_id}
    return sorted((r for r in records if r["trace_id"] in traces), key=lambda r: r["start_ns"])


def waterfall(spans: list[dict[str, Any]]) -> list[str]:
    """One line per span: its start after the trace's first, its duration, and its name
    indented under its parent's (a parent not received: at the top)."""
    if not spans:
        return []
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span["parent_id"] if span["parent_id"] in ids else ""
        children.setdefault(parent, []).append(span)
    origin = min(s["start_ns"] for s in spans)
    lines: list[str] = []

    def show(span: dict[str, Any], depth: int) -> None:
        offset = (span["start_ns"] - origin) / 1e6
        took = (span["end_ns"] - span["start_ns"]) / 1e6
        where = " ".join(x for x in (span["service"], span["dc"]) if x)
        mark = "  ERROR" if span["error"] else ""
        lines.append(
            f"{offset:9.1f} ms {took:9.1f} ms  {'  ' * depth}{span['name']} [{where}]{mark}"
        )
        for child in children.get(span["span_id"], []):
            show(child, depth + 1)

    for root in children.get("", []):
        show(root, 0)
    return lines
