"""A DC added after its peers truncated starts from a copy of another DC (issue 47,
docs/dc-snapshots.md), with every service a real process: the peer tells it the history
it asks for is gone, its coordinator streams that peer's testing worker into its own
worker through both dispatches, its store adopts the copy's base, and the coordinator
ends to restart onto it (this test restarts it, as Kubernetes or ``dev up`` would).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import Dc, LocalCluster, submit_at, submit_row
from tests.sync_coordinator.test_views import VIEW_ARGS
from txsync.sync_coordinator.coordinator_core import DcCopyProgress
from txsync.sync_coordinator.dc_copies import RESTARTING_EXIT_CODE
from txsync.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    client_pb2,
    client_pb2_grpc,
    common_pb2,
    peer_pb2,
    peer_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

KEEPS_NO_HISTORY = ("--history-kept", "0", "--history-kept-ms", "0")
"""Stores that keep no history beyond what every peer and worker passed."""
PEER_HOLD_MAX = 5
"""Positions a peer down may hold back (``--peer-hold-max``): a DC away for ten
transactions is let go, and starts from a copy when back."""


LOAD_TXS_MAX = 2_000
"""The most rows a DC's client submits while another DC copies and restarts onto its
copy (the load stops when the copy is in, long before that on any machine)."""
LOAD_EVERY_S = 0.02
"""The load's pace: a submit every 20 ms, about 50 transactions/s."""
LOAD_FROM = 1_000
"""The first ``n`` of those rows (apart from the other rows of the same DC)."""


class _UnderLoad(threading.Thread):
    """Rows submitted at a DC one after another, paced, in a thread (started) until
    ``stop``: the load a copy is taken under. ``stop`` says what ended it, if anything
    did, and ``rows`` what it submitted."""

    def __init__(self, dc: Dc, acked: list[str], lock: threading.Lock) -> None:
        super().__init__(name=f"load-{dc.node_id}", daemon=True)
        self._dc, self._acked, self._lock = dc, acked, lock
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self.count = 0
        self.start()

    def run(self) -> None:
        try:
            with grpc.insecure_channel(self._dc.store.address) as channel:
                stub = client_pb2_grpc.ClientServiceStub(channel)
                while self.count < LOAD_TXS_MAX and not self._stopping.wait(LOAD_EVERY_S):
                    tx_id = submit_row(stub, self._dc, LOAD_FROM + self.count)
                    with self._lock:
                        self._acked.append(tx_id)
                    self.count += 1
        except BaseException as error:  # raised again by stop, in the test's thread
            self._error = error

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=60)
        assert not self.is_alive(), f"{self.name}: a submit hangs"
        if self._error is not None:
            raise AssertionError(f"{self.name} failed after {self.count} rows") from self._error
        assert self.count, f"{self.name} submitted nothing"

    def rows(self) -> list[tuple[str, int]]:
        return [(self._dc.node_id, LOAD_FROM + n) for n in range(self.count)]


def _submit(dc: Dc, sql: str) -> str:
    body = common_pb2.TxBody(statements=[common_pb2.Statement(sql=sql)])
    with grpc.insecure_channel(dc.store.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        return str(stub.Submit(client_pb2.SubmitRequest(body=body), timeout=10).tx_id)


def _history_from(dc: Dc) -> int:
    """Truncate what the store may, and say where its history starts now."""
    with grpc.insecure_channel(dc.store.address) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        admin.TruncateLog(admin_pb2.TruncateLogRequest(), timeout=30)
        status = admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).local
    return int(status.retention.history_from)


