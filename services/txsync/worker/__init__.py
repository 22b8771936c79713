"""worker: applies transactions to its SQL database (SQLite by default, PostgreSQL) in one
database transaction that also records the applied position, serves reads, and exports
snapshots for recovery.

Contract: ``proto/txsync/v1/worker.proto`` (``WorkerService``). Implementation: issue 5.
"""
