"""What the coordinator makes of the core's round reports: a span per round, round
metrics, and the recent rounds the admin API lists.

A round span starts when the core reports the round started and ends when it reports it
ended (with the core's own times), so it covers exactly POST to MERGE. Its attributes
say how the round ended, how many posts went out and came in, and how many metas it
added. Posts carry the round span's traceparent (``PostRequest.round_traceparent``); the
receiver links its own round span to the latest round span of every peer whose post it
took during the round, so Jaeger shows which rounds of which DCs fed each other.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext

from txsync.protocol import RoundEffect, RoundEnded, RoundOutcome, RoundStarted
from txsync.telemetry import (
    SECONDS_BUCKETS,
    Metrics,
    PlainHistogram,
    current_traceparent,
    span_context_of,
    tracer,
)

ROUNDS_KEPT = 1000
"""Rounds the admin API can list (``ListRounds`` answers at most this many)."""


@dataclass(frozen=True, slots=True)
class RoundRecord:
    round_no: int
    started_unix_ns: int
    duration_ns: int
    outcome: RoundOutcome
    idle: bool
    posts_sent: int
    posts_received: int
    added: int


class RoundTracker:
    def __init__(self, node_id: str, metrics: Metrics | None = None) -> None:
        self._node_id = node_id
        self.recent: deque[RoundRecord] = deque(maxlen=ROUNDS_KEPT)
        self.traceparent = ""
        """Of the round span open now ("" between rounds or when tracing is off)."""
        self._span: Span | None = None
        self._peer_rounds: dict[str, SpanContext] = {}
        self.ended = {outcome.value: 0 for outcome in RoundOutcome}
        """Rounds ended, by outcome."""
        self.added = 0
        """Metas ADDed by rounds."""
        self._duration = None
        if metrics is not None:
            metrics.observed_counter(
                "txsync.rounds", "rounds ended, by outcome", lambda: self.ended, "outcome"
            )
            metrics.observed_counter(
                "txsync.round.added", "metas ADDed by rounds", lambda: self.added
            )
            self._duration = metrics.add_histogram(
                PlainHistogram(
                    "txsync.round.duration", "round duration, POST to MERGE", "s",
                    SECONDS_BUCKETS, labels=("outcome",),
                )
            )  # fmt: skip

    def peer_round(self, sender: str, traceparent: str) -> None:
        """A peer's post arrived from its round ``traceparent``."""
        if self._span is not None and (context := span_context_of(traceparent)) is not None:
            self._peer_rounds[sender] = context

    def on_reports(self, reports: Iterable[RoundEffect]) -> None:
        # The core counts in monotonic milliseconds; spans want wall-clock nanoseconds.
        wall_minus_monotonic_ns = time.time_ns() - time.monotonic_ns()
        for report in reports:
            match report:
                case RoundStarted(round_no, at_ms):
                    self._end_span()  # never left open, whatever the reports say
                    self._span = tracer().start_span(
                        "txsync.round",
                        start_time=at_ms * 1_000_000 + wall_minus_monotonic_ns,
                        attributes={"txsync.dc": self._node_id, "txsync.round": round_no},
                    )
                    self.traceparent = current_traceparent(trace.set_span_in_context(self._span))
                case RoundEnded():
                    self._record(report, wall_minus_monotonic_ns)

    def _record(self, ended: RoundEnded, wall_minus_monotonic_ns: int) -> None:
        duration_s = (ended.ended_ms - ended.started_ms) / 1000
        self.recent.append(
            RoundRecord(
                round_no=ended.round_no,
                started_unix_ns=ended.started_ms * 1_000_000 + wall_minus_monotonic_ns,
                duration_ns=(ended.ended_ms - ended.started_ms) * 1_000_000,
                outcome=ended.outcome,
                idle=ended.idle,
                posts_sent=ended.posts_sent,
                posts_received=ended.posts_received,
                added=ended.added,
            )
        )
        self.ended[ended.outcome.value] += 1
        self.added += ended.added
        if self._duration is not None:
            self._duration.record(duration_s, ended.outcome.value)
        span = self._span
        if span is not None:
            span.set_attributes(
                {
                    "txsync.round.outcome": ended.outcome.value,
                    "txsync.round.idle": ended.idle,
                    "txsync.round.posts_sent": ended.posts_sent,
                    "txsync.round.posts_received": ended.posts_received,
                    "txsync.round.added": ended.added,
                }
            )
            for peer, context in sorted(self._peer_rounds.items()):
                span.add_link(context, {"txsync.peer": peer})
            self._end_span(ended.ended_ms * 1_000_000 + wall_minus_monotonic_ns)

    def _end_span(self, end_time_ns: int | None = None) -> None:
        if self._span is not None:
            self._span.end(end_time=end_time_ns)
        self._span = None
        self._peer_rounds = {}
        self.traceparent = ""
