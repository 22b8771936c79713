"""Counts kept as plain integers by the services and read when Prometheus scrapes them
(``Metrics.observed_counter``): the round tracker's, the dispatch's."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.processes import free_port
from txsync.protocol import RoundEnded, RoundOutcome, RoundStarted
from txsync.sync_coordinator.rounds import RoundTracker
from txsync.telemetry import Metrics


@pytest.fixture
def metrics() -> Iterator[tuple[Metrics, str]]:
    port = free_port()
    served = Metrics("sync-coordinator", "dc1")
    served.serve(f"127.0.0.1:{port}")
    yield served, f"http://127.0.0.1:{port}/metrics"
    served.close()


def _scrape(url: str) -> dict[str, float]:
    """Each sample line's name and labels (the resource's left out) -> value."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("txsync_round"):
            name, value = line.rsplit(" ", 1)
            labels = name.partition("{")[2].rstrip("}").split(",")
            kept = [label for label in labels if label.startswith(("le=", "outcome="))]
            samples[name.partition("{")[0] + "{" + ",".join(kept) + "}"] = float(value)
    return samples


def test_rounds_are_counted_by_outcome_with_the_metas_they_added(
    metrics: tuple[Metrics, str],
) -> None:
    served, url = metrics
    tracker = RoundTracker("dc1", served)
    ends = [(RoundOutcome.ADVANCED, 3), (RoundOutcome.ADVANCED, 2), (RoundOutcome.DEADLINE, 0)]
    for round_no, (outcome, added) in enumerate(ends, start=1):
        tracker.on_reports([
            RoundStarted(round_no, 100 * round_no),
            RoundEnded(round_no, 100 * round_no, 100 * round_no + 7, outcome, False, 2, 2, added),
        ])  # fmt: skip
    samples = _scrape(url)
    assert samples['txsync_rounds_total{outcome="advanced"}'] == 2
    assert samples['txsync_rounds_total{outcome="deadline"}'] == 1
    assert samples['txsync_rounds_total{outcome="complete"}'] == 0
    assert samples["txsync_round_added_total{}"] == 5
    assert samples['txsync_round_duration_seconds_count{outcome="advanced"}'] == 2
    # Buckets that fit seconds: the rounds of 7 ms fall between 5 and 10 ms, so a
    # quantile read from the buckets says 5-10 ms (the SDK's default buckets, made for
    # milliseconds, put every round below 5 s and any quantile near 2.5 s).
    bucket = 'txsync_round_duration_seconds_bucket{le="%s",outcome="advanced"}'
    assert samples[bucket % "0.005"] == 0 and samples[bucket % "0.01"] == 2
