"""The chart's dashboard, asked of a real Prometheus scraping a loaded dev cluster
(``bench.dashboard``): every panel's expression is valid PromQL that the services'
metrics answer."""

from __future__ import annotations

from pathlib import Path

from bench.dashboard import run

MAY_BE_EMPTY = {"gRPC errors per second, by service and status"}
"""Empty while no call fails, as in a healthy run."""


def test_every_panel_of_the_dashboard_has_data_from_prometheus(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.png"
    empty = run(seconds=10, out=out)
    assert set(empty) <= MAY_BE_EMPTY, empty
    assert out.stat().st_size > 10_000  # drawn
