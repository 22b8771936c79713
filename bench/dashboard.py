"""The chart's Grafana dashboard, drawn from a real Prometheus scraping a loaded cluster.

    make dashboard        (or: .venv/bin/python -m bench.dashboard --help)

No Grafana runs here (Debian and PyPI ship none), so this does what Grafana would with
the dashboard's own queries: a 3-DC cluster of real processes (``txsync dev up``'s
services), Debian's Prometheus scraping every service each second, a steady load of
single-row submits at every DC for ``--seconds``, then each panel's expression (the
dashboard's variables given values: every DC, a rate interval of 5 s) asked of
Prometheus over the run with ``query_range``, and the panels drawn row by row as in
the dashboard (``--out``, default ``docs/benchmarks/dashboard.png``). It prints each
panel's last values. A panel with no data is drawn empty and named in the output: an
expression that no service's metrics answer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.dev_up import free_base_port
from tests.support.processes import free_port
from txsync.client import Client, TxSyncError
from txsync.dev_cluster import DevCluster, layout_of

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "helm" / "txsync" / "dashboards" / "txsync.json"
VARIABLES = {"$__rate_interval": "5s", "$dc": ".*"}
CALLERS = 12
"""Clients of the steady load, each submitting one transaction after another."""


def _metrics_targets(layout: dict[str, Any]) -> list[str]:
    targets = []
    for dc in layout["dcs"].values():
        targets += [dc[k] for k in ("metrics", "store_metrics", "dispatch_metrics") if k in dc]
        targets += list(dc.get("worker_metrics", {}).values())
    return targets


class Prometheus:
    """Debian's Prometheus, scraping ``targets`` every second, on a loopback port."""

    def __init__(self, targets: list[str], workdir: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("prometheus is not installed: scripts/ensure_system_packages.sh")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "txsync", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.address = f"127.0.0.1:{free_port()}"
        self._log = (workdir / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={self.address}"],
            stdout=self._log, stderr=self._log,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"prometheus did not start; see {workdir / 'prometheus.log'}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
        url = f"http://{self.address}/api/v1/query_range?{query}"
        with urllib.request.urlopen(url, timeout=60) as answer:
            result: list[dict[str, Any]] = json.load(answer)["data"]["result"]
        return result

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self._log.close()


def _load(stores: list[str], until: float, counts: list[int]) -> None:
    """One caller: single-row submits, waited for at ACCEPTED, until ``until``."""
    with Client(stores) as client:
        n = 0
        while time.monotonic() < until:
            try:
                client.submit("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", n % 1000, n)
                n += 1
            except TxSyncError:
                time.sleep(0.1)  # refused or slow: the dashboard shows it
        counts.append(n)


def _label(series: dict[str, str]) -> str:
    shown = {k: v for k, v in series.items() if k not in {"instance", "job", "__name__"}}
    return ",".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"


def draw(dashboard: dict[str, Any], results: dict[int, list[dict[str, Any]]], out: Path,
         start: float) -> None:  # fmt: skip
    import matplotlib  # noqa: PLC0415 - only for drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels = dashboard["panels"]
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for panel in panels:
        if panel["type"] == "row":
            rows.append((panel["title"], []))
        else:
            rows[-1][1].append(panel)
    lines = sum((len(r[1]) + 2) // 3 for r in rows)
    figure = plt.figure(figsize=(18, 3.2 * lines))
    grid = figure.add_gridspec(lines, 3, hspace=0.7, wspace=0.25)
    line = 0
    for title, row_panels in rows:
        for index, panel in enumerate(row_panels):
            axes = figure.add_subplot(grid[line + index // 3, index % 3])
            for series in results.get(panel["id"], []):
                points = [(float(t) - start, float(v)) for t, v in series["values"]]
                axes.plot([p[0] for p in points], [p[1] for p in points],
                          label=_label(series["metric"]), linewidth=1)  # fmt: skip
            unit = panel["fieldConfig"]["defaults"].get("unit", "")
            axes.set_title(f"{title}: {panel['title']}" + (f" ({unit})" if unit else ""),
                           fontsize=8)  # fmt: skip
            axes.tick_params(labelsize=7)
            if results.get(panel["id"]):
                axes.legend(fontsize=5, ncol=2, loc="upper left")
            else:
                axes.text(0.5, 0.5, "no data", ha="center", transform=axes.transAxes)
        line += (len(row_panels) + 2) // 3
    figure.suptitle("TxSync dashboard, drawn from Prometheus over a loaded 3-DC dev cluster "
                    "(x: seconds)")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80, bbox_inches="tight")


def run(seconds: float, out: Path) -> list[str]:
    """Load, scrape, query and draw; the titles of the panels that had no data."""
    dashboard = json.loads(DASHBOARD.read_text())
    workdir = Path(tempfile.mkdtemp(prefix="dashboard-"))
    layout = layout_of(workdir, 3, free_base_port(3), witness=False, workers=1)
    cluster = DevCluster(layout)
    prometheus = None
    try:
        cluster.start()
        prometheus = Prometheus(_metrics_targets(layout), workdir)
        stores = [dc["store"] for dc in layout["dcs"].values()]
        with Client(stores) as client:
            client.submit("CREATE TABLE kv (k INTEGER PRIMARY KEY, v INTEGER)", wait="ok")
        start = time.time()
        until = time.monotonic() + seconds
        counts: list[int] = []
        callers = [
            threading.Thread(target=_load, args=(stores[n % 3 :] + stores[: n % 3], until, counts))
            for n in range(CALLERS)
        ]
        for caller in callers:
            caller.start()
        while any(c.is_alive() for c in callers):
            for event in cluster.supervise():
                print(event, flush=True)
            time.sleep(0.5)
        time.sleep(3)  # the last scrapes
        end = time.time()
        print(f"{sum(counts):,} transactions in {seconds:g} s "
              f"({sum(counts) / seconds:,.0f}/s)")  # fmt: skip
        results: dict[int, list[dict[str, Any]]] = {}
        empty = []
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in VARIABLES.items():
                    expr = expr.replace(variable, value)
                found = prometheus.query_range(expr, start, end)
                results[panel["id"]] = found
                last = [f"{_label(s['metric'])}={float(s['values'][-1][1]):.4g}" for s in found]
                print(f"{panel['title']}: {'; '.join(last) if last else 'NO DATA'}")
                if not found:
                    empty.append(panel["title"])
        draw(dashboard, results, out, start)
        print(f"drawn: {out}")
        return empty
    finally:
        if prometheus is not None:
            prometheus.close()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="seconds of load (default 60)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "dashboard.png",
                        help="the PNG (default docs/benchmarks/dashboard.png)")  # fmt: skip
    options = parser.parse_args()
    empty = run(options.seconds, options.out)
    if empty:
        # The errors panel is empty while nothing fails; any other is a query that no
        # service's metrics answer.
        print(f"panels without data: {', '.join(empty)}")


if __name__ == "__main__":
    main()