def _worker_at(dc: Dc) -> tuple[int, bytes]:
    """Where the DC's worker stands: its position and state digest."""
    assert dc.worker is not None
    with grpc.insecure_channel(dc.worker.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        beat = stub.Heartbeat(worker_pb2.HeartbeatRequest(), timeout=5)
    return int(beat.position), bytes(beat.state_digest)


def _rows(dc: Dc) -> list[tuple[str, int]] | None:
    """The rows of ``t`` at ``dc``; None while it has no such table, or no worker fit."""
    statement = common_pb2.Statement(sql="SELECT dc, n FROM t ORDER BY dc, n")
    with grpc.insecure_channel(dc.store.address) as channel:
        stub = client_pb2_grpc.ClientServiceStub(channel)
        try:
            answer = stub.Query(
                client_pb2.QueryRequest(statement=statement, max_rows=10_000), timeout=10
            )
        except grpc.RpcError:
            return None
    return [(row.values[0].text_value, row.values[1].int_value) for row in answer.rows]


def _store_status(dc: Dc) -> admin_pb2.DcStatus:
    with grpc.insecure_channel(dc.store.address) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        return admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).local


COPY_PACE = 64 * 1024
"""``--dc-copy-bytes-per-s`` of ``test_a_dc_behind_its_peers_history_starts_from_a_copy``:
slow enough that a copy of the test's databases (some tens of KiB) takes measurably long."""

SENT = re.compile(r"DC COPY: sent (\S+) (\d+) bytes in ([0-9.]+) s \(at most (\d+) bytes/s")


def _each_copy_was_paced(cluster: LocalCluster, copies: int) -> None:
    """Every copy a source sent took at least its bytes at the pace it was given: a lower
    bound, which a busy machine only makes easier to meet."""
    sent = [m for dc in cluster.dcs for m in SENT.finditer(dc.coordinator.log())]
    assert len(sent) >= copies, [m.group(0) for m in sent]  # a copy may be tried again
    for match in sent:
        sent_bytes, seconds, pace = int(match[2]), float(match[3]), int(match[4])
        assert pace == COPY_PACE, match.group(0)
        # The log rounds to 10 ms.
        assert sent_bytes > 0 and seconds + 0.005 >= sent_bytes / pace, match.group(0)


def _restarted_onto_a_copy(cluster: LocalCluster, dc: Dc) -> None:
    """Wait for ``dc``'s coordinator to adopt a copy and end, then start it again, as its
    supervisor (Kubernetes, ``dev up``) does."""
    coordinator = dc.coordinator
    cluster.wait_for(
        f"{dc.node_id} adopted a copy and ended to restart onto it",
        lambda: coordinator.process is not None and coordinator.process.poll() is not None,
        timeout_s=180,
    )
    assert coordinator.process is not None
    assert coordinator.process.returncode == RESTARTING_EXIT_CODE, coordinator.log()
    assert "DC COPY: the store adopted" in coordinator.log()
    coordinator.start()


def _converged(cluster: LocalCluster, expected: list[tuple[str, int]], how: str) -> None:
    """Wait for every DC to hold exactly the ``expected`` rows (``how``: how the last
    of them came), then for every DC's worker at one position with one digest."""
    cluster.wait_for(
        f"every DC applied every row, {how}",
        lambda: all(_rows(dc) == expected for dc in cluster.dcs),
        timeout_s=180,
    )
    cluster.wait_for(
        "every DC's worker at the same position with the same digest",
        lambda: len({_worker_at(dc) for dc in cluster.dcs}) == 1,
    )
    # The DC that adopted a copy knows its verdict at the copy's position but not the
    # digest there, which the others compared as a difference: a DIVERGENCE alarm at
    # every DC for good (found by `bench.soak --dc-down-s`).
    for dc in cluster.dcs:
        with grpc.insecure_channel(dc.coordinator.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            alarms = admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).local.alarms
        assert not any("DIVERGENCE" in alarm for alarm in alarms), (dc.node_id, alarms)


