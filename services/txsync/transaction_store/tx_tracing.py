"""A transaction's path through this DC, as spans of the transaction's own trace.

Each durable state change becomes one span named after the state reached
(``txsync.tx ACCEPTED``, ...) from the previous transition to this one, a child of the
transaction's stored ``traceparent``. The origin's submit call is the trace's first span;
every DC adds its ACCEPTED, ENQUEUED, TESTING and OK (or FAILED) spans, and the workers
their apply spans, so Jaeger shows one waterfall from submit to OK on every worker.
Nothing is emitted at replay (only for changes made durable now), nor for transactions
that came without a trace context.
"""

from __future__ import annotations

from collections.abc import Iterable

from txsync.protocol import TxState
from txsync.telemetry import context_of, tracer
from txsync.transaction_store.state import StoreState
from txsync.v1 import txlog_pb2


def trace_transitions(state: StoreState, entries: Iterable[txlog_pb2.LogEntry]) -> None:
    for entry in entries:
        if entry.WhichOneof("entry") != "state":
            continue
        record = state.txs.get(entry.state.tx_id)
        if record is None or len(record.history) < 2:
            continue
        context = context_of(record.traceparent)
        if context is None:
            continue
        reached = TxState(entry.state.state)
        steps = [i for i, step in enumerate(record.history) if step.state is reached]
        if not steps or steps[-1] == 0:
            continue
        before, step = record.history[steps[-1] - 1], record.history[steps[-1]]
        attributes: dict[str, str | int] = {
            "txsync.dc": state.node_id,
            "txsync.tx_id": record.tx_id,
            "txsync.service": step.service,
        }
        if record.position:
            attributes["txsync.position"] = record.position
        if record.outcome is not None and record.outcome.error:
            attributes["txsync.error"] = record.outcome.error
        span = tracer().start_span(
            f"txsync.tx {reached.name}",
            context=context,
            start_time=before.at_unix_ms * 1_000_000,
            attributes=attributes,
        )
        span.end(end_time=step.at_unix_ms * 1_000_000)
