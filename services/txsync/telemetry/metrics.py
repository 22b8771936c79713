"""Metrics through OpenTelemetry, scraped by Prometheus.

Each service that is given ``--metrics-listen HOST:PORT`` serves ``/metrics`` there; the
OpenTelemetry resource names the service and the DC. Metric names follow OpenTelemetry
(``txsync.quorum.majority``); Prometheus shows them with underscores
(``txsync_quorum_majority``). Every series carries a ``dc`` label (the DC the process
serves; empty for a process given none), so that one query over all DCs' targets can
be split or filtered by DC without relabelling.

Counters and gauges are OpenTelemetry instruments (the observed ones read plain integers
when scraped); histograms are plain integers of ours (``histograms``: a recording costs
1.4 us against the SDK's 49), exported beside them by one collector. Besides what each
service declares, every process exports its gRPC servers' calls (``grpc_server_*``, the
names of the grpc-ecosystem middleware that dashboards expect), its txlog's fsyncs if it
has one, its work counts and ``txsync_build_info``.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Counter, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from txsync.telemetry import work
from txsync.telemetry.histograms import PROCESS_HISTOGRAMS, PlainHistogram
from txsync.telemetry.tracing import resource_attributes

DC_LABEL = "dc"
BUILD_COMMIT_ENV = "TXSYNC_BUILD_COMMIT"
"""The commit an image was built from (``scripts/build_image.sh`` bakes it in)."""


@dataclass(frozen=True, slots=True)
class Gauge:
    """One observable gauge: read when scraped, never pushed."""

    name: str
    description: str
    read: Callable[[], float | None]
    """The current value, or None when there is nothing to report yet."""
    unit: str = ""


class Metrics:
    def __init__(self, service: str, node_id: str) -> None:
        self.registry = CollectorRegistry()
        """What ``/metrics`` serves: this object's alone (several in one test process
        do not mix), with what prometheus_client's default registry has: the process's
        memory, CPU and file descriptors (``process_*``), Python's collector
        (``python_gc_*``) and version (``python_info``)."""
        for standard in (
            ProcessCollector(registry=None),
            PlatformCollector(registry=None),
            GCCollector(registry=CollectorRegistry()),  # it insists on one
        ):
            self.registry.register(_WithDc(standard, node_id))
        self._reader = PrometheusMetricReader(
            registry=self.registry, resource_attribute_filter=lambda key: key == DC_LABEL
        )
        resource = Resource.create({**resource_attributes(service, node_id), DC_LABEL: node_id})
        self._provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        self._histograms = _HistogramCollector(node_id, service)
        self.registry.register(self._histograms)
        self.meter: Meter = self._provider.get_meter("txsync")
        self._servers: list[Callable[[], None]] = []
        self.meter.create_observable_counter(
            "txsync.work",
            callbacks=[_observe_work],
            description="work done since start, by kind (fsyncs, log entries, ...)",
        )
        self.meter.create_observable_counter(
            "txsync.rpc.messages",
            callbacks=[_observe_messages],
            description="gRPC messages this process's servers received and sent, by method",
        )
        self.meter.create_observable_counter(
            "txsync.rpc.message_bytes",
            callbacks=[_observe_message_bytes],
            unit="By",
            description="bytes of those messages, by method (a stream's by kind of message)",
        )

    def counter(self, name: str, description: str, unit: str = "") -> Counter:
        return self.meter.create_counter(name, unit=unit, description=description)

    def add_histogram(self, histogram: PlainHistogram) -> PlainHistogram:
        """Export ``histogram`` with this object's metrics. Its buckets fit what it
        measures: the SDK's default (0, 5, 10, 25 ... 10000) is made for milliseconds, and
        a round of 20 ms recorded in seconds fell in its first bucket, so every quantile
        read about 2.5 s."""
        self._histograms.own.append(histogram)
        return histogram

    def observed_counter(
        self,
        name: str,
        description: str,
        read: Callable[[], Mapping[str, int] | int],
        label: str = "",
    ) -> None:
        """A counter kept by the caller as plain integers, read when scraped: ``read``
        gives the count, or each ``label`` value's count. For counts bumped per
        transaction or per round, where an OpenTelemetry ``Counter.add`` (attributes
        hashed and matched on every call) cost a fifth of the dispatch's CPU under load
        (py-spy)."""

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            counts = read()
            if isinstance(counts, int):
                return [Observation(counts)]
            return [Observation(n, {label: value}) for value, n in counts.items()]

        self.meter.create_observable_counter(name, callbacks=[callback], description=description)

    def labelled_gauge(
        self,
        name: str,
        description: str,
        read: Callable[[], Mapping[str, float]],
        label: str,
        unit: str = "",
    ) -> None:
        """A gauge per ``label`` value (a worker, a peer), read when scraped: ``read``
        gives each value's reading."""

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, {label: key}) for key, v in read().items()]

        self.meter.create_observable_gauge(
            name, callbacks=[callback], description=description, unit=unit
        )

    def gauges(self, gauges: Iterable[Gauge]) -> None:
        for gauge in gauges:
            self.meter.create_observable_gauge(
                gauge.name,
                callbacks=[_observe(gauge.read)],
                description=gauge.description,
                unit=gauge.unit,
            )

    def serve(self, listen: str) -> None:
        """Serve ``/metrics`` on ``listen`` (host:port) from a daemon thread."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(
            int(port), addr=host or "127.0.0.1", registry=self.registry
        )
        self._servers.append(server.shutdown)

    def close(self) -> None:
        for shutdown in self._servers:
            shutdown()
        self._provider.shutdown()


def _observe(
    read: Callable[[], float | None],
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        value = read()
        return [] if value is None else [Observation(value)]

    return callback


def _observe_work(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(work.counts[kind], {"kind": kind}) for kind in work.KINDS]


def _observe_messages(options: CallbackOptions) -> Iterable[Observation]:
    observed = [
        Observation(n, {"method": method, "direction": direction})
        for direction, counted in (("received", work.received), ("sent", work.sent))
        for method, n in list(counted.items())
    ]
    return observed


def _observe_message_bytes(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(n, {"method": method, "direction": direction})
        for direction, counted in (("received", work.received_bytes), ("sent", work.sent_bytes))
        for method, n in list(counted.items())
    ]


class _HistogramCollector(Collector):
    """Exports the plain histograms (this ``Metrics``'s and the process's) and
    ``txsync_build_info``, each series with the ``dc`` label."""

    def __init__(self, node_id: str, service: str) -> None:
        self.own: list[PlainHistogram] = []
        self._dc = node_id
        self._build = {
            "version": _version(),
            "commit": build_commit(),
            "python": platform.python_version(),
            "service": service,
        }

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily | CounterMetricFamily]:
        info = GaugeMetricFamily(
            "txsync_build_info",
            "1, with the release and commit this process runs",
            labels=[*self._build, DC_LABEL],
        )
        info.add_metric([*self._build.values(), self._dc], 1)
        yield info
        for histogram in (*PROCESS_HISTOGRAMS, *self.own):
            labels = [*histogram.labels, DC_LABEL]
            family = HistogramMetricFamily(histogram.name, histogram.description, labels=labels)
            counted = (
                CounterMetricFamily(histogram.counter_name, histogram.description, labels=labels)
                if histogram.counter_name
                else None
            )
            for series in histogram.series():
                values = [*series.label_values, self._dc]
                buckets = [(_bound_text(bound), n) for bound, n in series.cumulative]
                family.add_metric(values, buckets, series.total)
                if counted is not None:
                    counted.add_metric(values, series.cumulative[-1][1])
            yield family
            if counted is not None:
                yield counted


class _WithDc(Collector):
    """``inner``'s metrics with the ``dc`` label added to each sample."""

    def __init__(self, inner: Collector, node_id: str) -> None:
        self._inner = inner
        self._dc = node_id

    def collect(self) -> Iterator[Metric]:
        for metric in self._inner.collect():
            metric.samples = [
                found._replace(labels={**found.labels, DC_LABEL: self._dc})
                for found in metric.samples
            ]
            yield metric


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _version() -> str:
    try:
        return metadata.version("txsync")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_commit() -> str:
    """``$TXSYNC_BUILD_COMMIT`` (an image's), else the commit of the git checkout this
    package runs from (``make run``), else ``unknown``. Read from ``.git`` without
    running git: a service must not depend on a git binary."""
    if commit := os.environ.get(BUILD_COMMIT_ENV, ""):
        return commit
    git = Path(__file__).resolve().parents[3] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:12]  # a detached HEAD names its commit
        ref = head.removeprefix("ref: ")
        if (git / ref).is_file():
            return (git / ref).read_text().strip()[:12]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split(" ", 1)[0][:12]
    except OSError:  # not a checkout (an installed wheel), or not readable
        pass
    return "unknown"
