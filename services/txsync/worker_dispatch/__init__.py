"""worker-dispatch: feeds a DC's synced transactions to its workers in order (the testing
worker first, then the rest on OK), watches their health and positions, recovers workers
that fall out of sync, and publishes outcome digests for cross-DC comparison.

Contract: ``proto/txsync/v1/worker.proto``; notes: ``docs/workers.md``.
"""
