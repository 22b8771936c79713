"""The telemetry of one service process, set up the same way in each."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txsync.telemetry.logs import LOG_FORMATS, LOG_LEVEL_ENV, LOG_LEVELS, configure_logging
from txsync.telemetry.metrics import Metrics
from txsync.telemetry.tracing import start_tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


def add_telemetry_arguments(parser: argparse.ArgumentParser, *, dc_flag: bool = False) -> None:
    """``dc_flag``: add ``--dc`` (for services that have no ``--node-id``), which names
    the DC in traces, metrics and logs."""
    group = parser.add_argument_group(
        "telemetry",
        "traces go over OTLP gRPC when OTEL_EXPORTER_OTLP_ENDPOINT is set (e.g. "
        "http://127.0.0.1:4317 for a local Jaeger); the other OTEL_* variables apply",
    )
    group.add_argument("--metrics-listen", metavar="HOST:PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics")  # fmt: skip
    if dc_flag:
        group.add_argument("--dc", default="", help="the DC this runs in (for telemetry)")
    group.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="text or JSON lines, with trace ids (default text)")  # fmt: skip
    group.add_argument(
        "--log-level", type=str.lower, choices=LOG_LEVELS,
        default=os.environ.get(LOG_LEVEL_ENV, "info").lower(),
        help=f"log from this level up (default: ${LOG_LEVEL_ENV}, else info)",
    )  # fmt: skip


@dataclass
class ServiceTelemetry:
    metrics: Metrics
    """Always there (instruments cost little); served only with --metrics-listen."""
    tracer_provider: TracerProvider | None

    @classmethod
    def start(cls, service: str, node_id: str, options: argparse.Namespace) -> ServiceTelemetry:
        """Logging, tracing and metrics for this process. Serving the metrics may fail
        (port taken): ``serve_metrics`` raises OSError then, for the caller to report."""
        if options.log_level not in LOG_LEVELS:  # from the environment: argparse did not check
            raise SystemExit(
                f"error: ${LOG_LEVEL_ENV}={options.log_level!r} is not one of "
                f"{', '.join(LOG_LEVELS)}"
            )
        configure_logging(service, node_id, options.log_format, options.log_level)
        return cls(Metrics(service, node_id), start_tracing(service, node_id))

    def serve_metrics(self, listen: str | None) -> None:
        if listen is not None:
            self.metrics.serve(listen)

    def close(self) -> None:
        """Flush spans still buffered and stop the metrics endpoint."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.metrics.close()
