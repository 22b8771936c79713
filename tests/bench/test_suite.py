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

pytestmark = pytest.mark.slow  # three clusters side by side: about two minutes


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
    shapes = [(r["system"], r["clients_per_node"], r["batch"], r["rows_per_tx"], r["wait"])
              for r in runs]  # fmt: skip
    assert sorted(shapes) == sorted([
        ("TxSync", 1, 1, 1, "accepted"), ("TxSync", 2, 1, 1, "accepted"),
        ("TxSync", 1, 1, 1, "ok"),  # answered once its own DC applied it
        ("TxSync", 2, 10, 1, "accepted"),  # SubmitBatch: 10 transactions
        ("TxSync", 2, 10, 10, "accepted"),  # the peers' shape: 1 transaction of 10 rows
        ("etcd", 1, 1, 1, ""), ("etcd", 2, 1, 1, ""), ("etcd", 2, 10, 10, ""),
        ("Galera", 1, 1, 1, ""), ("Galera", 2, 1, 1, ""), ("Galera", 2, 10, 10, ""),
    ])  # fmt: skip
    # Interleaved: within a point, the systems take turns.
    assert [r["system"] for r in runs[:3]] == ["TxSync", "etcd", "Galera"]
    for run in runs:
        assert run["committed_per_s"] > 0 and not run["errors"], run
        assert run["client_rows_per_s"] > 0, run
        rows_per_tx = run["rows_per_tx"]
        assert run["transactions_per_s"] * rows_per_tx == pytest.approx(run["committed_per_s"])
        assert run["p50_ms"] > 0 and run["wan_bytes_per_tx"] > 0, run
        assert all(cpu > 0 for cpu in run["cpu_ms_per_1k_tx"].values()), run
        assert set(run["harness_cpu_ms_per_1k_tx"]) == {"clients", "suite"}, run
        assert all(cpu > 0 for cpu in run["harness_cpu_ms_per_1k_tx"].values()), run
        assert run["others_cpu_s_per_s"] >= 0, run
    reads = {(r["system"], r["read"], r["clients_per_node"]) for r in results["reads"]}
    assert reads == {(system, read, clients) for clients in (1, 2) for system, read in (
        ("TxSync", "own DC"), ("Galera", "local"), ("etcd", "linearizable"),
        ("etcd", "serializable"))}  # fmt: skip
    for run in results["reads"]:
        assert run["committed_per_s"] > 0 and run["p50_ms"] > 0 and not run["errors"], run
        assert all(cpu > 0 for cpu in run["cpu_ms_per_1k_tx"].values()), run
    # At 10 ms RTT Galera runs with WAN send windows, and says so.
    assert results["galera_settings"]["10.0"] == {
        "evs.send_window": "1024", "evs.user_send_window": "512"
    }  # fmt: skip
    etcd_roles = next(r["node_roles"] for r in runs if r["system"] == "etcd")
    assert sorted(etcd_roles.values()) == ["follower", "follower", "leader"]
    txsync = [r for r in runs if r["system"] == "TxSync"]
    assert all(r["applied_per_s_per_worker"] > 0 and r["rounds"]["rounds_per_s"] > 0
               for r in txsync)  # fmt: skip
    assert results["probes"][0]["samples"] == 5

    page = doc.read_text()
    assert page.startswith("# Benchmarks\n\nkept by hand") and page.rstrip().endswith("also kept")
    assert "old" not in page
    for heading in ("Issue 52's targets", "evs.user_send_window=512", "Reads side by side",
                    "| serializable |",
                    "What each system counted", "answered at OK (own DC)",
                    "x 1 tx of 10 rows", "x SubmitBatch of 10",
                    "Issue 9's targets", "Issue 19's targets", "Issue 20's targets",
                    "Throughput and latency",
                    "Where the client sits", "one transaction at a",
                    "Resources at the busiest point", "What a TxSync round costs"):  # fmt: skip
        assert heading in page, heading
    assert (tmp_path / "benchmarks" / "latency-throughput.png").stat().st_size > 10_000
