"""Waiting for a condition, never for a fixed time: a loaded machine is slow, not wrong."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    what: str, condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.1
) -> None:
    """Until ``condition()`` holds, checking every ``poll_s``; an AssertionError naming
    ``what`` once ``timeout_s`` has passed without it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(poll_s)
