"""Which transactions a worker applied lately, in a fixed 1 MiB: ``RecentIds``.

A read after a tx id (``Query.after_tx_id``) must tell an id applied a while ago from
one not applied yet, and the database keeps only the newest ``OUTCOMES_KEPT`` outcomes.
The worker remembered the newest 65,536 ids in an ordered dict: 15.0 MiB once filled
(the ids, their positions, the dict's links; tracemalloc), which its RSS followed up to
about 100k transactions of history, and each resize of the dict's table held the old
and the new at once (18.6 MiB at the peak; a +5.8 MiB moment in two workers at once in
issue 47's soak, caught with py-spy in ``_record_applied``). Here each id is a 16-byte
digest in one ring buffer: no object per id, no table to resize, and a lookup is a scan
of the buffer in C (``bytearray.find``), made once per read that waits for an id.
"""

from __future__ import annotations

import hashlib

DIGEST_BYTES = 16
"""A 128-bit digest of an id: two ids of a worker's window share one with a probability
of about 2**-96, and a read after the one would then not wait for the other."""


def _digest(tx_id: str) -> bytes:
    return hashlib.blake2b(tx_id.encode(), digest_size=DIGEST_BYTES).digest()


class RecentIds:
    """The ids of the newest ``capacity`` transactions added, oldest forgotten first."""

    __slots__ = ("_capacity", "_count", "_next", "_ring")

    def __init__(self, capacity: int) -> None:
        assert capacity > 0, capacity
        self._capacity = capacity
        self._ring = bytearray(DIGEST_BYTES * capacity)
        self._next = 0
        """The slot the next id goes in (the oldest one's, once the ring is full)."""
        self._count = 0

    def add(self, tx_id: str) -> None:
        start = self._next * DIGEST_BYTES
        self._ring[start : start + DIGEST_BYTES] = _digest(tx_id)
        self._next = (self._next + 1) % self._capacity
        self._count = min(self._count + 1, self._capacity)

    def __contains__(self, tx_id: object) -> bool:
        if not isinstance(tx_id, str):
            return False
        digest, ring = _digest(tx_id), self._ring
        found = ring.find(digest)
        while found != -1:
            # A match must start at a slot that holds an id (not across two slots).
            if found % DIGEST_BYTES == 0 and found // DIGEST_BYTES < self._count:
                return True
            found = ring.find(digest, found + 1)
        return False

    def __len__(self) -> int:
        return self._count
