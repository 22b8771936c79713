"""Scripts through one pipeline's decisions (``worker_dispatch.pipeline``): entries from
the store and workers' answers in, sends, records and out-of-sync verdicts out. Pure:
nothing here waits or starts a process (tests/worker_dispatch/test_dispatch.py runs the
same machine behind real workers)."""

from __future__ import annotations

import pytest

from txsync.protocol import TxState
from txsync.worker_dispatch.pipeline import (
    Answer,
    Entry,
    OutOfSync,
    Output,
    PipelineError,
    PipelineMachine,
    Record,
    Send,
)

ENQUEUED, TESTING, OK, FAILED = TxState.ENQUEUED, TxState.TESTING, TxState.OK, TxState.FAILED


def _entry(position: int, state: TxState = ENQUEUED, digest: bytes = b"") -> Entry[str]:
    return Entry(position, f"tx{position}", state, digest, f"body{position}")


def _answer(worker: str, position: int, digest: bytes, *, ok: bool = True) -> Answer:
    return Answer(worker, f"tx{position}", ok, digest)


def _said(outputs: list[Output[str]]) -> list[str]:
    """Outputs as short lines: 'send W P', 'send W P skip', 'record P STATE', 'out W'."""
    lines = []
    for output in outputs:
        match output:
            case Send(worker=w, position=p, skip=skip, payload=payload):
                assert payload == f"body{p}"  # the body travels untouched
                lines.append(f"send {w} {p}" + (" skip" if skip else ""))
            case Record(position=p, state=state):
                lines.append(f"record {p} {state.name}")
            case OutOfSync(worker=w):
                lines.append(f"out {w}")
    return lines


def test_the_testing_worker_decides_and_the_followers_follow() -> None:
    machine = PipelineMachine[str]("w1", ["w2", "w3"], {"w1": 0, "w2": 0, "w3": 0})
    assert machine.start == 1
    assert _said(machine.entry(_entry(1))) == ["record 1 TESTING", "send w1 1"]
    assert _said(machine.entry(_entry(2))) == ["record 2 TESTING", "send w1 2"]
    assert machine.in_flight("w1") == 2
    assert _said(machine.answer(_answer("w1", 1, b"d1"))) == [
        "record 1 OK", "send w2 1", "send w3 1",
    ]  # fmt: skip
    # A failure is the DC's verdict: the followers record it without running it.
    assert _said(machine.answer(_answer("w1", 2, b"d2", ok=False))) == [
        "record 2 FAILED", "send w2 2 skip", "send w3 2 skip",
    ]  # fmt: skip
    assert _said(machine.answer(_answer("w2", 1, b"d1"))) == []
    assert machine.positions == {"w1": 2, "w2": 1, "w3": 0}


def test_a_follower_with_another_digest_is_out_of_sync_and_gets_no_more_work() -> None:
    machine = PipelineMachine[str]("w1", ["w2", "w3"], {"w1": 0, "w2": 0, "w3": 0})
    machine.entry(_entry(1))
    machine.entry(_entry(2))
    machine.answer(_answer("w1", 1, b"d1"))
    assert _said(machine.answer(_answer("w3", 1, b"other"))) == ["out w3"]
    assert machine.out_of_sync == {"w3": "digest differs at position 1 (tx1)"}
    assert machine.positions["w3"] == 0  # its answer did not count
    assert _said(machine.answer(_answer("w1", 2, b"d2"))) == ["record 2 OK", "send w2 2"]


def test_a_follower_whose_touched_rows_differ_is_out_of_sync_at_that_position() -> None:
    """Same state digest (values are not in it), other rows touched: out of sync at once,
    not at the next content check. A worker that measured none (an earlier version, or
    an answer from its record) is not compared."""
    machine = PipelineMachine[str]("w1", ["w2", "w3"], {"w1": 0, "w2": 0, "w3": 0})
    machine.entry(_entry(1))
    machine.answer(Answer("w1", "tx1", True, b"d1", b"rows"))
    assert _said(machine.answer(Answer("w2", "tx1", True, b"d1", b"other rows"))) == ["out w2"]
    assert machine.out_of_sync == {
        "w2": "the rows tx1 touched differ from the testing worker's at position 1"
    }
    assert _said(machine.answer(Answer("w3", "tx1", True, b"d1"))) == []
    assert machine.positions["w3"] == 1


def test_finished_entries_go_only_to_workers_behind_them() -> None:
    """After a restart: w1 is at 5, w2 at 3. The store streams from w2's position on."""
    machine = PipelineMachine[str]("w1", ["w2"], {"w1": 5, "w2": 3})
    assert machine.start == 4
    assert _said(machine.entry(_entry(4, OK, b"d4"))) == ["send w2 4"]
    assert _said(machine.entry(_entry(5, FAILED, b"d5"))) == ["send w2 5 skip"]
    # Recorded TESTING before a crash, never finished: w1 answers again from its record.
    assert _said(machine.entry(_entry(6, TESTING))) == ["send w1 6"]
    assert _said(machine.answer(_answer("w2", 4, b"d4"))) == []
    assert _said(machine.answer(_answer("w2", 5, b"wrong"))) == ["out w2"]


def test_the_testing_worker_answers_positions_it_has_from_its_record() -> None:
    """The store's first unfinished position can be behind every worker (a dispatch
    killed between the apply and the record): the testing worker is asked again."""
    machine = PipelineMachine[str]("w1", ["w2"], {"w1": 7, "w2": 7})
    assert _said(machine.entry(_entry(7, TESTING))) == ["send w1 7"]
    # Its answer decides; w2 has position 7 already and is not sent it again.
    assert _said(machine.answer(_answer("w1", 7, b"d7"))) == ["record 7 OK"]


def test_inputs_the_contract_rules_out_are_refused() -> None:
    machine = PipelineMachine[str]("w1", ["w2"], {"w1": 0, "w2": 0})
    with pytest.raises(PipelineError, match="w2 answered with nothing in flight"):
        machine.answer(_answer("w2", 1, b"d1"))
    machine.entry(_entry(2))
    with pytest.raises(PipelineError, match="entry 2 after 2"):
        machine.entry(_entry(2))
    with pytest.raises(PipelineError, match="w1 answered tx9 for position 2"):
        machine.answer(_answer("w1", 9, b"d"))
    with pytest.raises(ValueError, match="named twice"):
        PipelineMachine[str]("w1", ["w1"], {"w1": 0})
