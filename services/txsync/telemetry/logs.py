"""Log lines that carry the trace: text for people, JSON lines for log pipelines.

Both formats add the current trace and span ids when a span is recording, so a log line
written while a transaction or a round is traced can be found from Jaeger and back.

A notable event (a view installed, a worker out, a rotation, ...) is one line with a
stable key, ``event=worker.out_of_sync``, and its subjects as fields (``worker``,
``peer``, ``position``): log pipelines and alerts match the key, never the wording, which
may change. ``EVENTS`` lists them all; ``docs/operations.md`` ("Logs") documents each.
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


EVENTS = {
    "view.installed": "a new view: its number and members, and who it excludes",
    "quorum.changed": "this DC gained or lost a weight majority (or a view change began)",
    "membership.added": "a node joined the configuration (peer, address)",
    "membership.removed": "a node left the configuration (peer)",
    "sync.paused": "an operator paused this DC's part in the protocol",
    "sync.resumed": "an operator resumed it",
    "divergence": "another DC's outcome differs from this DC's at a position (peer)",
    "worker.healthy": "a worker is back in the feed (worker, position)",
    "worker.dead": "a worker missed its heartbeats and is out (worker)",
    "worker.stuck": "a worker finished nothing for too long with work in flight (worker)",
    "worker.out_of_sync": "a worker's state digest differs from the testing worker's",
    "worker.needs_snapshot": "a worker is too far behind to catch up from the txlog",
    "worker.testing": "a new testing worker was chosen (worker)",
    "txlog.rotated": "the store started a new log file from a snapshot (truncated, kept)",
    "txlog.rotation_abandoned": "a rotation was given up (shutdown, or failed)",
    "txlog.torn_tail": "the store cut a torn tail off its log at start-up",
    "access.refused": "a call was refused by access control (method, reason)",
}
"""Every notable event's stable key and what it means."""


def event(key: str, **fields: object) -> dict[str, object]:
    """``extra=`` for a notable event's log line: its key and its subjects."""
    if key not in EVENTS:
        raise ValueError(f"unknown log event {key!r}: add it to EVENTS and the docs")
    return {"event": key, **fields}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}


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
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
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
        for name, value in _extras(record).items():
            if name not in entry:
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
