"""The txlog's group commit on real files: where a write runs. A lone frame of a quiet
store is written on the event loop's thread (no hop to a worker thread and back); a
batch of several, a busy store or a disk that has been slow goes to a worker thread."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from tests.support.in_process import WAIT_S
from txsync.transaction_store.txlog import writer as writer_module
from txsync.transaction_store.txlog.files import LogFiles
from txsync.transaction_store.txlog.framing import encode_frame
from txsync.transaction_store.txlog.writer import GroupCommitWriter
from txsync.v1 import txlog_pb2


def _frame(counter: int) -> bytes:
    batch = txlog_pb2.LogBatch()
    batch.entries.add(at_unix_ms=counter).counter.counter = counter
    return encode_frame(batch.SerializeToString())


class _Disk:
    """The real ``append_sync``, noting the thread of each call and, while ``slow_s`` is
    set, taking that much longer (a disk in a bad moment). What counts as slow is
    ``slow_from_s``, far above what this machine's disk takes even when busy, so that
    only ``slow_s`` decides."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, slow_from_s: float = 0.05) -> None:
        monkeypatch.setattr(writer_module, "INLINE_SYNC_S_MOST", slow_from_s)
        self.threads: list[int] = []
        self.slow_s = 0.0
        append = LogFiles.append_sync

        def noted(files: LogFiles, frames: bytes) -> None:
            self.threads.append(threading.get_ident())
            if self.slow_s:
                time.sleep(self.slow_s)
            append(files, frames)

        monkeypatch.setattr(LogFiles, "append_sync", noted)


def _replayed(directory: Path) -> list[int]:
    files = LogFiles(directory)
    counters: list[int] = []
    files.recover(lambda entry: counters.append(entry.counter.counter))
    files.close()
    return counters


def _run(tmp_path: Path, quiet: bool, scenario: object) -> None:
    async def main() -> None:
        files = LogFiles(tmp_path)
        files.recover(lambda entry: None)
        writer = GroupCommitWriter(files, quiet=lambda: quiet)
        writer.start()
        try:
            async with asyncio.timeout(WAIT_S):
                await scenario(writer)  # type: ignore[operator]
        finally:
            await writer.close()
            files.close()

    asyncio.run(main())


@pytest.mark.parametrize("quiet", [True, False])
def test_a_lone_frame_of_a_quiet_store_is_written_on_the_loop_s_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quiet: bool
) -> None:
    disk = _Disk(monkeypatch)

    async def scenario(writer: GroupCommitWriter) -> None:
        loop_thread = threading.get_ident()
        await writer.submit(_frame(1))
        await writer.submit(_frame(2))
        assert [thread == loop_thread for thread in disk.threads] == [quiet, quiet]

    _run(tmp_path, quiet, scenario)
    assert _replayed(tmp_path) == [1, 2]


def test_several_frames_at_once_go_to_a_thread_even_when_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _Disk(monkeypatch)

    async def scenario(writer: GroupCommitWriter) -> None:
        await asyncio.gather(writer.submit(_frame(1)), writer.submit(_frame(2)))
        assert len(disk.threads) == 1  # one batch, one write and fsync
        assert disk.threads != [threading.get_ident()]

    _run(tmp_path, True, scenario)
    assert _replayed(tmp_path) == [1, 2]


def test_after_a_slow_write_writes_go_to_a_thread_until_the_disk_is_fast_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that took long moves the next ones off the loop's thread (a slow disk
    would otherwise stall every call); once writes are fast again they come back."""
    disk = _Disk(monkeypatch, slow_from_s=0.01)
    slow_s = 4 * writer_module.INLINE_SYNC_S_MOST / writer_module.SYNC_S_WEIGHT

    async def scenario(writer: GroupCommitWriter) -> None:
        loop_thread = threading.get_ident()
        disk.slow_s = slow_s
        await writer.submit(_frame(1))
        assert disk.threads[-1] == loop_thread  # nothing said the disk was slow yet
        disk.slow_s = 0.0
        await writer.submit(_frame(2))
        assert disk.threads[-1] != loop_thread
        counter = 2
        while disk.threads[-1] != loop_thread:
            counter += 1
            assert counter < 1_000, "writes never came back to the loop's thread"
            await writer.submit(_frame(counter))

    _run(tmp_path, True, scenario)
    assert len(_replayed(tmp_path)) >= 3
