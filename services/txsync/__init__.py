"""TxSync: multi-master, multi-data-center transaction replication.

Packages, one per part of the architecture (see ``docs/architecture.md``):

* ``txsync.protocol`` - the pure TxLog sync state machine (no I/O, time or randomness).
* ``txsync.sim`` - the seeded deterministic simulator that drives the core through faults.
* ``txsync.transaction_store``, ``txsync.sync_coordinator``, ``txsync.worker_dispatch``,
  ``txsync.worker`` - the services, thin shells around the core and the databases.
* ``txsync.v1`` - Python code generated from ``proto/txsync/v1`` (never edited by hand).
* ``txsync.cli`` - the ``txsync`` command.
"""

__version__ = "0.2.0.dev0"
