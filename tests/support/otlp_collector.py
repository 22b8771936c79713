"""A test OTLP trace receiver: a real gRPC server speaking the OTLP protobuf definitions
(``opentelemetry-proto``), keeping every span it is sent, for tests to inspect.

It stands in for Jaeger's OTLP port (4317): services export to it exactly as they would
to Jaeger, through the standard OTEL_EXPORTER_OTLP_ENDPOINT variable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.support.processes import free_port
from txsync.telemetry.trace_file import attributes_of


@dataclass(frozen=True)
class ReceivedSpan:
    resource: dict[str, Any]
    span: trace_pb2.Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes_of(self.span.attributes)

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))

    @property
    def dc(self) -> str:
        return str(self.resource.get("txsync.dc", ""))


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpCollector) -> None:
        self._sink = sink

    def Export(  # noqa: N802 - the OTLP service's name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = [
            ReceivedSpan(attributes_of(resource_spans.resource.attributes), span)
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        self._sink.add(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpCollector:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")

    def __enter__(self) -> OtlpCollector:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=1).wait()

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(
        self, where: Callable[[ReceivedSpan], bool] = lambda span: True
    ) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self._spans if where(span)]

    def wait_for(self, what: str, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.dc, s.name) for s in self.spans()})
                raise AssertionError(f"not within {timeout_s} s: {what}; spans seen: {names}")
            time.sleep(0.2)
