"""Metrics through OpenTelemetry, scraped by Prometheus.

Each service that is given ``--metrics-listen HOST:PORT`` serves ``/metrics`` there; the
OpenTelemetry resource names the service and the DC. Metric names follow OpenTelemetry
(``txsync.quorum.majority``); Prometheus shows them with underscores
(``txsync_quorum_majority``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import start_http_server

from txsync.telemetry import work
from txsync.telemetry.tracing import resource_attributes

SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Bucket boundaries for durations in seconds, 1 ms to 30 s: a round, an fsync, a
submit's wait."""


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
        self._reader = PrometheusMetricReader()
        resource = Resource.create(resource_attributes(service, node_id))
        self._provider = MeterProvider(resource=resource, metric_readers=[self._reader])
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

    def histogram(
        self, name: str, description: str, unit: str, boundaries: Sequence[float]
    ) -> Histogram:
        """A histogram with bucket ``boundaries`` that fit what it measures, in ``unit``:
        the SDK's default (0, 5, 10, 25 ... 10000) is made for milliseconds, and a round
        of 20 ms recorded in seconds fell in its first bucket, so every quantile read
        about 2.5 s."""
        return self.meter.create_histogram(
            name, unit=unit, description=description,
            explicit_bucket_boundaries_advisory=boundaries,
        )  # fmt: skip

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
        server, _thread = start_http_server(int(port), addr=host or "127.0.0.1")
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
