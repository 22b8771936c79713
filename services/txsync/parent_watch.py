"""A service started by ``txsync dev up`` (or by the tests) dies with whoever started it.

The parent names itself in ``TXSYNC_PARENT_PID``; the child, first thing, asks Linux to
SIGKILL it when that parent dies (``PR_SET_PDEATHSIG``), whatever ended the parent:
Ctrl-C, a closed terminal, SIGKILL, a crashed test run. Done in the child rather than in
``preexec_fn`` because ``preexec_fn`` is unsafe in a parent that runs threads (the link
emulator does). SIGKILL because a service that ignored a gentler signal would outlive
its parent: every service is crash-safe by design (the kill tests prove it), and a
parent that stops normally sends SIGTERM first anyway.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "TXSYNC_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def child_environment(parent_pid: int | None = None) -> dict[str, str]:
    """The environment for a child that must die with this process (or ``parent_pid``)."""
    return {**os.environ, PARENT_PID_ENV: str(parent_pid or os.getpid())}


def die_with_parent() -> None:
    """If started with ``TXSYNC_PARENT_PID``, be killed when that process dies. The
    variable is removed, so that anything this process starts does not inherit it."""
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not allowed here (e.g. a seccomp sandbox): the parent stops us itself
    if os.getppid() != int(parent):
        # The parent died before the request took effect: nothing will signal us now.
        os._exit(1)
