"""Coordinators' body fetch queues with one rule broken (the simulator runs them in
place of the coordinator's ``FetchQueue``)."""

from __future__ import annotations

from collections.abc import Sequence

from txsync.sync_coordinator.fetch_queue import FetchQueue


class KeepsFailedAskedQueue(FetchQueue):
    """Takes a failed call as answered: its ids leave the queue but stay asked, so the
    core's retries of them, to any holder, are dropped as repeats for ever, and a body
    whose push and fetch were both lost never comes."""

    def failed(self, holder: str, batch: Sequence[str]) -> None:
        self.answered(holder, ())
