"""Which bodies to fetch from which peer, asked once each and fetched in batches
(``FetchQueue``): the deciding half of the coordinator's body fetches as a pure machine
(issue 53). It holds no stub, task or clock: ``bodies.BodyFetches`` makes the
``GetBodies`` calls it decides on, and the simulator's network (``sim/cluster.py``) makes
them as messages that can be delayed, dropped or never answered.

The core asks for every body it lacks (``FetchBody``) and asks again, with backoff, until
it holds it. An id already asked is not asked twice: the ask joins its holder's queue
once, and a retry while it is queued or in a call is dropped. Each holder's queue is
drained by at most ``calls_per_holder`` callers, each taking ``batch_max`` ids per call.
A call that fails drops its holder's whole queue (the core's retries go round the other
holders it named), and ids the holder left out of an answer (``unread``: past the
answer's bytes) go back to the queue. A queue of more than ``queued_max`` ids drops
further asks: the core asks again later."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from txsync.transaction_store.validation import BODIES_PER_CALL_MAX

FETCH_QUEUE_MAX = 65_536
"""Bodies queued or being fetched, over all holders; the core retries an ask past it.
Ids only (about 100 bytes each): the bodies' own bytes are bounded where they land."""
FETCH_CALLS_PER_PEER = 2
"""GetBodies calls in flight to one holder: the next is asked while one is answered."""


class FetchQueue:
    """The fetches asked for, queued by holder, and the callers draining each queue."""

    def __init__(
        self,
        *,
        queued_max: int = FETCH_QUEUE_MAX,
        calls_per_holder: int = FETCH_CALLS_PER_PEER,
        batch_max: int = BODIES_PER_CALL_MAX,
    ) -> None:
        self._queued_max = queued_max
        self._calls_per_holder = calls_per_holder
        self._batch_max = batch_max
        self._queues: dict[str, dict[str, None]] = {}
        """Per holder, the ids to fetch from it, oldest ask first."""
        self._asked: set[str] = set()
        """Queued or in a call (an ask for one of them is a retry: dropped)."""
        self._callers: dict[str, int] = {}
        """Per holder, the callers draining its queue (at most ``calls_per_holder``)."""

    @property
    def queued(self) -> int:
        """Ids queued or in a call, over all holders."""
        return len(self._asked)

    def callers(self, holder: str) -> int:
        return self._callers.get(holder, 0)

    def ask(self, tx_id: str, holder: str) -> bool:
        """Queue a fetch of ``tx_id`` from ``holder``. True: a new caller must drain
        ``holder``'s queue (``next_batch`` until it answers nothing)."""
        asked = self._asked
        if tx_id in asked or len(asked) >= self._queued_max:
            return False  # the core's retry asks again, perhaps another holder
        asked.add(tx_id)
        self._queues.setdefault(holder, {})[tx_id] = None
        callers = self._callers.get(holder, 0)
        if callers >= self._calls_per_holder:
            return False
        self._callers[holder] = callers + 1
        return True

    def next_batch(self, holder: str) -> list[str]:
        """The next ids a caller asks ``holder`` for, taken off its queue; empty: the
        queue is drained and the caller ends (it is no longer counted). Whatever the
        call brings, the caller reports it with ``answered`` or ``failed``."""
        queue = self._queues.get(holder)
        if queue:
            batch = list(itertools.islice(queue, self._batch_max))
            for tx_id in batch:
                del queue[tx_id]
            return batch
        self._end_caller(holder)
        return []

    def _end_caller(self, holder: str) -> None:
        self._callers[holder] -= 1
        if not self._callers[holder]:
            del self._callers[holder]
            if not self._queues.get(holder):
                self._queues.pop(holder, None)

    def answered(self, holder: str, batch: Sequence[str], unread: Iterable[str] = ()) -> None:
        """``holder`` answered the call for ``batch`` (or the caller did not call: none
        of it was still wanted). ``unread``: ids of the batch it holds but left out of
        this answer, fetched in a later call."""
        queue = self._queues.setdefault(holder, {})
        in_batch = set(batch)
        for tx_id in unread:
            if tx_id in in_batch:
                queue[tx_id] = None
        self._asked.difference_update(tx_id for tx_id in batch if tx_id not in queue)

    def failed(self, holder: str, batch: Sequence[str]) -> None:
        """The call for ``batch`` failed (or ``holder`` is not configured): its whole
        queue is dropped with it, and asked again of whichever holder the core names."""
        queue = self._queues.get(holder)
        if queue:
            self._asked.difference_update(queue)
            queue.clear()
        self._asked.difference_update(batch)

    def abandoned(self, holder: str, batch: Sequence[str]) -> None:
        """The caller stopped during its call (its coordinator is stopping): as
        ``failed``, and the caller is no longer counted."""
        self.failed(holder, batch)
        self._end_caller(holder)
