"""Traces without Jaeger: `txsync dev up --traces` collects every service's spans into a
file, and `txsync dev trace TX_ID` prints a transaction's trace (issue 51)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.support.dev_up import down, statement, submit_and_wait, txsync, up
from tests.support.waiting import wait_until

DCS = ("dc1", "dc2", "dc3")


def test_dev_up_collects_the_traces_that_dev_trace_shows(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    without_jaeger = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    process = up(data, env=without_jaeger, options=["--traces"])
    shown = ""
    try:
        dcs: dict[str, Any] = json.loads((data / "cluster.json").read_text())["dcs"]
        ids: list[str] = []
        submit_and_wait(dcs["dc2"]["store"], [statement("CREATE TABLE t (a INTEGER)")], ids)

        def every_dc_and_worker_shown() -> bool:
            nonlocal shown
            ran = txsync("dev", "trace", ids[0], "--data", str(data))
            shown = ran.stdout
            return (
                ran.returncode == 0
                and all(f"txsync.tx OK [transaction-store {dc}]" in shown for dc in DCS)
                and shown.count("txsync.tx apply [worker") == 6  # 2 workers per DC
            )

        wait_until("the transaction's trace at every DC and worker", every_dc_and_worker_shown,
                   timeout_s=120)  # fmt: skip
    finally:
        down(process)
    lines = shown.splitlines()
    assert "submit" in lines[1].lower() or "Submit" in lines[1], shown  # the root: the call
    assert all(" ms " in line for line in lines[1:]), shown
    unknown = txsync("dev", "trace", "no-such-transaction", "--data", str(data))
    assert unknown.returncode == 1 and "no spans of no-such-transaction" in unknown.stdout
    elsewhere = txsync("dev", "trace", ids[0], "--data", str(tmp_path / "nothing"))
    assert elsewhere.returncode == 2 and "dev up --traces" in elsewhere.stderr
