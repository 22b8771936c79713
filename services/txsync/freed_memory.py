"""Handing the memory a burst freed back to the system (glibc's ``malloc_trim``).

A transaction-store whose workers lag under a batched load holds every unfinished
transaction (20,000 and more, 3 KB each); once they are applied and truncated, Python
frees them, but glibc's malloc keeps the freed chunks inside its arenas (the main heap,
and one arena per thread that allocated: gRPC's and the executor's), where only the top
of a heap is ever given back. After a 200,000-transaction load a store held 128 MB of
free chunks in 142 MB of arenas, and its RSS stayed at the load's high-water mark
(docs/benchmarks.md, "History bounded"). ``malloc_trim(0)`` returns every whole free page
of every arena (madvise ``MADV_DONTNEED``); the chunks stay usable.

It is called after a truncation dropped many transactions, not on a timer: that is when
a store frees much. Elsewhere than glibc (musl, macOS) there is no ``malloc_trim`` and
this does nothing; pymalloc's partly used arenas (objects up to 512 bytes) stay either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Give the allocator's free pages back to the system; False where it cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
