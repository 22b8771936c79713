"""A deliberately broken simulated coordinator feed: the simulator must catch it.

The coordinator hands the core a local submit from the store's watch only while the
core has room for more local metas (``Coordinator._wait_room_for_local``). The core
never refuses a stamped submit, but it refuses an unstamped one when full, and a submit
whose stamp a counter voided comes back unstamped at the next start, acknowledged
already. This feed steps every hand-over at once, as a coordinator without the wait
would: a restarted node refuses an acknowledged transaction and loses it.
"""

from __future__ import annotations

from txsync.protocol import NodeId
from txsync.sim import Simulation


class NoRoomWaitSimulation(Simulation):
    """Steps every submit the store's watch hands over, room or not."""

    def _feed_locals(self, node: NodeId) -> None:
        sim_node = self._nodes[node]
        while sim_node.locals_waiting and sim_node.shell is not None:
            self._step(node, sim_node.locals_waiting.popleft())
