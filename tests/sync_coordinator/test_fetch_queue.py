"""Which bodies a coordinator fetches from which peer (``FetchQueue``): each id asked
once however often the core retries, in batches, with a bounded count of callers per
holder; a failed call drops its holder's queue; what a holder left out comes again.
A pure machine: no stub, task or peer needed."""

from __future__ import annotations

from txsync.sync_coordinator.fetch_queue import FetchQueue


def _drain(queue: FetchQueue, holder: str) -> list[list[str]]:
    """One caller's batches, each answered whole."""
    batches = []
    while batch := queue.next_batch(holder):
        batches.append(batch)
        queue.answered(holder, batch)
    return batches


def test_an_ask_starts_a_caller_only_while_the_holder_has_room_for_one() -> None:
    queue = FetchQueue(calls_per_holder=2)
    assert queue.ask("t1", "dc2")
    assert queue.ask("t2", "dc2")
    assert not queue.ask("t3", "dc2")  # queued: one of the two callers takes it
    assert queue.ask("t4", "dc3")  # another holder has callers of its own
    assert (queue.callers("dc2"), queue.callers("dc3"), queue.queued) == (2, 1, 4)


def test_a_retry_of_an_id_queued_or_in_a_call_is_dropped() -> None:
    queue = FetchQueue()
    assert queue.ask("t1", "dc2")
    assert not queue.ask("t1", "dc2")
    assert not queue.ask("t1", "dc3")  # the core's retry names another holder
    batch = queue.next_batch("dc2")
    assert batch == ["t1"]
    assert not queue.ask("t1", "dc3")  # in the call now
    queue.answered("dc2", batch)
    assert queue.ask("t1", "dc3")  # answered without it: the core asks again


def test_a_queue_is_drained_in_batches_and_the_caller_ends_with_it() -> None:
    queue = FetchQueue(calls_per_holder=1, batch_max=3)
    assert queue.ask("t0", "dc2")
    for n in range(1, 8):
        queue.ask(f"t{n}", "dc2")
    assert _drain(queue, "dc2") == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6", "t7"]]
    assert (queue.callers("dc2"), queue.queued) == (0, 0)
    assert queue.ask("t8", "dc2")  # a new ask starts a caller again


def test_an_ask_during_a_call_is_taken_by_the_caller_already_draining() -> None:
    queue = FetchQueue(calls_per_holder=1)
    assert queue.ask("t1", "dc2")
    batch = queue.next_batch("dc2")
    assert not queue.ask("t2", "dc2")
    queue.answered("dc2", batch)
    assert queue.next_batch("dc2") == ["t2"]


def test_ids_the_holder_left_out_of_its_answer_go_back_to_its_queue() -> None:
    queue = FetchQueue()
    queue.ask("t1", "dc2")
    queue.ask("t2", "dc2")
    batch = queue.next_batch("dc2")
    queue.answered("dc2", batch, unread=["t2", "t9"])  # t9 was not asked of it
    assert not queue.ask("t2", "dc3")  # still asked
    assert queue.ask("t9", "dc3")
    assert queue.next_batch("dc2") == ["t2"]


def test_a_failed_call_drops_its_holders_whole_queue() -> None:
    queue = FetchQueue(batch_max=2)
    for n in range(5):
        queue.ask(f"t{n}", "dc2")
    queue.ask("u1", "dc3")
    batch = queue.next_batch("dc2")
    queue.failed("dc2", batch)
    assert queue.next_batch("dc2") == []  # the caller ends
    assert queue.queued == 1  # dc3's ask is untouched
    # every dropped id can be asked again, of another holder (its second caller starts)
    assert [queue.ask(f"t{n}", "dc3") for n in range(5)] == [True, False, False, False, False]
    assert queue.queued == 6


def test_a_caller_stopped_in_its_call_frees_its_ids_and_its_place() -> None:
    queue = FetchQueue(calls_per_holder=1)
    queue.ask("t1", "dc2")
    queue.ask("t2", "dc2")
    batch = queue.next_batch("dc2")
    queue.abandoned("dc2", batch)
    assert (queue.callers("dc2"), queue.queued) == (0, 0)
    assert queue.ask("t1", "dc2")


def test_asks_beyond_the_bound_are_dropped_until_the_queue_shrinks() -> None:
    queue = FetchQueue(queued_max=3)
    for n in range(3):
        queue.ask(f"t{n}", "dc2")
    assert not queue.ask("t3", "dc3")
    assert queue.queued == 3
    _drain(queue, "dc2")
    assert queue.ask("t3", "dc3")
