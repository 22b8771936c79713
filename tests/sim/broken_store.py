"""A deliberately broken simulated store: the simulator must catch it.

The store's replay rule for stamped submits (docs/protocol.md, "The submit's counter,
stamped by the store") voids a stamp at or below a counter the coordinator wrote before
it had stepped the submit. This store keeps every stamp, as a store that skipped the
rule would: after a crash in the wrong moment its node holds a transaction at a
timestamp below a counter it already posted without it.
"""

from __future__ import annotations

from txsync.protocol import NodeId
from txsync.sim import Simulation
from txsync.sync_coordinator.effects import MergedPersist


class KeepsVoidStampsSimulation(Simulation):
    """Settles every stamp a counter write reaches, and voids none."""

    def _settle_stamps(self, node: NodeId, merged: MergedPersist) -> None:
        stamps = self._nodes[node].durable.stamps
        for tx_id, (stamp, local_seq) in list(stamps.items()):
            if merged.local_seq >= local_seq or merged.counter >= stamp:
                del stamps[tx_id]
