"""The chart's Grafana dashboard and Prometheus alerts, as the expressions they query."""

from __future__ import annotations

import json
from typing import Any

import promql_parser

from tests.support.chart import example_values, merged, render

KUBERNETES_METRICS = frozenset({
    "up",  # Prometheus, per scraped target
    "kubelet_volume_stats_available_bytes", "kubelet_volume_stats_capacity_bytes",  # kubelet
    "kube_pod_container_status_restarts_total",  # kube-state-metrics
    "certmanager_certificate_expiration_timestamp_seconds",  # cert-manager
})  # fmt: skip
"""What the alerts read from the platform (what kube-prometheus-stack scrapes), not from
TxSync's services."""

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$dc": ".*"}


def monitoring_objects() -> list[dict[str, Any]]:
    """The dashboard ConfigMap and the PrometheusRule of dc1 of the three-DC example."""
    values = merged(
        example_values("three-dcs", "dc1.yaml"),
        {"serviceMonitor": {"enabled": True}, "dashboards": {"enabled": True}},
    )
    return [
        o for o in render(values, "txsync-dc1", "txsync")
        if o["kind"] == "PrometheusRule" or o["metadata"]["name"].endswith("-dashboard")
    ]  # fmt: skip


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    loaded: dict[str, Any] = json.loads(config_map["data"]["txsync.json"])
    return loaded


def alert_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def expressions(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Every query, named by its panel's title or its alert, as Prometheus gets it (the
    dashboard's Grafana variables given values)."""
    found = {r["alert"]: r["expr"] for r in alert_rules(objects)}
    for panel in dashboard(objects)["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found[f"panel {panel['title']!r}"] = expr
    return found


def metric_names(expr: str) -> set[str]:
    """The metrics an expression selects (raises ValueError if it does not parse)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names
