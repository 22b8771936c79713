"""`make bench` must keep working: the suite in miniature (one RTT, one short run per
point) starts the three real systems from their Debian packages behind the link
emulator, loads them, and renders the page. Figures are not checked (tests never judge
speed); that every system committed the load, with no client errors, and that the page
holds every table, is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three clusters, one after another: about two minutes


def test_the_suite_runs_every_system_and_renders_the_page(tmp_path: Path) -> None:
    out, doc = tmp_path / "results.json", tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkept by hand\n\n<!-- generated: start -->\nold\n"
                   "<!-- generated: end -->\n\nalso kept\n")  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--rtts", "10", "--clients", "1,2", "--reps", "1",
         "--duration", "2", "--warmup", "1", "--batch", "10", "--probe-samples", "5",
         "--scaling-rtt", "-1", "--out", str(out), "--doc", str(doc)],
        capture_output=True, text=True, check=False, timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    runs = results["runs"]
    assert {(r["system"], r["clients_per_node"], r["batch"]) for r in runs} == {
        ("TxSync", 1, 1), ("TxSync", 2, 1), ("TxSync", 2, 10),
        ("etcd", 1, 1), ("etcd", 2, 1), ("etcd", 2, 10),
        ("Galera", 1, 1), ("Galera", 2, 1), ("Galera", 2, 10),
    }  # fmt: skip
    for run in runs:
        assert run["committed_per_s"] > 0 and not run["errors"], run
        assert run["p50_ms"] > 0 and run["wan_bytes_per_tx"] > 0, run
        assert all(cpu > 0 for cpu in run["cpu_ms_per_1k_tx"].values()), run
    etcd_roles = next(r["node_roles"] for r in runs if r["system"] == "etcd")
    assert sorted(etcd_roles.values()) == ["follower", "follower", "leader"]
    txsync = [r for r in runs if r["system"] == "TxSync"]
    assert all(r["applied_per_s_per_worker"] > 0 and r["rounds"]["rounds_per_s"] > 0
               for r in txsync)  # fmt: skip
    assert results["probes"][0]["samples"] == 5

    page = doc.read_text()
    assert page.startswith("# Benchmarks\n\nkept by hand") and page.rstrip().endswith("also kept")
    assert "old" not in page
    for heading in ("Issue 9's targets", "Issue 19's targets", "Issue 20's targets",
                    "Throughput and latency",
                    "Where the client sits", "one transaction at a",
                    "Resources at the busiest point", "What a TxSync round costs"):  # fmt: skip
        assert heading in page, heading
    assert (tmp_path / "benchmarks" / "latency-throughput.png").stat().st_size > 10_000
