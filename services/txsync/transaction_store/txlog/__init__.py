"""The on-disk transaction log: framed, checksummed batches in ``log-<timestamp>.dat``
files, and transaction bodies under ``transactions/`` (seed: transaction-log.txt)."""
