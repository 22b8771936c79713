"""Holding the txlog's writes, to see what a store does while one is on disk."""

from __future__ import annotations

import threading

import pytest

from tests.support.in_process import WAIT_S
from txsync.transaction_store.txlog import writer
from txsync.transaction_store.txlog.files import LogFiles


def hold_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every txlog write waits in the writer's thread until the returned gate is set. A
    write that long is a slow disk's, which the writer never makes on the event loop's
    thread (``INLINE_SYNC_S_MOST``): here none is, whatever the store's load."""
    monkeypatch.setattr(writer, "INLINE_SYNC_S_MOST", 0.0)
    gate = threading.Event()
    append = LogFiles.append_sync

    def held(files: LogFiles, frames: bytes) -> None:
        gate.wait(WAIT_S)
        append(files, frames)

    monkeypatch.setattr(LogFiles, "append_sync", held)
    return gate
