"""Log lines that carry the trace: text for people, JSON lines for log pipelines.

Both formats add the current trace and span ids when a span is recording, so a log line
written while a transaction or a round is traced can be found from Jaeger and back.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from opentelemetry import trace

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ENV = "TXSYNC_LOG_LEVEL"
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}  # fmt: skip
"""What every log record has: anything else was given with ``extra=`` (a transaction
id, a peer), and a JSON line keeps it as a field."""


def _trace_ids() -> tuple[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _trace_ids()
        return line if ids is None else f"{line} trace_id={ids[0]} span_id={ids[1]}"


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, node_id: str) -> None:
        super().__init__()
        self._static = {"service": service, "dc": node_id}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self._static,
        }
        for name, value in vars(record).items():
            if name not in _RECORD_FIELDS and name not in entry:
                entry[name] = value if isinstance(value, str | int | float | bool) else str(value)
        ids = _trace_ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(
    service: str, node_id: str, log_format: str = "text", level: str = "info"
) -> None:
    """Log to stderr in ``log_format`` from ``level`` up (``LOG_LEVELS``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(service, node_id) if log_format == "json" else TextFormatter()
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
