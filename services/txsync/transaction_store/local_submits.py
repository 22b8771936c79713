"""Local submits on their way to the coordinator (``WatchLocalSubmits``): what one is
(``LocalSubmit``), and one watch's queue of them, bounded in bytes and cut into messages
(``LocalWatch``). The store hands each durable local submit to every watch; a watch
that falls too far behind is dropped and its watcher is handed every pending submit
anew, so a stalled or hostile watcher cannot grow the store's memory."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from txsync.refusals import Refusal, Refused


@dataclass(frozen=True, slots=True)
class LocalSubmit:
    """A durable local submit, with what the coordinator needs to push its body at once."""

    tx_id: str
    body: bytes
    """Encoded ``TxBody``; empty if it could not be read (the peers then fetch it)."""
    digest: bytes
    traceparent: str
    ts: int = 0
    """The stamp the store gave it (0: the coordinator stamps it)."""
    local_seq: int = 0


LOCAL_WATCH_BYTES_MAX = 64 * 1024 * 1024
"""Bodies one local submit watch may have waiting unread; past it the watch is dropped
(its watcher watches again and is handed every pending submit anew), so a stalled or
hostile watcher cannot grow the store's memory."""
LOCAL_SUBMITS_PER_MESSAGE = 256
LOCAL_SUBMIT_BODY_BYTES_PER_MESSAGE = 4 * 1024 * 1024
"""Bodies in one ``WatchLocalSubmits`` message, together (one larger body goes alone: a
body is at most 4 MiB, a message at most 8 MiB, ``rpc.MESSAGE_BYTES_MAX``)."""


class LocalWatch:
    """One ``watch_local_submits`` stream's waiting submits, bounded in bytes."""

    def __init__(self) -> None:
        self._waiting: deque[LocalSubmit] = deque()
        self._handed = asyncio.Event()
        self.waiting_bytes = 0
        self.dropped = False

    def hand(self, submit: LocalSubmit) -> None:
        if self.dropped:
            return
        if self.waiting_bytes + len(submit.body) > LOCAL_WATCH_BYTES_MAX:
            self.dropped = True
            self._waiting.clear()
            self._handed.set()  # wakes the stream, which ends
            return
        self.waiting_bytes += len(submit.body)
        self._waiting.append(submit)
        self._handed.set()

    async def next_batch(self) -> list[LocalSubmit]:
        """Every submit waiting, at least one, as many as one message takes: under load,
        what was staged while the previous message was on its way."""
        while not self._waiting and not self.dropped:
            self._handed.clear()
            await self._handed.wait()
        if self.dropped:
            raise Refusal(
                Refused.OVERLOADED,
                f"this watch fell more than {LOCAL_WATCH_BYTES_MAX // 2**20} MiB of bodies "
                "behind and was dropped; watch again (pending submits are handed anew)",
            )
        batch = LocalSubmitBatch()
        while self._waiting and batch.takes(self._waiting[0]):
            batch.add(self._waiting.popleft())
        self.waiting_bytes -= batch.body_bytes
        return batch.submits


class LocalSubmitBatch:
    """Local submits for one ``WatchLocalSubmits`` message."""

    def __init__(self) -> None:
        self.submits: list[LocalSubmit] = []
        self.body_bytes = 0

    def takes(self, submit: LocalSubmit) -> bool:
        if not self.submits:
            return True  # a body over the byte bound goes alone
        return (
            len(self.submits) < LOCAL_SUBMITS_PER_MESSAGE
            and self.body_bytes + len(submit.body) <= LOCAL_SUBMIT_BODY_BYTES_PER_MESSAGE
        )

    def add(self, submit: LocalSubmit) -> None:
        self.submits.append(submit)
        self.body_bytes += len(submit.body)
