"""The chart's alerts, evaluated by Prometheus's own ``promtool test rules`` over what a
running dev cluster exports with one DC cut off (issue 51): the cut-off DC's alert
fires, and no other alert of either DC does.

The samples are scraped from the real services once the cut is in effect; promtool then
holds each at its scraped value for a quarter of an hour of rule evaluation (a counter
that does not move, a gauge that stays), which is how the cut would look to Prometheus
had it lasted that long. promtool comes from Debian's ``prometheus`` package
(``scripts/ensure_system_packages.sh``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.chart import example_values, merged, render
from tests.support.dev_up import down, statement, submit_and_wait, txsync, up
from tests.support.metrics import sample, scrape
from tests.support.monitoring import metric_names
from tests.support.waiting import wait_until

DCS = ("dc1", "dc2", "dc3")
CUT = "dc3"
HELD_MINUTES = 15
EVALUATED_AT = "8m"
"""Past every ``for:`` of the alerts that should not fire, and of the one that should
(2 minutes)."""


def _rules(dc: str) -> list[dict[str, Any]]:
    values = merged(
        example_values("three-dcs", f"{dc}.yaml"), {"serviceMonitor": {"enabled": True}}
    )
    rule = next(
        o for o in render(values, f"txsync-{dc}", "txsync") if o["kind"] == "PrometheusRule"
    )
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def _series(scraped: dict[str, str], wanted: set[str]) -> list[dict[str, str]]:
    """Every sample of the ``wanted`` metrics (``scraped``: address -> text) as a promtool
    input series, held at its scraped value, labelled with its ``instance`` as a
    Prometheus scrape labels it."""
    series = []
    for address, text in scraped.items():
        for family in text_string_to_metric_families(text):
            for found in family.samples:
                if found.name not in wanted:
                    continue
                found.labels["instance"] = address
                # A JSON string is a PromQL string literal (quotes and backslashes escaped).
                labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(found.labels.items()))
                value = "Inf" if found.value == float("inf") else repr(float(found.value))
                series.append(
                    {"series": f"{found.name}{{{labels}}}", "values": f"{value}x{HELD_MINUTES}"}
                )
    return series


def _promtool_test(
    tmp_path: Path, dc: str, series: list[dict[str, str]], firing: set[str]
) -> subprocess.CompletedProcess[str]:
    groups = _rules(dc)
    (tmp_path / f"rules-{dc}.yaml").write_text(yaml.safe_dump({"groups": groups}))
    checks = []
    for rule in (r for group in groups for r in group["rules"]):
        expected = []
        if rule["alert"] in firing:
            expected = [{"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}]
        checks.append(
            {"eval_time": EVALUATED_AT, "alertname": rule["alert"], "exp_alerts": expected}
        )
    test = {
        "rule_files": [f"rules-{dc}.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    (tmp_path / f"test-{dc}.yaml").write_text(yaml.safe_dump(test))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: scripts/ensure_system_packages.sh installs it"
    return subprocess.run(
        [promtool, "test", "rules", f"test-{dc}.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


@pytest.mark.under_load  # a view change takes longer on a busy machine: waited for
def test_a_dc_cut_off_fires_its_alert_and_nothing_else_fires(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    process = up(data)
    try:
        cluster = data / "cluster.json"
        dcs: dict[str, Any] = json.loads(cluster.read_text())["dcs"]
        create = "CREATE TABLE t (a INTEGER)"
        submit_and_wait(dcs["dc1"]["store"], [statement(create)], [])
        paused = txsync("sync", "pause", "--dc", CUT, "--endpoints", str(cluster))
        assert paused.returncode == 0, paused.stdout + paused.stderr

        addresses = [
            dcs[dc][kind] for dc in DCS for kind in ("metrics", "store_metrics", "dispatch_metrics")
        ]
        addresses += [a for dc in DCS for a in dcs[dc]["worker_metrics"].values()]
        scraped: dict[str, str] = {}

        def cut_in_effect() -> bool:
            """One scrape of every service that shows the cut in effect: dc3 without a
            majority, the others past their view change (during one they hold none
            either), and every worker at its DC's end (none stuck)."""
            scraped.clear()
            scraped.update({address: scrape(address) for address in addresses})
            for dc in DCS:
                majority = sample(scraped[dcs[dc]["metrics"]], "txsync_quorum_majority")
                synced = sample(scraped[dcs[dc]["store_metrics"]], "txsync_store_synced_length")
                lowest = sample(scraped[dcs[dc]["dispatch_metrics"]], "txsync_workers_position_min")
                if majority != float(dc != CUT) or lowest != synced:
                    return False
            return True

        wait_until(f"{CUT} cut off, the others in a view without it", cut_in_effect,
                   timeout_s=120)  # fmt: skip
    finally:
        down(process)

    wanted = {
        name
        for dc in DCS
        for group in _rules(dc)
        for rule in group["rules"]
        for name in metric_names(rule["expr"])
    }
    series = _series(scraped, wanted)
    assert any(s["series"].startswith("txsync_quorum_majority{") for s in series)
    cut = _promtool_test(tmp_path, CUT, series, firing={"TxSyncDcCutOff"})
    assert cut.returncode == 0, cut.stdout + cut.stderr
    healthy = _promtool_test(tmp_path, "dc1", series, firing=set())
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    # promtool is not lenient: the same samples with dc1's alert expected fail.
    wrong = _promtool_test(tmp_path, "dc1", series, firing={"TxSyncDcCutOff"})
    assert wrong.returncode != 0 and "TxSyncDcCutOff" in wrong.stdout + wrong.stderr
