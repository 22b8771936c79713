"""The sync-coordinator: the protocol core's shell over gRPC, in parts by job.

- ``coordinator_core``: the loop that owns the core inside the pure ``Shell``, the
  bounded event queue, and the store's ``PersistSteps`` stream (writes in the shell's
  order, sends released once durable);
- ``peer_traffic``: sends on the peers' links, body pushes and fetches, catch-up from
  the txlog, links that follow the configuration;
- ``store_followers``: the store's streams of local submits, membership entries and
  finished transactions;
- ``coordinator_status``: the admin API's snapshot, lag, and the peers' progress
  reported to the store;
- ``dc_copies``: a DC behind its peers' history starts from a copy of another DC.

The parts are one object (they share the loop's state), joined here.
"""

from __future__ import annotations

from txsync.sync_coordinator.coordinator_core import CoordinatorConfig
from txsync.sync_coordinator.coordinator_status import (
    CoordinatorSnapshot,
    CoordinatorStatus,
    PeerSnapshot,
)
from txsync.sync_coordinator.dc_copies import DcCopies
from txsync.sync_coordinator.peer_traffic import PeerTraffic
from txsync.sync_coordinator.store_followers import StoreFollowers

__all__ = ["Coordinator", "CoordinatorConfig", "CoordinatorSnapshot", "PeerSnapshot"]


class Coordinator(PeerTraffic, StoreFollowers, CoordinatorStatus, DcCopies):
    """One DC's sync-coordinator (``coordinator_core.CoordinatorCore`` and its parts)."""
