"""The transaction-store's logic, independent of gRPC plumbing (``service.py``): one
``TransactionStore`` per DC, made of one part per kind of caller, each in a module of
its own, all working on the same state (``store_core.StoreCore``):

- ``store_core``: the state, the one way to change it (staged under the lock, answered
  once durable) and what the log holds of it; reading bodies back.
- ``client_calls``: submits, reads, waits and pages for clients and the admin API.
- ``coordinator_calls``: the sync-coordinator's protocol steps, bodies, catch-up reads
  and local submits.
- ``dispatch_calls``: worker-dispatch's stream of enqueued positions and its verdicts.
- ``rotation``: progress reports, truncation in place and rotation of the txlog.
- ``dc_copy_calls``: a copy of a worker described for another DC, and a copy adopted
  (docs/dc-snapshots.md).

Parts of one class rather than objects passing the state around: every part takes the
same lock and stages through the same writer, and a call of one part (a membership
change's submit, a rotation's trigger at the end of a write) is a plain method call.
The rules themselves are pure functions outside (``step_rules``, ``retention``,
``state``); what stays here is the order of locking, staging and waiting around them.
"""

from __future__ import annotations

from txsync.transaction_store.client_calls import ClientCalls, Submitted
from txsync.transaction_store.coordinator_calls import CoordinatorCalls, StagedStep
from txsync.transaction_store.dc_copy_calls import DcCopyCalls
from txsync.transaction_store.dispatch_calls import DispatchCalls
from txsync.transaction_store.store_core import StoreConfig

__all__ = ["StagedStep", "StoreConfig", "Submitted", "TransactionStore"]


class TransactionStore(ClientCalls, CoordinatorCalls, DispatchCalls, DcCopyCalls):
    """A DC's transaction-store: see the module's docstring for its parts."""
