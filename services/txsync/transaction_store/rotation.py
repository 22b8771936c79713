"""The transaction-store's history kept bounded: progress reports from the coordinator
(the peers) and dispatch (the workers), truncation in place, and rotation of the txlog's
current file (docs/transaction-store.md, "Rotation and truncation"). What may go is
decided by ``retention.truncation_hold``, a pure function. Part of ``TransactionStore``
(``store.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence

from txsync.refusals import Refusal, Refused
from txsync.telemetry import work
from txsync.telemetry.logs import event as log_event
from txsync.transaction_store.retention import (
    CarriedBodies,
    TruncationHold,
    Verdict,
    carried_entries,
    live_copy_leases,
    peers_ordered,
    split_by_budget,
    truncation_hold,
    within_core,
)
from txsync.transaction_store.state import FINAL_STATES, PreparedForms
from txsync.transaction_store.store_core import StoreCore, now_ms

log = logging.getLogger(__name__)


class Rotations(StoreCore):
    """Progress reports, truncation in place and rotation."""

    def _start_rotation(self) -> None:
        self._rotating = True
        # Keep a strong reference: the loop holds tasks only weakly.
        self._rotation = asyncio.get_running_loop().create_task(self._rotate_in_background())

    def report_progress(
        self,
        peers: dict[str, int],
        workers_min: int | None,
        *,
        peers_reported: bool = False,
        core_history_len: int | None = None,
        peers_ordered: dict[str, int] | None = None,
        peers_posted: dict[str, int] | None = None,
    ) -> int:
        """Take a report: the coordinator's (``peers_reported``: every peer of the
        configuration, replacing the last report, so a removed peer holds nothing back;
        ``core_history_len``: where its core serves catch-up from memory;
        ``peers_ordered``: how far each peer's order came, bodies held or not, for those
        it may let go; ``peers_posted``: the same for every peer heard from) or the
        dispatch's (the lowest applied position among the DC's workers)."""
        progress = self.progress
        if core_history_len is not None:
            progress.core_history_len = core_history_len
        if peers_reported:
            progress.peer_synced_len = dict(peers)
            progress.peer_ordered_len = dict(peers_ordered or {})
            progress.peer_posted_len = dict(peers_posted or {})
            progress.peers_reported = True
        else:
            progress.peer_synced_len.update(peers)
        if workers_min is not None:
            progress.workers_min_position = workers_min
        self._end_copy_leases()
        # What the others allow: the coordinator's core hears it from this answer, and
        # the store truncates that far once the core's next report says it heard.
        hold = self.truncation_hold(with_core=False)
        progress.allowed_through = hold.below - 1 if hold.below else 0
        self._say_let_go(hold)
        self._truncate_soon(within_core(hold.below, progress.core_history_len))
        return hold.below

    def _end_copy_leases(self) -> None:
        """Drop the copy leases that hold nothing any more, saying so."""
        progress = self.progress
        if not progress.copy_leases:
            return
        end = self.state.synced_len
        live = live_copy_leases(progress, end, now_ms(), self.config.peer_hold_max)
        for adopter in sorted(set(progress.copy_leases) - set(live)):
            synced = progress.peer_synced_len.get(adopter, 0)
            log.warning(
                "DC COPY: the lease for %s's copy at %d ended (%s at %d, the synced end %d)",
                adopter, progress.copy_leases[adopter].position, adopter, synced, end,
            )  # fmt: skip
        progress.copy_leases = live

    def _say_let_go(self, hold: TruncationHold) -> None:
        """Log each peer the first report finds past ``--peer-hold-max``."""
        let_go = frozenset(peer for peer, _ in hold.let_go)
        end = self.state.synced_len
        for peer, length in hold.let_go:
            if peer not in self.progress.let_go:
                log.warning(
                    "%s is at %d, %d positions behind, past --peer-hold-max (%d): "
                    "truncation waits for it no longer; it starts from another DC's "
                    "copy when back",
                    peer, length, end - length, self.config.peer_hold_max,
                )  # fmt: skip
        self.progress.let_go = let_go

    def _truncate_soon(self, below_position: int) -> None:
        """Truncate in place once at least ``TRUNCATION_STEP`` positions more may go: a
        store that waited for its next rotation held everything its current file covers
        (about 50,000 small transactions at 16 MiB), so its memory followed the history
        until then (issue 47: RSS 1.55x between 28,669 and 347,212 transactions of
        history). Never while a rotation runs: it truncates too, and takes turns."""
        if (
            self._truncation is not None
            or self._rotating
            or self._one_rotation.locked()
            or self._closing.is_set()
            or below_position - 1 - self.state.synced_offset < TRUNCATION_STEP
        ):
            return
        self._truncation = asyncio.get_running_loop().create_task(self._truncate_in_background())

    async def _truncate_in_background(self) -> None:
        try:
            await self.truncate_in_place()
        except Exception:
            if not self._closing.is_set():
                log.exception("truncation in place failed; the next rotation truncates")
        finally:
            self._truncation = None

    def _remember_verdicts(self, dropped: Sequence[str]) -> None:
        """Keep the verdicts of transactions about to be truncated (``truncated_verdicts``)."""
        verdicts, txs = self.truncated_verdicts, self.state.txs
        for tx_id in dropped:
            record = txs.get(tx_id)
            if record is not None and record.state in FINAL_STATES:
                verdicts[tx_id] = Verdict.of(record.state, record.outcome)
        while len(verdicts) > TRUNCATED_VERDICTS_KEPT:
            verdicts.popitem(last=False)

    async def truncate_in_place(self) -> int:
        """Drop the history the reports allow from memory, by a ``truncated`` entry in
        the current file (replayed at start-up), without a rotation: the file's bytes go
        at the next rotation, as before. Returns the transactions dropped."""
        async with self._one_rotation:
            async with self._lock:
                dropped = self.state.truncation_cut(self.truncatable_below())
                if not dropped:
                    return 0
                self._remember_verdicts(dropped)
                truncated = self.state.truncated_entry(
                    dropped,
                    self.progress.peer_synced_len,
                    peers_ordered(self.state, self.progress),
                )
                staged = self._stage([self._entry(truncated=truncated)])
                # A body out of the current file's entries was filed by an earlier rotation.
                with_files = [tx_id for tx_id in dropped if self._unfiled.pop(tx_id, None) is None]
                for tx_id in dropped:
                    self.body_cache.discard(tx_id)
            await self._durable(staged)
            if with_files:
                await work.in_thread(self._delete_bodies, with_files)
        self.progress.truncated_total += len(dropped)
        self.progress.truncated_in_place += len(dropped)
        return len(dropped)

    def truncatable_below(self) -> int:
        """Synced positions below this one may be truncated (0: none)."""
        return self.truncation_hold().below

    def truncation_hold(self, *, with_core: bool = True) -> TruncationHold:
        """How far truncation may go now, and what holds it (``retention``);
        ``with_core`` False: leaving out where the coordinator's core serves catch-up."""
        config = self.config
        progress = self.progress
        if not with_core:
            progress = dataclasses.replace(progress, core_history_len=None)
        return truncation_hold(
            self.state,
            progress,
            witness=config.witness,
            history_kept=config.history_kept,
            history_kept_ms=config.history_kept_ms,
            first_unfinished=self.first_unfinished_position(),
            now_ms=now_ms(),
            peer_hold_max=config.peer_hold_max,
        )

    async def truncate(self, below_position: int = 0) -> tuple[int, list[str]]:
        """Rotate the log, dropping synced history below ``below_position`` (0: as far as
        allowed). Returns the number of transactions dropped and the bak- files made."""
        allowed = self.truncatable_below()
        if below_position == 0:
            below_position = allowed
        elif below_position > allowed:
            raise Refusal(
                Refused.PRECONDITION,
                f"cannot truncate below {below_position}: peers and workers have only passed "
                f"position {max(allowed - 1, 0)}",
            )
        return await self._rotate(below_position)

    async def _rotate(self, below_position: int) -> tuple[int, list[str]]:
        async with self._one_rotation:
            return await self._rotate_alone(below_position)

    async def _rotate_alone(self, below_position: int) -> tuple[int, list[str]]:
        # The snapshot carries no bodies, so the bodies of the transactions it keeps
        # must be in durable files before the current log is retired: most of them
        # filed outside the lock (those that look kept now), the rest inside it.
        # After a long partition that is every body since the last rotation (tens of
        # seconds of file creation and fsyncs): a shutdown must not wait for that.
        #
        # Most kept bodies are not filed at all: up to ``_carry_budget`` bytes of them
        # are carried into the new file, after its snapshot, in a few large sequential
        # writes and one fsync. Filing cost a file create and fsync each, and a rotation
        # that kept the bodies the workers had not reached yet (a few thousand under a
        # burst) held the lock for seconds: long enough for the peers to exclude the DC.
        started = time.monotonic()
        budget = self._carry_budget()
        # Filing outside the lock goes again over what was staged while it filed, so
        # that little is left to file under the lock (bench.rotation_stall: 3,232
        # bodies filed there held every submit 4.3 s), as long as each pass has at
        # most half the last one's to file. Submits that outrun the filing (a storm of
        # batches) would make every pass longer than the last: what the first pass
        # leaves is filed under the lock, holding them back.
        #
        # Kept bodies go by id, not as (id, body) pairs: thousands of pairs made in a
        # burst outlive it in CPython's free list and pin the pools they were spread
        # over (issue 47: a rotation under load set a store's high-water mark). The
        # bodies stay in ``_unfiled`` meanwhile: only what takes ``_one_rotation``
        # (a truncation, a copy's adoption) takes one out, and the commit below
        # replaces the dict: ``unfiled`` is the current file's until then.
        early: list[tuple[str, bytes]] = []
        filed_early: set[str] = set()
        last_pass: int | None = None
        unfiled = self._unfiled
        for _ in range(EARLY_FILING_PASSES):
            kept = [t for t in self._unfiled_kept(below_position) if t not in filed_early]
            _, to_file_ids = split_by_budget(kept, unfiled, budget)
            if last_pass is not None and (
                len(to_file_ids) <= FILED_UNDER_THE_LOCK_MOST or len(to_file_ids) > last_pass // 2
            ):
                break  # the first pass always files (a shutdown can stop it there)
            to_file = [(tx_id, unfiled[tx_id]) for tx_id in to_file_ids]
            if not await work.in_thread(self.bodies.file_many, to_file, self._closing.is_set):
                raise Refusal(Refused.UNAVAILABLE, "the store is shutting down")
            early += to_file
            filed_early.update(to_file_ids)
            last_pass = len(to_file)
        # The snapshot form of the records it keeps is built in a thread before it
        # takes the lock, into one buffer (rebuilt under the lock only if they changed
        # meanwhile; 16,000: 0.4 s of an idle core). The entries of the bodies it carries are
        # encoded as the new file is written, outside the lock too (``CarriedBodies``).
        prepared: PreparedForms | None = await work.in_thread(
            self.state.prepare_snapshot, self.state.kept_records(below_position)
        )
        # The lock is taken twice, briefly: to take the snapshot (the state as the
        # current file holds it up to its end), and, once the new file is written and
        # synced outside it, to copy on what was appended meanwhile and switch files.
        # Holding it across the write stalled every submit for the new file's fsync
        # (issue 47: submit p99 1.7-1.8x the steady p99 in the windows with a rotation).
        async with self._lock:
            locked = time.monotonic()
            await self._writer.flush()
            entries_covered = self._appended_entries  # what the new file's snapshot holds
            snapshot, dropped = self.state.snapshot(
                below_position,
                self.progress.peer_synced_len,
                peers_ordered(self.state, self.progress),
                prepared,
            )
            prepared = None  # its forms are copied into the snapshot's buffer
            gone = set(dropped)
            kept_unfiled = [t for t in unfiled if t not in gone and t not in filed_early]
            carried, late_ids = split_by_budget(kept_unfiled, unfiled, budget)
            # Staged since the early filing: few, unless submits outrun the filing (a
            # storm of batches); then filed here, holding the submits back, or the
            # filing outside the lock would never catch up with them.
            late = [(tx_id, unfiled[tx_id]) for tx_id in late_ids]
            await work.in_thread(self.bodies.file_many, late)
            carried_bodies = CarriedBodies.of(carried, unfiled, self.state.txs)
            self._remember_verdicts(dropped)
            self.state.drop_truncated(snapshot, dropped)
            in_old_file = set(self._unfiled)
            covered = (self.files.current, self.files.current_bytes)
            snapshot_locked_s = time.monotonic() - locked
        try:
            at_ms = now_ms()
            entries = carried_entries(carried_bodies, at_ms)
            rotation = await work.in_thread(
                self.files.prepare_rotation, snapshot, covered, at_ms, entries
            )
        except BaseException:
            # Nothing changed for recovery (a .tmp file is never read): the current
            # file still holds the dropped transactions, and the next rotation, or the
            # first after a restart, truncates them.
            log.warning(
                "txlog rotation abandoned before its commit",
                extra=log_event("txlog.rotation_abandoned"),
            )
            raise
        async with self._lock:
            locked = time.monotonic()
            try:
                await self._writer.flush()
                backups = await work.in_thread(self.files.commit_rotation, rotation)
            except BaseException:
                self.files.discard_rotation(rotation)
                raise
            self._appended_entries -= entries_covered  # the copied tail's stay counted
            # Bodies staged since the snapshot are in the copied tail: still unfiled.
            carried_on = {tx_id: unfiled[tx_id] for tx_id in carried}
            carried_on.update((t, e) for t, e in unfiled.items() if t not in in_old_file)
            self._unfiled = carried_on
            commit_locked_s = time.monotonic() - locked
        for tx_id, encoded in (*early, *late):
            record = self.state.txs.get(tx_id)
            if record is not None and record.state not in FINAL_STATES:
                self.body_cache.put(tx_id, encoded)  # likely read again
        # A dropped transaction has a file if an earlier rotation kept it, or if this
        # one filed it early; the others never had one.
        with_files = [tx_id for tx_id in dropped if tx_id not in unfiled or tx_id in filed_early]
        if with_files:
            await work.in_thread(self._delete_bodies, with_files)
        deleted = await work.in_thread(self.files.delete_backups, self.config.backups_kept)
        self.progress.truncated_total += len(dropped)
        self.progress.last_rotation_ms = now_ms()
        log.info(
            "txlog rotated in %.0f ms (lock held %.0f ms: %.0f for the snapshot, %.0f for "
            "the commit): %d transactions truncated, %d kept, %d bodies carried, %d filed, "
            "%s (%d old bak- deleted)",
            (time.monotonic() - started) * 1000,
            (snapshot_locked_s + commit_locked_s) * 1000,
            snapshot_locked_s * 1000,
            commit_locked_s * 1000,
            len(dropped),
            len(self.state.txs),
            len(carried),
            len(early) + len(late),
            backups,
            len(deleted),
            extra=log_event("txlog.rotated", truncated=len(dropped), kept=len(self.state.txs)),
        )
        return len(dropped), backups

    def _carry_budget(self) -> int:
        """Bytes of kept bodies a rotation carries into the new file; past it they are
        filed (once: a filed body stays filed). Half a file: a long partition's bodies
        are not rewritten at every rotation."""
        return self.config.log_file_bytes_max // 2

    def _unfiled_kept(self, below_position: int) -> list[str]:
        """The unfiled bodies a rotation below ``below_position`` would keep, as far as
        can be told outside the lock (the synced queue may grow meanwhile)."""
        txs = self.state.txs
        kept: list[str] = []
        for tx_id in self._unfiled:
            record = txs.get(tx_id)
            if record is None or not 0 < record.position < below_position:
                kept.append(tx_id)
        return kept

    async def _rotate_in_background(self) -> None:
        try:
            await self._rotate(self.truncatable_below())
        except Exception:
            if self._closing.is_set():
                log.info(
                    "txlog rotation abandoned: shutting down",
                    extra=log_event("txlog.rotation_abandoned"),
                )
            else:
                log.exception(
                    "txlog rotation failed; the current file keeps growing",
                    extra=log_event("txlog.rotation_abandoned"),
                )
        finally:
            self._rotating = False


TRUNCATED_VERDICTS_KEPT = 16_384
"""Truncated transactions whose verdict a wait still finds: about 4 MB, flat (the
records themselves took about 3 KB each). Tens of seconds at the highest rates, on top
of ``--history-kept-ms``: a client waiting on a batch's submits one after another took
longer than that to reach the last ones (the soak's loaders timed out)."""


TRUNCATION_STEP = 256
"""Positions that may go beyond what is truncated before the store truncates in place:
one small entry per step (at most one per progress report, four a second)."""


EARLY_FILING_PASSES = 4
"""Passes of a rotation's body filing outside the store's lock (``_rotate_alone``)."""


FILED_UNDER_THE_LOCK_MOST = 64
"""Bodies left to file after the first pass that end the passes: few enough to file
under the lock."""
