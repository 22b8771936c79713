"""A DC behind its peers' history starts from a copy of another DC's database
(docs/dc-snapshots.md). Part of ``Coordinator`` (``coordinator.py``).

A peer whose store no longer holds the positions this DC asks catch-up for says so
(``snapshot_needed``, sent by ``peer_traffic``). This DC's coordinator then streams that
peer's copy of its testing worker (``PeerService.ExportDcSnapshot``: the peer's dispatch
exports it, and its store says what the copy is: the entry at the copy's position Q, the
base before it, this DC's own transactions synced in between) into its own dispatch,
which imports it into the testing worker (``DispatchService.ImportDcCopy``). Its store
then adopts the copy's base (``AdoptBase``: one ``BaseAdopted`` entry), and the
coordinator ends to be restarted onto it, as the simulator's DC restarts onto its copy:
the core starts from the new base like any restarted core, and needs no new input. The
DC's other workers copy the testing worker, as any worker behind the txlog does.

The order matters for a crash at any point. Before the store adopts, nothing changed but
the testing worker, which then holds a prefix of the one order ahead of its store: it
waits for the feed to reach it. After, the store starts at Q and the worker holds Q.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

from txsync.sync_coordinator.coordinator_core import CoordinatorCore, DcCopyProgress, log
from txsync.v1 import common_pb2, peer_pb2, store_pb2, worker_pb2

PassedOn = TypeVar("PassedOn", peer_pb2.ExportDcSnapshotResponse, worker_pb2.ImportDcCopyRequest)


def pass_on(
    piece: worker_pb2.ExportDcCopyResponse | peer_pb2.ExportDcSnapshotResponse,
    into: PassedOn,
) -> PassedOn:
    """A piece of a copy as the next hop's message: its chunk, and its description where
    it carries one (the first piece only). Source dispatch -> source coordinator ->
    joiner's coordinator -> joiner's dispatch, each message of the same two fields."""
    into.chunk.CopyFrom(piece.chunk)
    if piece.HasField("adoption"):
        into.adoption.CopyFrom(piece.adoption)
    return into


DC_COPY_TIMEOUT_S = 3600.0
"""A whole copy (export, transfer across the WAN, import) must finish within this."""
DC_COPY_STALLED_S = 3.0
"""A DC told it needs a copy takes one only once its synced end has not moved for this
long: one that a peer is catching up goes on from there."""
DC_COPY_RETRY_S = 10.0
"""After a copy failed or was refused, none is tried again for this long."""
RESTARTING_EXIT_CODE = 75
"""The process's exit status when it ends to restart onto an adopted copy (EX_TEMPFAIL:
the supervisor, Kubernetes or ``txsync dev up``, starts it again)."""


@dataclass(slots=True)
class CopyPace:
    """Keeps a copy sent to another DC within ``bytes_per_s`` (``--dc-copy-bytes-per-s``),
    so that a DC starting from this one's copy leaves the WAN link, the disk and the
    dispatch to the rounds and the workers: each chunk costs its bytes' share of a
    second, and the next one waits until that is paid. Pure: the clock is an argument."""

    bytes_per_s: int
    """0: as fast as the link and the importer take it."""
    started_s: float
    sent: int = 0

    def wait_s(self, chunk_bytes: int, now_s: float) -> float:
        """How long to wait after sending ``chunk_bytes`` more (0 when not paced)."""
        self.sent += chunk_bytes
        if not self.bytes_per_s:
            return 0.0
        return max(0.0, self.started_s + self.sent / self.bytes_per_s - now_s)


class CopyRefused(Exception):
    """The copy arrived malformed or not as described: it is not adopted."""


class DcCopies(CoordinatorCore):
    def snapshot_needed(self, source: str, history_from: int) -> None:
        """``source`` holds synced positions from ``history_from`` on only: copy its
        testing worker, unless this DC holds the position before that (it can catch up
        from ``source``'s txlog), its synced end moved within ``DC_COPY_STALLED_S``, a
        copy is on its way, or the last one failed just now."""
        node = self.node
        if node is None or self.restarting or self.dc_copy is not None:
            return
        synced_len = node.merge_base.synced_len
        if synced_len >= history_from - 1:
            return
        now_s = time.monotonic()
        if synced_len != self.synced_end_seen[0]:
            self.synced_end_seen = (synced_len, now_s)
        if now_s - self.synced_end_seen[1] < DC_COPY_STALLED_S:
            # Another peer may be catching this DC up meanwhile: the one whose copy it
            # adopted holds what follows the copy for it (the store's copy lease),
            # where the others may have truncated past it. Copying again then would
            # send a whole database for nothing.
            return
        if self.dispatch is None:  # said once: the peers say it each catch-up it asks
            if not self.dc_copy_impossible:
                self.dc_copy_impossible = True
                log.warning(
                    "%s holds positions from %d on only, and this DC (at %d) cannot copy "
                    "a DC: its store names no worker-dispatch (--dispatch)",
                    source, history_from, node.merge_base.synced_len,
                )  # fmt: skip
            return
        if time.monotonic() < self.dc_copy_after_s or self._peer_stub(source) is None:
            return
        self.dc_copy = DcCopyProgress(source, time.monotonic())
        self._in_background(self._copy_dc(source))

    async def _copy_dc(self, source: str) -> None:
        progress = self.dc_copy
        assert progress is not None and self.node is not None and self.dispatch is not None
        adopter_len = self.node.merge_base.synced_len
        log.warning(
            "DC COPY: this DC is at position %d, behind %s's history: copying %s's testing "
            "worker", adopter_len, source, source,
        )  # fmt: skip
        try:
            adoption = await self._import_copy(source, adopter_len, progress)
            adopted = await self.store.AdoptBase(
                store_pb2.AdoptBaseRequest(adoption=adoption), timeout=DC_COPY_TIMEOUT_S
            )
        except (grpc.aio.AioRpcError, CopyRefused) as error:
            reason = (
                f"{error.code().name}: {error.details()}"
                if isinstance(error, grpc.aio.AioRpcError)
                else str(error)
            )
            log.warning(
                "DC COPY from %s failed (%s); tried again in %.0f s at the earliest",
                source, reason, DC_COPY_RETRY_S,
            )  # fmt: skip
            self.dc_copy_after_s = time.monotonic() + DC_COPY_RETRY_S
            self.dc_copy = None
            return
        self.restarting = (
            f"the store adopted {source}'s copy at position {adopted.synced_len}: "
            "restarting onto it"
        )
        log.warning("DC COPY: %s", self.restarting)
        if not self.failed.done():
            self.failed.set_result(self.restarting)

    async def _import_copy(
        self, source: str, adopter_len: int, progress: DcCopyProgress
    ) -> common_pb2.BaseAdoption:
        """Stream ``source``'s copy into this DC's dispatch; the copy's description once
        the testing worker holds it."""
        stub = self._peer_stub(source)
        dispatch = self.dispatch
        if stub is None or dispatch is None:
            raise CopyRefused(f"{source} is not a peer of this DC")
        request = peer_pb2.ExportDcSnapshotRequest(
            adopter=self.config.node_id, adopter_len=adopter_len
        )
        export = stub.ExportDcSnapshot(request, timeout=DC_COPY_TIMEOUT_S)
        described: list[common_pb2.BaseAdoption] = []

        async def chunks() -> AsyncIterator[worker_pb2.ImportDcCopyRequest]:
            async for chunk in export:
                if not described:
                    if not chunk.HasField("adoption"):
                        raise CopyRefused("the copy's first chunk does not describe it")
                    described.append(chunk.adoption)
                    progress.position = chunk.chunk.position
                progress.bytes_done = chunk.chunk.offset + len(chunk.chunk.data)
                progress.bytes_total = chunk.chunk.total_bytes
                yield pass_on(chunk, worker_pb2.ImportDcCopyRequest())

        try:
            imported = await dispatch.ImportDcCopy(chunks(), timeout=DC_COPY_TIMEOUT_S)
        finally:
            export.cancel()
        if not described:
            raise CopyRefused("the copy ended before its first chunk")
        adoption = described[0]
        position = adoption.before.synced_len + 1
        if imported.position != position:
            raise CopyRefused(
                f"the testing worker holds position {imported.position}, the copy was "
                f"described at {position}"
            )
        log.warning(
            "DC COPY: the testing worker holds %s's copy at position %d (%d bytes in %.0f s)",
            source, position, progress.bytes_total, time.monotonic() - progress.started_s,
        )  # fmt: skip
        return adoption
