"""Kill a worker mid-apply, many times: every transaction is applied exactly once, and the
final state digest equals that of a run that was never interrupted."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.worker.apply_driver import body_at
from txsync.worker.sqlite_backend import SqliteBackend

TRANSACTIONS = 1_500
KILLS = int(os.environ.get("TXSYNC_WORKER_KILLS", "40"))
DRIVER = Path(__file__).with_name("apply_driver.py")


def test_sigkill_at_random_moments_never_applies_twice_or_skips(tmp_path: Path) -> None:
    database = tmp_path / "worker.db"
    rng = random.Random(7)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    kills = 0
    while True:
        process = subprocess.Popen(
            [sys.executable, str(DRIVER), str(database), str(TRANSACTIONS)],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert process.stdout is not None
        if kills < KILLS:
            # Let it commit a random number of transactions, then kill it wherever it is
            # by then: the signal lands while it applies the next ones.
            for _ in range(rng.randint(1, 2 * TRANSACTIONS // (KILLS + 2))):
                if not process.stdout.readline():
                    break
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                kills += 1
            process.communicate()
            continue
        process.communicate(timeout=120)
        assert process.returncode == 0
        break

    with sqlite3.connect(database) as check:
        positions = [row[0] for row in check.execute("SELECT position FROM applied_log")]
        counter = check.execute("SELECT n FROM counter").fetchone()[0]
    assert positions == list(range(2, TRANSACTIONS + 1)), "a position missing or twice"
    assert counter == TRANSACTIONS - 1, "a transaction's update ran twice or not at all"

    clean = SqliteBackend(tmp_path / "clean.db")
    for position in range(1, TRANSACTIONS + 1):
        clean.apply(position, f"tx-{position}", body_at(position))
    assert SqliteBackend(database).applied() == clean.applied()
    assert kills == KILLS
