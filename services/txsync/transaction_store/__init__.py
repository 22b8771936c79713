"""transaction-store: owns a DC's txlog (incoming and synced queues, bodies, every
transaction's state and history) and serves the client API (``ClientService``) and the
internal API the coordinator and dispatch use (``StoreInternalService``).

Contracts: ``proto/txsync/v1/client.proto`` and ``store.proto``. Implementation: issue 3.
"""
