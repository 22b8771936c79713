"""Start-up cost: what a user waits for before anything works.

    make bench-startup        (or: .venv/bin/python -m bench.startup_bench --help)

Measures, on this machine, each ``--runs`` times (median and worst printed):

- ``txsync --help`` and ``txsync submit --help``: exec to exit (every CLI call pays the
  interpreter and the imports of the command it runs);
- each service kind from exec to SERVING on its health service (a fresh data directory
  each time; the store, worker and dispatch alone, the coordinator with its store);
- ``txsync dev up`` (3 DCs x 2 workers, 15 processes) from exec to ``cluster.json``.

Nothing here is asserted: the figures go to ``docs/operations.md`` by hand, with the date.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tests.support.dev_up import free_base_port
from tests.support.processes import free_port, wait_serving

CLI = [sys.executable, "-m", "txsync.cli.main"]
SERVING_TIMEOUT_S = 300.0


def time_command(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([*CLI, *args], capture_output=True, check=True, timeout=120)
    return time.perf_counter() - started


def _wait_serving(
    address: str, process: subprocess.Popen[bytes], started: float | None = None
) -> float:
    """Seconds until ``address`` serves, from ``started`` (``time.monotonic``; default
    now)."""
    started = time.monotonic() if started is None else started
    if not wait_serving(address, process, started + SERVING_TIMEOUT_S):
        raise RuntimeError(f"{address} did not serve (exit status {process.poll()})")
    return time.monotonic() - started


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def time_service(kind: str, root: Path) -> float:
    """Exec to SERVING for one service of ``kind`` (with a store beside it if it needs
    one, started first and not counted)."""
    data = Path(tempfile.mkdtemp(dir=root))
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        store = f"127.0.0.1:{free_port()}"
        if kind in ("sync-coordinator", "worker-dispatch"):
            helper = subprocess.Popen(
                [*CLI, "transaction-store", "--node-id", "dc1", "--data", str(data / "store"),
                 "--listen", store],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            helpers.append(helper)
            _wait_serving(store, helper)
        address = f"127.0.0.1:{free_port()}"
        args = {
            "transaction-store": ["--node-id", "dc1", "--data", str(data / "store")],
            "worker": ["--worker-id", "w1", "--data", str(data / "w1")],
            "worker-dispatch": ["--store", store, "--worker", f"w1=127.0.0.1:{free_port()}"],
            "sync-coordinator": ["--node-id", "dc1", "--store", store, "--plaintext",
                                 "--peer", f"dc2=127.0.0.1:{free_port()}"],
        }[kind]  # fmt: skip
        started = time.monotonic()
        process = subprocess.Popen(
            [*CLI, kind, *args, "--listen", address],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        helpers.append(process)
        return _wait_serving(address, process, started)
    finally:
        for helper in reversed(helpers):
            _stop(helper)


def time_dev_up(root: Path) -> float:
    data = Path(tempfile.mkdtemp(dir=root))
    started = time.perf_counter()
    process = subprocess.Popen(
        [*CLI, "dev", "up", "--data", str(data), "--base-port", str(free_base_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + SERVING_TIMEOUT_S
        while not (data / "cluster.json").exists():
            if process.poll() is not None:
                raise RuntimeError(f"dev up exited {process.returncode}; logs in {data}")
            if time.monotonic() > deadline:
                raise RuntimeError("dev up did not write cluster.json")
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        _stop(process)


def _report(name: str, measure: Callable[[], float], runs: int) -> None:
    figures: list[float] = []
    for _ in range(runs):
        try:
            figures.append(measure())
        except (RuntimeError, subprocess.CalledProcessError) as error:
            print(f"{name:<34} failed: {error}")
            return
    print(
        f"{name:<34} median {statistics.median(figures):6.2f} s   worst {max(figures):6.2f} s"
        f"   ({runs} runs)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--dev-up-runs", type=int, default=3, help="dev up runs (default 3)")
    options = parser.parse_args()
    print(f"start-up on {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        _report("txsync --help", lambda: time_command(["--help"]), options.runs)
        _report("txsync submit --help", lambda: time_command(["submit", "--help"]), options.runs)
        for kind in ("transaction-store", "sync-coordinator", "worker-dispatch", "worker"):
            _report(f"{kind}: exec -> SERVING", partial(time_service, kind, root), options.runs)
        _report(
            "dev up (3 DCs x 2) -> cluster.json", partial(time_dev_up, root), options.dev_up_runs
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
