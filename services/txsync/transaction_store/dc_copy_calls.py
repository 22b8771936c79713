"""A DC started from another DC's copy (docs/dc-snapshots.md): what this store says of a
copy of its testing worker (``export_base``, the source's side) and the new start it
writes when its DC adopts one (``adopt_base``, the adopter's side). The rules are
``step_rules.export_base`` and ``plan_base_adopted``; this part orders the locking and
the files around them. Part of ``TransactionStore`` (``store.py``).
"""

from __future__ import annotations

import logging

from txsync.protocol import TxState
from txsync.telemetry import work
from txsync.transaction_store.retention import COPY_LEASE_MS, take_copy_lease
from txsync.transaction_store.rotation import Rotations
from txsync.transaction_store.step_rules import BaseAdoption, export_base, plan_base_adopted
from txsync.transaction_store.store_core import now_ms

log = logging.getLogger(__name__)


class DcCopyCalls(Rotations):
    adoptions = 0
    """Copies adopted since the store started: a ``PersistSteps`` stream opened before
    one belongs to a core that predates it, and is refused (``service.py``)."""

    def export_base(
        self, position: int, final_state: TxState, adopter: str, adopter_len: int
    ) -> BaseAdoption:
        """What this store says of a copy of its testing worker at ``position`` for
        ``adopter`` (whose synced queue ends at ``adopter_len``), and a lease that keeps
        the positions past it here until ``adopter`` has caught up from them
        (``retention.copy_leases``). Raises ``Refusal``."""
        adoption = export_base(self.state, position, final_state, adopter, adopter_len)
        take_copy_lease(self.progress, adopter, position, now_ms())
        log.warning(
            "DC COPY: %s copies this DC at position %d: truncation keeps what follows it "
            "until %s has caught up (%d min at most, or --peer-hold-max positions)",
            adopter, position, adopter, COPY_LEASE_MS // 60_000,
        )  # fmt: skip
        return adoption

    async def adopt_base(self, adoption: BaseAdoption) -> int:
        """Start this DC at the copy's position Q: one ``BaseAdopted`` entry, durable
        before the answer, then the bodies of what it dropped deleted (as a truncation
        deletes them). Never beside a rotation or a truncation (they take turns on
        ``_one_rotation``). Returns the synced length, Q. Raises ``Refusal``."""
        async with self._one_rotation:
            async with self._lock:
                state = self.state
                entry = plan_base_adopted(state, adoption, now_ms())
                synced_own = {tx_id for _, tx_id in adoption.synced_own}
                dropped = [meta.tx_id for meta in state.synced]
                dropped += [
                    tx_id
                    for tx_id, meta in state.incoming.items()
                    if meta.origin != state.node_id or tx_id in synced_own
                ]
                self._remember_verdicts(dropped)
                staged = self._stage([entry])
                with_files = [tx_id for tx_id in dropped if self._unfiled.pop(tx_id, None) is None]
                for tx_id in dropped:
                    self.body_cache.discard(tx_id)
                self.adoptions += 1
            await self._durable(staged)
            if with_files:
                await work.in_thread(self._delete_bodies, with_files)
        log.warning(
            "DC started from a copy at position %d (%s): %d transactions of its history "
            "and incoming queue dropped, %d own ones found synced",
            adoption.before.synced_len + 1,
            adoption.meta.tx_id,
            len(dropped),
            len(synced_own),
        )
        self._notify()
        return self.state.synced_len
