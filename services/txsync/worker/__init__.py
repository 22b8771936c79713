"""worker: applies transactions to its SQL database (SQLite; PostgreSQL to come) in one
database transaction that also records the applied position, and serves reads (snapshots
for recovery to come).

Contract: ``proto/txsync/v1/worker.proto`` (``WorkerService``); notes: ``docs/workers.md``.
"""
