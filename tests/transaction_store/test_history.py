"""A transaction's history packed in one bytes object reads as the steps it was given."""

from __future__ import annotations

import pytest

from txsync.protocol import TxState
from txsync.transaction_store import history
from txsync.transaction_store.history import OTHER_SERVICE, History, Step

STEPS = [
    Step(TxState.INCOMING, 1_796_216_880_438, "sync-coordinator"),
    Step(TxState.ACCEPTED, 1_796_216_880_463, "sync-coordinator"),
    Step(TxState.TESTING, 1_796_216_880_475, "worker-dispatch"),
    Step(TxState.FAILED, 1_796_216_880_478, "worker-dispatch"),
]


def test_a_history_reads_back_the_steps_appended() -> None:
    grown = History()
    assert not grown and len(grown) == 0 and grown.last_state is None
    for step in STEPS:
        grown.append(step)
        assert grown.last_state is step.state and grown[-1] == step
    assert list(grown) == STEPS and len(grown) == 4 and grown
    assert grown == STEPS and grown == History(STEPS)
    assert grown[0] == STEPS[0] and grown[-4] == STEPS[0]
    assert grown[1:3] == STEPS[1:3] and isinstance(grown[:2], History)
    assert grown[::2] == STEPS[::2]
    with pytest.raises(IndexError):
        grown[4]
    with pytest.raises(IndexError):
        grown[-5]
    assert grown != STEPS[:3] and grown != "not a history"
    assert list(grown.fields()) == [(s.state.value, s.at_unix_ms, s.service) for s in STEPS]


def test_service_names_past_the_bound_are_recorded_as_another_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller naming ever new services cannot grow the process's table of names."""
    monkeypatch.setattr(history, "_service_names", [OTHER_SERVICE])
    monkeypatch.setattr(history, "_service_numbers", {OTHER_SERVICE: 0})
    steps = History()
    for n in range(history.SERVICES_NAMED_MOST + 10):
        steps.append(Step(TxState.INCOMING, n, f"service {n}"))
    services = [step.service for step in steps]
    named = history.SERVICES_NAMED_MOST - 1  # number 0 is OTHER_SERVICE's
    assert services[:named] == [f"service {n}" for n in range(named)]
    assert set(services[named:]) == {OTHER_SERVICE}
    assert len(history._service_names) == history.SERVICES_NAMED_MOST
