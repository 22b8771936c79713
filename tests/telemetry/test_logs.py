"""Log lines carry the trace and span ids of the span they are written in."""

from __future__ import annotations

import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from txsync.telemetry.logs import JsonFormatter, TextFormatter


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("txsync.test", logging.WARNING, __file__, 1, message, None, None)


def test_json_lines_name_the_service_the_dc_and_the_current_trace() -> None:
    formatter = JsonFormatter("transaction-store", "dc2")
    outside = json.loads(formatter.format(_record("no span")))
    assert outside["dc"] == "dc2" and outside["service"] == "transaction-store"
    assert "trace_id" not in outside and outside["level"] == "WARNING"
    span = TracerProvider().get_tracer("test").start_span("work")
    with trace.use_span(span, end_on_exit=True):
        inside = json.loads(formatter.format(_record("in a span")))
        text = TextFormatter().format(_record("in a span"))
    context = span.get_span_context()
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert inside["message"] == "in a span"
    assert text.endswith(f"trace_id={inside['trace_id']} span_id={inside['span_id']}")
