"""The systems TxSync is measured beside, started from their Debian packages on loopback,
their peer-to-peer traffic through the same link emulator as TxSync's coordinators."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable


def stop_processes(processes: Iterable[subprocess.Popen[bytes] | None], timeout_s: float) -> None:
    """Ask every process to stop (SIGTERM), then wait for each; kill one that has not
    stopped within ``timeout_s``."""
    running = [p for p in processes if p is not None]
    for process in running:
        if process.poll() is None:
            process.terminate()
    for process in running:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
