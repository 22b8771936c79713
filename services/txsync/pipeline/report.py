"""``report``: where a transaction's time goes, per DC, as an HTML page with PNG plots
and a JSON summary.

From the ``transitions`` dataset (an export, or txlogs read directly): for every DC, the
latency of each step a transaction takes there (INCOMING -> ACCEPTED is ordering,
ACCEPTED -> ENQUEUED, ENQUEUED -> TESTING, TESTING -> OK/FAILED is the testing worker, and
INCOMING -> OK end to end), as p50/p90/p99 (``percentile_approx`` on the executors); the
transactions finished per second over time; and failure rates. From the ``rounds``
dataset, when there is one (only a running coordinator knows its rounds: export with
``--endpoints``), per DC the rounds' duration percentiles, outcomes, posts and metas
added per round. Only the aggregates reach the driver, which draws them with matplotlib.

The page marks each plot ``data-loaded`` once the browser has loaded it, and the body
``data-plots-loaded`` when all have: a headless browser's DOM shows whether every plot
loaded (the tests check it in Chromium).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure  # the object API: no display, no global state
from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual name

STEPS = [
    ("ordering", "INCOMING", "ACCEPTED"),
    ("enqueue", "ACCEPTED", "ENQUEUED"),
    ("to tester", "ENQUEUED", "TESTING"),
    ("testing", "TESTING", "FINISHED"),
    ("submit to finished", "INCOMING", "FINISHED"),
]
PERCENTILES = [0.5, 0.9, 0.99]


@dataclass(frozen=True)
class Report:
    summary: dict[str, Any]
    plots: list[Path]
    page: Path


def _per_transaction(transitions: DataFrame) -> DataFrame:
    """One row per (dc, tx): the time each state was reached there (FINISHED: OK or
    FAILED, with ``failed``)."""
    state = F.when(F.col("state").isin("OK", "FAILED"), "FINISHED").otherwise(F.col("state"))
    return (
        transitions.withColumn("failed", F.col("state") == "FAILED")
        .withColumn("state", state)
        .groupBy("dc", "tx_id")
        .agg(
            F.max("failed").alias("failed"),
            *(
                F.min(F.when(F.col("state") == s, F.col("at_unix_ms"))).alias(s)
                for s in ("INCOMING", "ACCEPTED", "ENQUEUED", "TESTING", "FINISHED")
            ),
        )
    )


def summarize(transitions: DataFrame) -> dict[str, Any]:
    per_tx = _per_transaction(transitions).cache()
    latencies: dict[str, dict[str, dict[str, float]]] = {}
    for name, start, end in STEPS:
        took = (F.col(end) - F.col(start)).cast("double")
        rows = (
            per_tx.filter(F.col(start).isNotNull() & F.col(end).isNotNull())
            .groupBy("dc")
            .agg(F.percentile_approx(took, PERCENTILES).alias("p"), F.count("*").alias("n"))
            .collect()
        )
        for row in rows:
            p50, p90, p99 = row["p"]
            latencies.setdefault(row["dc"], {})[name] = {
                "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "count": row["n"]
            }  # fmt: skip
    finished = per_tx.filter(F.col("FINISHED").isNotNull())
    rates = {
        row["dc"]: {"finished": row["n"], "failed": row["failed"],
                    "failure_rate": row["failed"] / row["n"] if row["n"] else 0.0}
        for row in finished.groupBy("dc").agg(
            F.count("*").alias("n"), F.sum(F.col("failed").cast("int")).alias("failed")
        ).collect()
    }  # fmt: skip
    second = (F.col("FINISHED") / 1000).cast("long")
    throughput: dict[str, list[tuple[int, int]]] = {}
    for row in (
        finished.groupBy("dc", second.alias("second")).count().orderBy("dc", "second").collect()
    ):
        throughput.setdefault(row["dc"], []).append((row["second"], row["count"]))
    per_tx.unpersist()
    return {"latency": latencies, "failures": rates, "throughput_per_second": throughput}


def summarize_rounds(rounds: DataFrame) -> dict[str, Any]:
    """Per DC: how many rounds, their duration p50/p90/p99, outcomes, and what a round
    carries (posts received, metas added; means over the rounds that were not idle)."""
    per_dc: dict[str, Any] = {}
    busy = ~F.col("idle")
    for row in (
        rounds.groupBy("dc")
        .agg(
            F.count("*").alias("n"),
            F.percentile_approx("duration_ms", PERCENTILES).alias("p"),
            F.sum(busy.cast("int")).alias("busy"),
            F.avg(F.when(busy, F.col("added"))).alias("added"),
            F.avg(F.when(busy, F.col("posts_received"))).alias("posts"),
            F.min("started_unix_ms").alias("first"),
            F.max("started_unix_ms").alias("last"),
        )
        .collect()
    ):
        p50, p90, p99 = row["p"]
        span_s = (row["last"] - row["first"]) / 1000
        per_dc[row["dc"]] = {
            "rounds": row["n"], "busy_rounds": row["busy"],
            "duration_p50_ms": p50, "duration_p90_ms": p90, "duration_p99_ms": p99,
            "added_per_busy_round": row["added"] or 0.0,
            "posts_received_per_busy_round": row["posts"] or 0.0,
            "rounds_per_second": (row["n"] - 1) / span_s if span_s > 0 else 0.0,
            "outcomes": {},
        }  # fmt: skip
    for row in rounds.groupBy("dc", "outcome").count().collect():
        per_dc[row["dc"]]["outcomes"][row["outcome"]] = row["count"]
    return per_dc


def _plot_rounds(summary: dict[str, Any], path: Path) -> None:
    rounds = summary["rounds"]
    dcs = sorted(rounds)
    figure = Figure(figsize=(10, 4))
    durations, outcomes = figure.subplots(1, 2)
    width = 0.35
    xs = range(len(dcs))
    durations.bar([x - width / 2 for x in xs], [rounds[dc]["duration_p50_ms"] for dc in dcs],
                  width, label="p50")  # fmt: skip
    durations.bar([x + width / 2 for x in xs], [rounds[dc]["duration_p99_ms"] for dc in dcs],
                  width, label="p99")  # fmt: skip
    durations.set_xticks(list(xs), dcs)
    durations.set_ylabel("milliseconds")
    durations.set_title("Round duration per DC")
    durations.legend()
    kinds = sorted({kind for dc in dcs for kind in rounds[dc]["outcomes"]})
    bottom = [0] * len(dcs)
    for index, kind in enumerate(kinds):
        counts = [rounds[dc]["outcomes"].get(kind, 0) for dc in dcs]
        outcomes.bar(dcs, counts, bottom=bottom, color=f"C{index}", label=kind)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    outcomes.set_ylabel("rounds")
    outcomes.set_title("Round outcomes per DC")
    if kinds:
        outcomes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def _plot_latency(summary: dict[str, Any], path: Path) -> None:
    dcs = sorted(summary["latency"])
    names = [name for name, _, _ in STEPS]
    figure = Figure(figsize=(9, 4.5))
    axis = figure.subplots()
    width = 0.8 / max(1, len(dcs))
    for index, dc in enumerate(dcs):
        p50 = [summary["latency"][dc].get(n, {}).get("p50_ms", 0) for n in names]
        p99 = [summary["latency"][dc].get(n, {}).get("p99_ms", 0) for n in names]
        xs = [i + index * width for i in range(len(names))]
        color = f"C{index}"  # one colour per DC: p99 light behind its p50
        axis.bar(xs, p99, width, color=color, alpha=0.35, label=f"{dc} p99")
        axis.bar(xs, p50, width, color=color, label=f"{dc} p50")
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    axis.set_ylabel("milliseconds")
    axis.set_title("Latency of each step, per DC (p50 solid, p99 light)")
    axis.legend(fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def _plot_throughput(summary: dict[str, Any], path: Path) -> None:
    figure = Figure(figsize=(9, 4))
    axis = figure.subplots()
    series = summary["throughput_per_second"]
    start = min((points[0][0] for points in series.values() if points), default=0)
    for dc, points in sorted(series.items()):
        axis.plot([s - start for s, _ in points], [n for _, n in points], marker=".", label=dc)
    axis.set_xlabel("seconds since the first finished transaction")
    axis.set_ylabel("transactions finished / s")
    axis.set_title("Throughput over time, per DC")
    if series:
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def _plot_failures(summary: dict[str, Any], path: Path) -> None:
    figure = Figure(figsize=(6, 3.5))
    axis = figure.subplots()
    dcs = sorted(summary["failures"])
    axis.bar(dcs, [100 * summary["failures"][dc]["failure_rate"] for dc in dcs])
    axis.set_ylabel("% FAILED")
    axis.set_title("Failure rate per DC (the testing worker's verdict)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>TxSync report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:right}}
img{{display:block;margin:1em 0;max-width:100%}}</style></head>
<body data-plots-loaded="false">
<h1>TxSync report</h1>
<p>{sources}</p>
<h2>Latency per step (ms)</h2>
{table}
<img src="latency.png" alt="latency per step and DC">
<h2>Throughput</h2>
<img src="throughput.png" alt="transactions finished per second">
<h2>Failures</h2>
<img src="failures.png" alt="failure rate per DC">
<h2>Rounds</h2>
{rounds}
<script>
const plots = Array.from(document.images);
let loaded = 0;
function mark(img) {{
  img.dataset.loaded = String(img.complete && img.naturalWidth > 0);
  loaded += 1;
  if (loaded === plots.length) {{
    document.body.dataset.plotsLoaded = String(plots.every(p => p.dataset.loaded === "true"));
  }}
}}
plots.forEach(img => img.complete ? mark(img) : (img.onload = img.onerror = () => mark(img)));
</script>
</body></html>
"""


