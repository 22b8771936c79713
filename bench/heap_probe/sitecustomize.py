"""What holds a running service's memory: a heap probe any TxSync process can load.

    PYTHONPATH=bench/heap_probe .venv/bin/python -m bench.soak --history 150000 ...
    kill -USR2 <pid>    # allocator figures and a census of the objects, by type

    HEAP_PROBE_TRIM=1 PYTHONPATH=bench/heap_probe ...
    kill -USR2 <pid>    # each also calls glibc's malloc_trim(0) first, and writes
                        # the RSS before and after: what the C heap held free

    HEAP_PROBE_TRACE=1 PYTHONPATH=bench/heap_probe ...
    kill -USR2 <pid>    # the first also starts tracemalloc; each later one also
                        # writes what was allocated since, by line and traceback

Python imports ``sitecustomize`` at start-up from the path, and every process
``txsync dev up`` or the soak starts inherits the environment, so each of them gets a
SIGUSR2 handler (no service uses that signal). Each signal writes
``/tmp/heap_probe/<pid>.<n>.mstat`` (``sys._debugmallocstats``: pymalloc's arenas, the
bytes in live blocks, the empty pools), ``<pid>.<n>.census`` (the objects the garbage
collector tracks, counted by type: cheap enough to take at a load's peak without
slowing the process) and, when tracing, ``<pid>.<n>.tm``: the live allocations made
since the first signal, by line and by traceback. Started in a steady phase and read
after a batched load, it names what the load left alive.

Python runs the handler in the main thread between bytecodes, so it is safe where
attaching gdb and calling into the interpreter is not (that deadlocked on
tracemalloc's lock). Tracing slows the process several times over: a probed run
measures what is alive, never speed or the RSS of a normal run. How it found the
records a truncation left alive: ``docs/benchmarks.md``, 2026-12-02.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import itertools
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

OUT = Path("/tmp/heap_probe")
FRAMES = 6
TOP_LINES = 50
TOP_TRACEBACKS = 30
TOP_TYPES = 40
TRACING = os.environ.get("HEAP_PROBE_TRACE") == "1"
TRIMMING = os.environ.get("HEAP_PROBE_TRIM") == "1"
_signal_numbers = itertools.count(1)


def _write_mallocstats(path: Path) -> None:
    """``sys._debugmallocstats`` writes to the C stderr: point fd 2 at ``path`` for it."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    os.dup2(target, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(target)
        os.close(saved)


def _write_census(path: Path) -> None:
    counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    lines = [f"{sum(counts.values())} objects tracked by the garbage collector"]
    lines += [f"{count:>9} {name}" for name, count in counts.most_common(TOP_TYPES)]
    path.write_text("\n".join(lines) + "\n")


def _write_live_allocations(path: Path) -> None:
    snapshot = tracemalloc.take_snapshot()
    by_line = snapshot.statistics("lineno")
    lines = [f"total {sum(stat.size for stat in by_line)} bytes live since tracing began"]
    lines += [f"{s.size:>10} {s.count:>7} {s.traceback[0]}" for s in by_line[:TOP_LINES]]
    lines.append("\n--- by traceback")
    for stat in snapshot.statistics("traceback")[:TOP_TRACEBACKS]:
        lines.append(f"{stat.size:>10} {stat.count:>7}")
        lines += ["    " + frame for frame in stat.traceback.format()[-2 * FRAMES :]]
    path.write_text("\n".join(lines) + "\n")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _trim(path: Path) -> None:
    """glibc's ``malloc_trim(0)``: what RSS the C heap (gRPC's buffers, objects over
    512 bytes) holds in free pages, measured by returning them."""
    before = _rss_kib()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    path.write_text(f"rss before {before} KiB, after malloc_trim {_rss_kib()} KiB\n")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    OUT.mkdir(exist_ok=True)
    stem = f"{os.getpid()}.{next(_signal_numbers)}"
    if TRIMMING:
        _trim(OUT / f"{stem}.trim")
    _write_mallocstats(OUT / f"{stem}.mstat")
    _write_census(OUT / f"{stem}.census")
    if tracemalloc.is_tracing():
        _write_live_allocations(OUT / f"{stem}.tm")
    elif TRACING:
        tracemalloc.start(FRAMES)


signal.signal(signal.SIGUSR2, _on_signal)
