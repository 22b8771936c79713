"""Histograms kept as plain integers and read when Prometheus scrapes them.

A measure taken per call or per transaction (a gRPC call's handling time, an fsync's)
must cost far less than the work it measures. Measured on this 2-core machine, one
recording with two labels costs about 49 us through the OpenTelemetry SDK's
``Histogram.record`` (attributes hashed and matched, exemplars considered), 13 us
through ``prometheus_client``'s ``Histogram.labels(...).observe`` and 1.4 us here: a
tuple lookup, a bisection and two additions. So histograms are ours, exported as
Prometheus histograms (cumulative ``_bucket{le=...}``, ``_sum``, ``_count``) by
``Metrics``'s collector, with the ``dc`` label every series carries.

Names are given the OpenTelemetry way (``txsync.txlog.fsync.duration`` and a unit, ``s``)
and exported the Prometheus way (``txsync_txlog_fsync_duration_seconds``), as the
OpenTelemetry exporter names the other instruments.

One thread records into a histogram at a time (the event loop's, or the txlog writer's,
whose writes are one after another); two threads racing on one series could lose an
increment, as ``work.counts`` could, and nothing worse.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Bucket boundaries for durations in seconds, 1 ms to 30 s: a round, a gRPC call, a
submit's wait."""

DISK_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128,
    0.256, 0.512, 1.024, 2.048, 4.096, 8.192,
)  # fmt: skip
"""For an fsync, 100 us to 8 s, doubling: etcd's WAL fsync buckets (0.5 ms to 8 s; etcd
asks for a p99 under 10 ms and alerts over 0.5 s) with three below for local SSDs."""

BYTES_BUCKETS = tuple(float(512 * 4**k) for k in range(9))
"""Sizes of writes, 512 B to 32 MiB, by fours."""

SERIES_MAX = 1_000
"""Label combinations one histogram keeps; more go to the ``"other"`` series. The labels
in use are method names and status codes (a few hundred at most): the cap only bounds a
mistake."""

UNIT_SUFFIXES = {"s": "seconds", "By": "bytes", "1": "ratio"}


@dataclass(frozen=True, slots=True)
class HistogramSeries:
    """One label combination's counts, as Prometheus exposes them."""

    label_values: tuple[str, ...]
    cumulative: tuple[tuple[float, int], ...]
    """(upper bound, count of values at or below it), the last bound ``inf``."""
    total: float


class PlainHistogram:
    def __init__(
        self,
        name: str,
        description: str,
        unit: str,
        boundaries: Sequence[float],
        *,
        labels: Sequence[str] = (),
        counted_as: str = "",
    ) -> None:
        """``counted_as``: also export each series' count as this counter (e.g. the
        calls handled, from their durations), as conventional dashboards expect it."""
        if list(boundaries) != sorted(set(boundaries)):
            raise ValueError(f"{name}: bucket boundaries must increase: {boundaries}")
        self.name = prometheus_name(name, unit)
        self.counter_name = prometheus_name(counted_as, "") + "_total" if counted_as else ""
        self.description = description
        self.labels = tuple(labels)
        self._bounds = tuple(boundaries)
        self._width = len(self._bounds) + 1
        self._series: dict[tuple[str, ...], list[float]] = {}
        """label values -> count per bucket (the last for values above every bound),
        then the sum of the values."""

    def record(self, value: float, *label_values: str) -> None:
        counts = self._series.get(label_values)
        if counts is None:
            counts = self._new_series(label_values)
        counts[bisect_left(self._bounds, value)] += 1
        counts[-1] += value

    def _new_series(self, label_values: tuple[str, ...]) -> list[float]:
        if len(label_values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {label_values}")
        if len(self._series) >= SERIES_MAX:
            label_values = ("other",) * len(self.labels)
        return self._series.setdefault(label_values, [0] * self._width + [0.0])

    def series(self) -> Iterator[HistogramSeries]:
        bounds = (*self._bounds, float("inf"))
        for label_values, counts in list(self._series.items()):
            running = 0
            cumulative = []
            for bound, count in zip(bounds, counts, strict=False):
                running += int(count)
                cumulative.append((bound, running))
            yield HistogramSeries(label_values, tuple(cumulative), counts[-1])


def prometheus_name(name: str, unit: str) -> str:
    """``txsync.txlog.fsync.duration`` in ``s`` -> ``txsync_txlog_fsync_duration_seconds``."""
    base = name.replace(".", "_").replace("-", "_")
    suffix = UNIT_SUFFIXES.get(unit, "")
    return f"{base}_{suffix}" if suffix and not base.endswith(suffix) else base


PROCESS_HISTOGRAMS: list[PlainHistogram] = []
"""Histograms of the process as a whole (its gRPC servers, its txlog), exported by every
``Metrics`` of the process, like ``work.counts``."""


def process_wide(histogram: PlainHistogram) -> PlainHistogram:
    """``histogram``, exported by every ``Metrics`` of the process from now on."""
    PROCESS_HISTOGRAMS.append(histogram)
    return histogram
