"""Encoded bodies of unfinished transactions that a log rotation filed, kept in memory.

Until a rotation, every body is in the store's memory anyway (its only copy on disk is
the current log's entry, ``TransactionStore._unfiled``). A rotation files the bodies of
the transactions it keeps; those still unfinished are read back soon (worker-dispatch
streams each one to the testing worker once it is ENQUEUED, peers fetch them), and
reading a gzip file costs a thread hop, a decompression and a parse. They enter this
cache at the rotation and leave when their transaction finishes, or, oldest first, when
the cache is over its byte budget: a body not found here is read from its file, so
eviction costs time, never correctness.
"""

from __future__ import annotations

BODY_CACHE_BYTES_DEFAULT = 64 * 1024 * 1024


class BodyCache:
    def __init__(self, bytes_max: int = BODY_CACHE_BYTES_DEFAULT) -> None:
        assert bytes_max >= 0
        self._bytes_max = bytes_max
        self._bodies: dict[str, bytes] = {}
        """Insertion order is eviction order (oldest first)."""
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._bodies)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, tx_id: str, encoded: bytes) -> None:
        if len(encoded) > self._bytes_max:
            return  # would evict everything else and still not fit
        self.discard(tx_id)
        self._bodies[tx_id] = encoded
        self._bytes += len(encoded)
        while self._bytes > self._bytes_max:
            oldest = next(iter(self._bodies))
            self.discard(oldest)
        assert self._bytes >= 0

    def get(self, tx_id: str) -> bytes | None:
        return self._bodies.get(tx_id)

    def discard(self, tx_id: str) -> None:
        encoded = self._bodies.pop(tx_id, None)
        if encoded is not None:
            self._bytes -= len(encoded)
