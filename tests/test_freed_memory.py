"""``release_freed_memory`` hands what a burst freed back to the system (glibc)."""

from __future__ import annotations

from pathlib import Path

from txsync.freed_memory import release_freed_memory

BURST = 100_000
"""Objects of 1 KB: above pymalloc's 512 bytes, so glibc's malloc holds them."""


def _rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


def test_a_burst_freed_leaves_the_process_once_released() -> None:
    burst = [bytes(1000 + n % 50) for n in range(BURST)]
    survivors = burst[::50]  # a few live chunks pin the heap: freeing alone returns little
    before = _rss_mib()
    del burst
    freed = _rss_mib()
    assert release_freed_memory(), "this machine runs glibc"
    released = _rss_mib()
    assert before - freed < 20, (before, freed)
    assert freed - released > 50, (before, freed, released)
    assert len(survivors) == BURST // 50
