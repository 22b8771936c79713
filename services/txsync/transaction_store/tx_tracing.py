"""A transaction's path through this DC, as spans of the transaction's own trace.

Each durable state change becomes one span named after the state reached
(``txsync.tx ACCEPTED``, ...) from the previous transition to this one, a child of the
transaction's stored ``traceparent``. The origin's submit call is the trace's first span;
every DC adds its ACCEPTED, ENQUEUED, TESTING and OK (or FAILED) spans, and the workers
their apply spans, so Jaeger shows one waterfall from submit to OK on every worker.
Nothing is emitted at replay (only for changes made durable now), nor for transactions
that came without a trace context. A DC can order a transaction before its body (which
brings the context) arrives; the spans of the transitions made meanwhile are emitted
when it does (``trace_history``).

The same transitions of this DC's own submits are timed for metrics
(``measure_transitions``): from the submit (INCOMING here, durable) to ACCEPTED, and to
OK or FAILED, what a client waiting for either state sees, less its network.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from txsync.protocol import TxState
from txsync.telemetry import SECONDS_BUCKETS, context_of, tracer
from txsync.telemetry.histograms import PlainHistogram, process_wide
from txsync.transaction_store.state import Moved, StoreState, TxRecord

SUBMIT_TO_STATE = process_wide(
    PlainHistogram(
        "txsync.submit.duration",
        "this DC's submits: time from INCOMING (the submit made durable) to each later "
        "state, by state (accepted, ok, failed)",
        "s",
        SECONDS_BUCKETS,
        labels=("state",),
    )
)
_TIMED_STATES = {
    TxState.ACCEPTED: "accepted", TxState.OK: "ok", TxState.FAILED: "failed",
}  # fmt: skip


def measure_transitions(moved: Iterable[Moved]) -> None:
    """``SUBMIT_TO_STATE`` for the transitions of local submits just made durable."""
    for transition in moved:
        record = transition.record
        label = _TIMED_STATES.get(transition.step.state)
        if label is not None and record.local and record.history:
            first = record.history[0]
            if first.state is TxState.INCOMING:
                elapsed_ms = transition.step.at_unix_ms - first.at_unix_ms
                SUBMIT_TO_STATE.record(max(elapsed_ms, 0) / 1000, label)


def trace_transitions(node_id: str, moved: Iterable[Moved], *, skip: Collection[str] = ()) -> None:
    """Spans for transitions just made durable (``skip``: transactions traced whole)."""
    for transition in moved:
        if transition.record.tx_id not in skip:
            _emit(node_id, transition.record, transition.index)


def trace_history(state: StoreState, tx_id: str) -> None:
    """Spans for every transition so far: the transaction's context just arrived."""
    record = state.txs.get(tx_id)
    if record is not None:
        for index in range(1, len(record.history)):
            _emit(state.node_id, record, index)


def _emit(node_id: str, record: TxRecord, index: int) -> None:
    if index == 0:
        return  # INCOMING starts the history: the submit (or a post) brought it
    context = context_of(record.traceparent)
    if context is None:
        return
    before, step = record.history[index - 1], record.history[index]
    reached = step.state
    attributes: dict[str, str | int] = {
        "txsync.dc": node_id,
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
