"""Deliberately broken coordinator shells: the simulator must catch each of them.

Each breaks the one rule the shell exists for, persist before send, in a way a
refactoring could: sends released before their write is durable, or a batch's sends
before an earlier batch's write is durable, or a pushed body the core is told of and
that no write carries.
"""

from __future__ import annotations

from txsync.protocol import BodyAcquired, Event
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.shell import Shell, _Batch


class SendsBeforeDurableShell(Shell):
    """Releases every batch's sends at once, durable or not."""

    def _take_releasable(self) -> list[_Batch]:
        released = list(self._unreleased)
        self._unreleased.clear()
        return released


class SendsOutOfOrderShell(Shell):
    """Releases each batch once its own write is durable (or it has none), without
    waiting for the batches before it."""

    def _take_releasable(self) -> list[_Batch]:
        released = [batch for batch in self._unreleased if batch.durable]
        for batch in released:
            self._unreleased.remove(batch)
        return released


class ForgetsArrivedBodiesShell(Shell):
    """Tells the core a pushed body is acquired, but writes it with nothing."""

    def _take_body(self, arrived: ArrivedBody) -> Event:
        return BodyAcquired(arrived.tx_id)
