"""Traces over OTLP gRPC, configured the standard way.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set and
``OTEL_TRACES_EXPORTER`` is not ``none``; the exporter reads the endpoint, headers,
certificates and ``..._INSECURE`` itself, and the sampler comes from
``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default: parent-based, always on).
Without an endpoint nothing is exported and spans cost almost nothing.

Trace context travels as W3C ``traceparent`` strings: in gRPC metadata between services
(the gRPC instrumentation does this for every call), and as a field of the messages that
carry a transaction from DC to DC (``PushBodyRequest``, ``GetBodyResponse``): one post
carries many transactions, so metadata cannot. Each transaction's ``traceparent`` is
stored with it in the txlog, so a DC that orders or applies it hours later still joins
its trace.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("txsync.telemetry")

_PROPAGATOR = TraceContextTextMapPropagator()


def tracing_configured() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def start_tracing(service: str, node_id: str) -> TracerProvider | None:
    """Install the process's tracer provider if an OTLP endpoint is configured."""
    if not tracing_configured():
        return None
    # Imported here: the exporter pulls in its own gRPC and protobuf modules, which a
    # process that exports nothing need not load.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    resource = Resource.create(resource_attributes(service, node_id))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("exporting traces over OTLP to %s", _endpoint())
    return provider


def resource_attributes(service: str, node_id: str) -> dict[str, str]:
    attributes = {"service.name": service}
    if node_id:
        attributes["txsync.dc"] = node_id
    return attributes


def _endpoint() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )


def tracer() -> Tracer:
    return trace.get_tracer("txsync")


def context_of(traceparent: str) -> Context | None:
    """A context whose current span is the one ``traceparent`` names (None if invalid)."""
    if not traceparent:
        return None
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


@contextlib.contextmanager
def attached(context: Context | None) -> Iterator[None]:
    """``context`` is the current one inside (nothing changes if None): calls made there
    join its trace, or, with an empty ``Context()``, no trace at all."""
    token = None if context is None else otel_context.attach(context)
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)


def span_context_of(traceparent: str) -> SpanContext | None:
    """The span ``traceparent`` names, for a link (None if invalid)."""
    context = context_of(traceparent)
    return None if context is None else trace.get_current_span(context).get_span_context()


def current_traceparent(context: Context | None = None) -> str:
    """The W3C traceparent of the current (or ``context``'s) span; "" if none is valid
    (tracing off, or no span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier.get("traceparent", "")


def new_trace_linked_to(name: str, traceparent: str) -> str:
    """Start and end a root span ``name`` (a new trace) linked to ``traceparent``'s span;
    its traceparent ("" with tracing off). One call that brings many transactions (a
    batch of submits) gives each its own trace this way, the call one link away."""
    link = span_context_of(traceparent)
    span = tracer().start_span(
        name,
        context=Context(),
        links=[trace.Link(link)] if link is not None else [],
    )
    span.end()
    return current_traceparent(trace.set_span_in_context(span))
