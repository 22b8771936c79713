"""CPU time and peak memory of server processes, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime


def context_switches(pid: int) -> int:
    """Voluntary context switches of all the process's threads so far: each is a thread
    going to sleep until something wakes it, the cost that handing work between threads
    and processes adds to the CPU time (a thread that ended takes its count with it)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def reset_peak_rss(pid: int) -> None:
    """Start the process's peak resident memory afresh from its RSS now (Linux's
    ``/proc/<pid>/clear_refs``, 5): ``peak_rss_mib`` then reads the peak since."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def kind_of(name: str) -> str:
    """ "sync-coordinator dc2" -> "sync-coordinator"."""
    return name.split(" ", 1)[0]