def _table(summary: dict[str, Any]) -> str:
    rows = ["<table><tr><th>DC</th><th>step</th><th>p50</th><th>p90</th><th>p99</th>"
            "<th>n</th></tr>"]  # fmt: skip
    for dc, steps in sorted(summary["latency"].items()):
        for name, _, _ in STEPS:
            if name in steps:
                s = steps[name]
                rows.append(
                    f"<tr><td>{html.escape(dc)}</td><td>{name}</td><td>{s['p50_ms']:.1f}</td>"
                    f"<td>{s['p90_ms']:.1f}</td><td>{s['p99_ms']:.1f}</td><td>{s['count']}</td></tr>"
                )
    return "\n".join([*rows, "</table>"])


def _rounds_section(summary: dict[str, Any]) -> str:
    rounds = summary.get("rounds")
    if not rounds:
        return (
            "<p>No round data: coordinators keep their last rounds in memory, so only a "
            "running cluster read with <code>--endpoints</code> has them.</p>"
        )
    rows = ["<table><tr><th>DC</th><th>rounds</th><th>per s</th><th>p50 ms</th>"
            "<th>p99 ms</th><th>added / busy round</th><th>outcomes</th></tr>"]  # fmt: skip
    for dc, r in sorted(rounds.items()):
        outcomes = ", ".join(f"{kind} {n}" for kind, n in sorted(r["outcomes"].items()))
        rows.append(
            f"<tr><td>{html.escape(dc)}</td><td>{r['rounds']}</td>"
            f"<td>{r['rounds_per_second']:.1f}</td><td>{r['duration_p50_ms']:.1f}</td>"
            f"<td>{r['duration_p99_ms']:.1f}</td><td>{r['added_per_busy_round']:.1f}</td>"
            f"<td>{html.escape(outcomes)}</td></tr>"
        )
    rows.append("</table>")
    rows.append('<img src="rounds.png" alt="round duration and outcomes per DC">')
    return "\n".join(rows)


def write_report(
    transitions: DataFrame, out: Path, sources: str, rounds: DataFrame | None = None
) -> Report:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(transitions)
    plots = [out / "latency.png", out / "throughput.png", out / "failures.png"]
    _plot_latency(summary, plots[0])
    _plot_throughput(summary, plots[1])
    _plot_failures(summary, plots[2])
    summary["rounds"] = summarize_rounds(rounds) if rounds is not None else {}
    if summary["rounds"]:
        plots.append(out / "rounds.png")
        _plot_rounds(summary, plots[-1])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    page = out / "index.html"
    page.write_text(
        PAGE.format(
            sources=html.escape(sources), table=_table(summary), rounds=_rounds_section(summary)
        )
    )
    return Report(summary, plots, page)