def test_a_dc_behind_its_peers_history_starts_from_a_copy(tmp_path: Path) -> None:
    """Two ways to be behind every peer's history: dc4 added after the others truncated
    (it replays from position 1), then dc3 down while they went on, past
    ``--peer-hold-max``: its peers let it go, truncate past it, and send it to a copy
    when it is back. dc1 is restarted whole while dc3 is down, leaving dc2 and dc4
    without a majority of four for a moment. Its coordinator then dialled only its
    --peer flags, not dc4 (added by a membership entry), until a view was installed:
    when dc2 and dc4 installed none, dc1 stayed in VIEW_CHANGE for good, two runs in
    five (docs/operations.md, "Restarting a DC while another is down"). The test checks
    that dc1 dials dc4 before it starts in a view, which fails without the fix on every
    run."""
    names = ["dc1", "dc2", "dc3", "dc4"]
    hold = ("--peer-hold-max", str(PEER_HOLD_MAX))
    cluster = LocalCluster(
        tmp_path,
        4,
        coordinator_args=(*VIEW_ARGS, "--dc-copy-bytes-per-s", str(COPY_PACE)),
        names=names,
        joining=frozenset({"dc4"}),
        workers=True,
        store_args={name: (*KEEPS_NO_HISTORY, *hold) for name in names},
    )
    try:
        dc1, dc2, dc3, dc4 = cluster.dcs
        lock = threading.Lock()
        acked: list[str] = [_submit(dc1, "CREATE TABLE t (dc TEXT, n INTEGER)")]
        submit_at(dc1, 20, acked, lock)
        submit_at(dc2, 20, acked, lock)
        members = [dc1, dc2, dc3]
        cluster.wait_for(
            "every member truncated the start of its history",
            lambda: all(_history_from(dc) > 2 for dc in members),
        )
        # Refused before this issue: no DC could start past its peers' truncation.
        # dc2's clients keep submitting while dc4 is added, copies and restarts.
        loading = _UnderLoad(dc2, acked, lock)
        add = peer_pb2.Member(node_id="dc4", url=f"127.0.0.1:{cluster.ports['dc4']}")
        with grpc.insecure_channel(dc1.store.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            admin.ChangeMembership(admin_pb2.ChangeMembershipRequest(add=add), timeout=10)

        _restarted_onto_a_copy(cluster, dc4)
        loading.stop()

        submit_at(dc4, 5, acked, lock)
        submit_at(dc3, 5, acked, lock)
        expected = sorted(
            [("dc1", n) for n in range(20)]
            + [("dc2", n) for n in range(20)]
            + loading.rows()
            + [("dc3", n) for n in range(5)]
            + [("dc4", n) for n in range(5)]
        )
        _converged(cluster, expected, "dc4 its own after the copy")
        position, _ = _worker_at(dc4)
        assert position == 1 + 20 + 20 + loading.count + 1 + 5 + 5  # the table, rows, dc4's add
        assert _history_from(dc4) > 2, "dc4 holds no history from before its copy"

        for process in dc3.processes:  # the whole DC down
            assert process.terminate() == 0, process.log()
        submit_at(dc1, 3, acked, lock)  # not past the bound yet
        cluster.wait_for(
            "dc1, dc2 and dc4 ordered and applied them without dc3",
            lambda: all(_worker_at(dc)[0] == position + 3 for dc in (dc1, dc2, dc4)),
        )
        # dc1 restarted whole while dc3 is away, before letting it go: its new
        # coordinator never hears from dc3, and names it at the length its store
        # recorded. Before, it reported dc3 at 0, and dc1 held every transaction from
        # then on (`bench.soak --dc-down-s`: 73,288 transactions, 250 MiB).
        for process in dc1.processes:
            assert process.terminate() == 0, process.log()
        before_restart = len(dc1.coordinator.log())
        for process in reversed(dc1.processes):
            process.start()
        submit_at(dc1, 7, acked, lock)
        # Whatever view dc2 and dc4 install, dc1 dials dc4 (in no --peer flag of its)
        # as it starts, before it takes part in any view: the stall's cause, checked
        # on every run, not only on the runs where it would stall.
        restarted = dc1.coordinator.log()[before_restart:]
        started = restarted.index(" starts in view ")
        assert "MEMBERSHIP: dc4 added" in restarted[:started], restarted[:started]
        others = [dc1, dc2, dc4]
        cluster.wait_for(
            "dc3's peers, dc1 restarted among them, let it go and truncated past it",
            lambda: all(_history_from(dc) > position + 1 for dc in others),
        )
        said = _store_status(dc1).warnings
        assert any(w.startswith("LET GO: peer dc3 is at") for w in said), said
        loading = _UnderLoad(dc2, acked, lock)  # while dc3 copies and restarts
        for process in reversed(dc3.processes):
            process.start()
        _restarted_onto_a_copy(cluster, dc3)
        loading.stop()
        submit_at(dc3, 3, acked, lock)
        expected = sorted(
            expected
            + [("dc1", n) for n in range(3)]
            + [("dc1", n) for n in range(7)]
            + loading.rows()
            + [("dc3", n) for n in range(3)]
        )
        _converged(cluster, expected, "dc3 what it missed from its copy")
        assert not any(w.startswith("LET GO") for w in _store_status(dc1).warnings)
        _each_copy_was_paced(cluster, copies=2)
        # Each went on from its one copy: the source kept what followed it (the copy's
        # lease), although every DC truncates each second under this load and a copy
        # at this pace takes longer.
        for copied in (dc3, dc4):
            assert copied.coordinator.log().count("DC COPY: the store adopted") == 1
    finally:
        cluster.stop()


def test_a_copy_not_as_described_is_refused_and_only_a_peer_may_ask_for_one(
    tmp_path: Path,
) -> None:
    """The importing dispatch checks the copy against its description (the id at its
    position) before the worker takes it, and the worker keeps its database; a copy is
    exported only to a configured peer naming itself."""
    cluster = LocalCluster(tmp_path, 2, coordinator_args=VIEW_ARGS, workers=True)
    try:
        dc1, dc2 = cluster.dcs
        created = _submit(dc1, "CREATE TABLE t (dc TEXT, n INTEGER)")
        submit_at(dc1, 3, [created], threading.Lock())
        cluster.wait_for("dc1 applied all four", lambda: _worker_at(dc1)[0] == 4)
        cluster.wait_for("dc2 applied all four", lambda: _worker_at(dc2)[0] == 4)
        before = _worker_at(dc2)

        assert dc1.dispatch is not None and dc2.dispatch is not None
        with grpc.insecure_channel(dc1.dispatch.address) as channel:
            source = worker_pb2_grpc.DispatchServiceStub(channel)
            request = worker_pb2.ExportDcCopyRequest(adopter="dc2", adopter_len=0)
            chunks = list(source.ExportDcCopy(request, timeout=60))
        assert chunks[0].adoption.before.synced_len + 1 == chunks[0].chunk.position == 4
        tampered = [worker_pb2.ImportDcCopyRequest(chunk=c.chunk) for c in chunks]
        tampered[0].adoption.CopyFrom(chunks[0].adoption)
        tampered[0].adoption.meta.tx_id = created  # the id at position 1, not 4
        with grpc.insecure_channel(dc2.dispatch.address) as channel:
            target = worker_pb2_grpc.DispatchServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                target.ImportDcCopy(iter(tampered), timeout=60)
        error: grpc.Call = refused.value  # type: ignore[assignment]
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "its description names" in (error.details() or "")
        assert _worker_at(dc2) == before

        with grpc.insecure_channel(dc1.coordinator.address) as channel:
            peer = peer_pb2_grpc.PeerServiceStub(channel)
            asked = peer.ExportDcSnapshot(peer_pb2.ExportDcSnapshotRequest(adopter="dc9"))
            with pytest.raises(grpc.RpcError) as denied:
                list(asked)
        error = denied.value  # type: ignore[assignment]
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED, error.details()
    finally:
        cluster.stop()


def test_a_copy_on_its_way_reads_as_a_warning() -> None:
    """What ``txsync status`` shows for the DC while the copy runs (``GetStatus``'s
    warnings): its source, its position once the first chunk came, and how far it is."""
    progress = DcCopyProgress("dc1", started_s=100.0)
    assert progress.describe(103.0) == (
        "COPYING: this DC is behind its peers' history and starts from dc1's copy: "
        "0.0 of 0.0 MiB after 3 s"
    )
    progress.position, progress.bytes_done, progress.bytes_total = 42, 3 * 2**20, 12 * 2**20
    assert progress.describe(160.4).endswith(
        "dc1's copy at position 42: 3.0 of 12.0 MiB after 60 s"
    )


SLOW_COPY_PACE = 1024
"""``--dc-copy-bytes-per-s`` of the lease's test: a copy of its databases (tens of KiB)
takes more than half a minute, far longer than its peers take to let the copying DC go
and truncate past the copy's position."""

COPIES = re.compile(r"DC COPY: dc3 copies this DC at position (\d+)")


def test_the_others_go_on_while_a_dc_copies_and_keep_what_follows_its_copy(
    tmp_path: Path,
) -> None:
    """dc3, let go while down, copies a peer at a crawl. It stays out of the protocol
    meanwhile, so dc1 and dc2 order and apply without it: before, it stayed in the view
    posting at its old base, and every round ended empty until it restarted onto its
    copy. They let it go again, silent, and are made to truncate all they may; the
    source keeps what follows the copy's position for it (the copy's lease), so that
    dc3 goes on from its one copy. Without the lease the source truncated past the copy
    as it travelled, and dc3 needed another, for ever at a pace that slow."""
    names = ["dc1", "dc2", "dc3"]
    hold = ("--peer-hold-max", str(PEER_HOLD_MAX))
    cluster = LocalCluster(
        tmp_path,
        3,
        coordinator_args=(*VIEW_ARGS, "--dc-copy-bytes-per-s", str(SLOW_COPY_PACE)),
        names=names,
        workers=True,
        store_args={name: (*KEEPS_NO_HISTORY, *hold) for name in names},
    )
    try:
        dc1, dc2, dc3 = cluster.dcs
        lock = threading.Lock()
        acked: list[str] = [_submit(dc1, "CREATE TABLE t (dc TEXT, n INTEGER)")]
        submit_at(dc1, 5, acked, lock)
        cluster.wait_for("every DC applied all six", lambda: all(
            _worker_at(dc)[0] == 6 for dc in cluster.dcs
        ))  # fmt: skip
        for process in dc3.processes:
            assert process.terminate() == 0, process.log()
        submit_at(dc2, 3 * PEER_HOLD_MAX, acked, lock)
        cluster.wait_for(
            "dc1 and dc2 let dc3 go and truncated past it",
            lambda: all(_history_from(dc) > 7 for dc in (dc1, dc2)),
        )
        for process in reversed(dc3.processes):
            process.start()
        cluster.wait_for(
            "a peer began to send dc3 a copy",
            lambda: any(COPIES.search(dc.store.log()) for dc in (dc1, dc2)),
        )
        source = next(dc for dc in (dc1, dc2) if COPIES.search(dc.store.log()))
        match = COPIES.search(source.store.log())
        assert match is not None
        position = int(match[1])
        submit_at(dc1, 2, acked, lock)  # fewer than --peer-hold-max: the lease holds
        submit_at(dc2, 2, acked, lock)
        end = 6 + 3 * PEER_HOLD_MAX + 4
        cluster.wait_for(
            "dc1 and dc2 ordered and applied without dc3, copying",
            lambda: all(_worker_at(dc)[0] == end for dc in (dc1, dc2)),
        )
        cluster.wait_for(
            "the source let dc3 go, silent while it copies",
            lambda: any(w.startswith("LET GO: peer dc3") for w in _store_status(source).warnings),
        )
        history_from = _history_from(source)  # truncates all it may
        assert f"DC COPY: sent {dc3.node_id}" not in source.coordinator.log(), (
            "the copy arrived before the checks of its lease: the pace is too fast for them"
        )
        assert history_from <= position + 1, (history_from, position)
        held_by = _store_status(source).retention.held_by
        assert held_by.startswith("a copy for dc3 at"), held_by
        _restarted_onto_a_copy(cluster, dc3)
        expected = sorted(
            [("dc1", n) for n in range(5)]
            + [("dc2", n) for n in range(3 * PEER_HOLD_MAX)]
            + [("dc1", n) for n in range(2)]
            + [("dc2", n) for n in range(2)]
        )
        _converged(cluster, expected, "dc3 the rest from its copy's source")
        assert dc3.coordinator.log().count("DC COPY: the store adopted") == 1
        cluster.wait_for(
            "the source ended the lease, dc3 holding truncation as a peer",
            lambda: "the lease for dc3's copy" in source.store.log(),
        )
    finally:
        cluster.stop()
