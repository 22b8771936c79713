"""CPU time and peak memory of server processes, read from /proc (Linux); when a
process started serving."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from txsync.rpc import health_status

SERVING_POLL_S = 0.02

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


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def kind_of(name: str) -> str:
    """ "sync-coordinator dc2" -> "sync-coordinator"."""
    return name.split(" ", 1)[0]


def serving_now(address: str) -> bool:
    """One health check on a channel of its own: SERVING or not, at once.

    A channel kept across checks, whose connection was refused while the process was
    still starting, tries again only after gRPC's reconnect backoff (200 ms, then 1.6
    times longer each time, with jitter): a start timed that way was seen at the next
    attempt, about 0.5, 1.0 or 1.8 s. A store that served in 0.6 s was timed at 1.05 s,
    and the soak's restarts by that rounding, not by the history (docs/benchmarks.md)."""
    with grpc.insecure_channel(address) as channel:
        try:
            return health_status(channel, timeout_s=1.0) == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False


def seconds_to_serving(
    address: str, process: subprocess.Popen[bytes], started: float, deadline: float
) -> float | None:
    """Seconds from ``started`` (``time.monotonic``) until ``address`` answers SERVING,
    polled every ``SERVING_POLL_S`` (None: ``process`` exited or the monotonic
    ``deadline`` passed first)."""
    while process.poll() is None and time.monotonic() <= deadline:
        if serving_now(address):
            return time.monotonic() - started
        time.sleep(SERVING_POLL_S)
    return None
