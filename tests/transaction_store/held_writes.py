"""Holding the txlog's writes, to see what a store does while one is on disk."""

from __future__ import annotations

import threading

import pytest

from tests.support.in_process import WAIT_S
from txsync.transaction_store.txlog.files import LogFiles


def hold_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every txlog write waits in the writer's thread until the returned gate is set."""
    gate = threading.Event()
    append = LogFiles.append_sync

    def held(files: LogFiles, frames: bytes) -> None:
        gate.wait(WAIT_S)
        append(files, frames)

    monkeypatch.setattr(LogFiles, "append_sync", held)
    return gate
