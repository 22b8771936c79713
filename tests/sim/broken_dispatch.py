"""Deliberately broken pipeline machines (worker-dispatch): the simulator must catch
each of them, as it catches broken cores and shells."""

from __future__ import annotations

from txsync.protocol import TxState
from txsync.worker_dispatch.pipeline import Answer, Entry, Output, PipelineMachine, Send


class FollowersNeverFedMachine(PipelineMachine[None]):
    """Records the testing worker's verdicts but never passes them on."""

    def answer(self, answer: Answer) -> list[Output[None]]:
        outputs = super().answer(answer)
        return [o for o in outputs if not (isinstance(o, Send) and o.worker != self.tester)]


class FinishedToNobodyMachine(PipelineMachine[None]):
    """Takes a finished entry as applied everywhere: a worker that was behind when the
    pipeline restarted never gets it."""

    def entry(self, entry: Entry[None]) -> list[Output[None]]:
        if entry.state in (TxState.OK, TxState.FAILED):
            self._last_entry = entry.position
            return []
        return super().entry(entry)
