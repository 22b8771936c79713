"""What every TxSync process reports about itself: traces, metrics and logs.

* ``tracing``: OpenTelemetry traces over OTLP gRPC, configured by the standard ``OTEL_*``
  variables; the DC and the service are in the resource. One trace per transaction (its
  W3C ``traceparent`` is stored with it) and one span per protocol round.
* ``metrics``: OpenTelemetry metrics with a Prometheus scrape endpoint.
* ``logs``: log lines (text or JSON) that carry the current trace and span ids.

``ServiceTelemetry.start`` sets all three up the same way in every service process.
"""

from txsync.telemetry.histograms import SECONDS_BUCKETS, PlainHistogram
from txsync.telemetry.logs import LOG_FORMATS, configure_logging
from txsync.telemetry.metrics import Gauge, Metrics
from txsync.telemetry.process import ServiceTelemetry, add_telemetry_arguments
from txsync.telemetry.tracing import (
    attached,
    context_of,
    current_traceparent,
    span_context_of,
    start_tracing,
    tracer,
)

__all__ = [
    "LOG_FORMATS",
    "SECONDS_BUCKETS",
    "Gauge",
    "Metrics",
    "PlainHistogram",
    "ServiceTelemetry",
    "add_telemetry_arguments",
    "attached",
    "configure_logging",
    "context_of",
    "current_traceparent",
    "span_context_of",
    "start_tracing",
    "tracer",
]
