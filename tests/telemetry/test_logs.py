"""Log lines carry the trace and span ids of the span they are written in."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from tests.support.processes import transaction_store
from txsync.telemetry.logs import EVENTS, JsonFormatter, TextFormatter, event


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


def test_json_lines_keep_the_fields_given_with_the_record() -> None:
    record = _record("peer cut off")
    record.__dict__.update(peer="dc3", tx_id="0e2c", lag=12, detail=("a", 1))
    line = json.loads(JsonFormatter("sync-coordinator", "dc1").format(record))
    assert (line["peer"], line["tx_id"], line["lag"]) == ("dc3", "0e2c", 12)
    assert line["detail"] == "('a', 1)" and line["dc"] == "dc1"
    assert "args" not in line and "levelno" not in line  # the record's own fields are not


def test_every_service_takes_a_log_level_from_its_flag_or_the_environment(
    tmp_path: Path,
) -> None:
    """Every service has --log-level; a real transaction-store at warning writes no INFO
    line (it writes several at info); a wrong level in the environment is refused."""
    for command in ("transaction-store", "sync-coordinator", "worker", "worker-dispatch"):
        shown = subprocess.run(
            [sys.executable, "-m", "txsync.cli.main", command, "--help"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert "--log-level" in shown.stdout, command
    quiet = transaction_store(tmp_path / "quiet", "dc1", "--log-level", "warning")
    quiet.start()
    quiet.terminate()
    assert " INFO " not in quiet.log(), quiet.log()
    wrong = subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "transaction-store", "--node-id", "dc1",
         "--data", str(tmp_path / "wrong")],
        capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "TXSYNC_LOG_LEVEL": "verbose"},
    )  # fmt: skip
    assert wrong.returncode != 0 and "TXSYNC_LOG_LEVEL='verbose'" in wrong.stderr, wrong.stderr


def test_a_notable_event_has_a_stable_key_documented_and_used() -> None:
    record = _record("worker w-1 missed heartbeats for 10 s: out")
    record.__dict__.update(event("worker.dead", worker="w-1"))
    line = json.loads(JsonFormatter("worker-dispatch", "dc1").format(record))
    assert (line["event"], line["worker"]) == ("worker.dead", "w-1")
    assert TextFormatter().format(record).endswith("out event=worker.dead worker=w-1")
    with pytest.raises(ValueError, match="unknown log event"):
        event("worker.gone")
    root = Path(__file__).resolve().parents[2]
    documented = (root / "docs" / "operations.md").read_text()
    services = root / "services" / "txsync"
    logging_code = "\n".join(
        path.read_text() for path in services.rglob("*.py") if path.name != "logs.py"
    )
    for key in EVENTS:
        assert f"| `{key}` |" in documented, f"{key} is not in docs/operations.md, Logs"
        assert f'"{key}"' in logging_code, f"no service logs {key}"
