"""The coordinator's shell, driven with a real core: persist before send, with writes in
flight. (The simulator runs the same shell under faults; see tests/sim.)"""

from __future__ import annotations

import pytest

from txsync.protocol import (
    FetchBody,
    LocalTx,
    MergeBase,
    Post,
    PostReceived,
    ProtocolNode,
    SendPost,
    Timing,
    TxMeta,
)
from txsync.sync_coordinator.effects import ArrivedBody
from txsync.sync_coordinator.shell import FLUSH_BODIES, Shell, ShellError, ShellOutput
from txsync.transaction_store.validation import BODIES_PER_CALL_MAX

TX = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 10)]


def _shell(**settings: int) -> Shell:
    shell = Shell(ProtocolNode("dc1", ["dc1", "dc2", "dc3"], now_ms=0), **settings)
    first = shell.step([], now_ms=0)  # nothing to write: the first posts go at once
    assert not first.writes and _posts(first)
    return shell


def _posts(out: ShellOutput) -> list[SendPost]:
    return [
        message
        for release in out.releases
        for ready in release.readies
        for message in ready.messages
        if isinstance(message, SendPost)
    ]


def _incoming(out: ShellOutput) -> list[list[str]]:
    return [[meta.tx_id for meta in write.merged.incoming] for write in out.writes]


def test_a_step_with_something_durable_sends_only_once_it_is_durable() -> None:
    shell = _shell()
    out = shell.step([LocalTx(TX[0])], now_ms=200)
    assert _incoming(out) == [[TX[0]]]
    assert not out.releases
    released = shell.write_durable(out.writes[0].seq)
    assert not released.writes
    posts = _posts(released)
    assert posts and all(TX[0] in [m.tx_id for m in p.post.queue] for p in posts)


def test_sends_with_nothing_durable_wait_for_the_writes_before_them() -> None:
    shell = _shell()
    first = shell.step([LocalTx(TX[0])], now_ms=0)
    later = shell.step([], now_ms=600)  # a repost: nothing to write, but it names TX[0]
    assert not later.writes and not later.releases
    released = shell.write_durable(first.writes[0].seq)
    assert len(released.releases) == 2  # both batches, in the order they were stepped


def test_past_the_writes_in_flight_steps_gather_into_the_next_write() -> None:
    shell = _shell(writes_in_flight_max=1)
    first = shell.step([LocalTx(TX[0])], now_ms=0)
    assert _incoming(first) == [[TX[0]]]
    assert _incoming(shell.step([LocalTx(TX[1])], now_ms=0)) == []
    assert _incoming(shell.step([LocalTx(TX[2])], now_ms=0)) == []
    freed = shell.write_durable(first.writes[0].seq)
    assert len(freed.releases) == 1  # the first batch's sends; the second's wait
    assert freed.step_due and not freed.writes  # sealed at the next step, with what waits
    nxt = shell.step([LocalTx(TX[3])], now_ms=0)
    assert _incoming(nxt) == [[TX[1], TX[2], TX[3]]]  # one write, one fsync, for all
    assert shell.writes_in_flight == tuple(nxt.writes)


def test_a_big_gathering_is_sealed_and_the_shell_takes_no_events_until_a_slot_frees() -> None:
    shell = _shell(writes_in_flight_max=1, flush_metas=2)
    first = shell.step([LocalTx(TX[0])], now_ms=0)
    assert shell.accepting
    held = shell.step([LocalTx(TX[1]), LocalTx(TX[2]), LocalTx(TX[3])], now_ms=0)
    assert not held.writes
    assert not shell.accepting  # TX[1] and TX[2] were sealed on size
    freed = shell.write_durable(first.writes[0].seq)
    assert _incoming(freed) == [[TX[1], TX[2]]]
    assert shell.accepting  # TX[3] gathers for the next write
    last = shell.write_durable(freed.writes[0].seq)
    assert last.step_due
    assert _incoming(shell.step([], now_ms=700)) == [[TX[3]]]


def test_answers_must_come_in_the_order_the_writes_went() -> None:
    shell = _shell(writes_in_flight_max=2)
    first = shell.step([LocalTx(TX[0])], now_ms=0)
    second = shell.step([LocalTx(TX[1])], now_ms=0)
    with pytest.raises(ShellError, match="write 2 answered; the oldest unanswered is 1"):
        shell.write_durable(second.writes[0].seq)
    shell.write_durable(first.writes[0].seq)
    with pytest.raises(ShellError, match="write 1 answered"):
        shell.write_durable(first.writes[0].seq)


def test_synced_entries_on_their_way_to_the_disk_are_pending() -> None:
    shell = Shell(ProtocolNode("dc1", ["dc1"], now_ms=0))  # alone, it syncs at once
    first = shell.step([LocalTx(TX[0])], now_ms=0)
    second = shell.step([], now_ms=10)  # the repost that adds it
    assert [meta.tx_id for meta in shell.pending_synced()] == [TX[0]]
    assert shell.core.merge_base.synced_len == 1
    for write in [*first.writes, *second.writes]:
        shell.write_durable(write.seq)
    assert shell.pending_synced() == []


def test_a_shell_needs_a_write_slot() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Shell(ProtocolNode("dc1", ["dc1"], now_ms=0), writes_in_flight_max=0)


def test_the_clock_is_stepped_before_the_events() -> None:
    """After a quiet spell, a delay an event starts runs from the batch's time. (The
    coordinator once put its Tick after the events: a post naming a body we lack then
    started the 50 ms wait for the origin's push from the last step's time, and the same
    step's Tick fetched the body at once, ahead of the push on its way.)"""
    shell = Shell(ProtocolNode("dc1", ["dc1", "dc2", "dc3"], now_ms=0))
    shell.step([], now_ms=0)
    post = Post(0, "dc2", 1, 1, MergeBase.genesis(), 1, (TxMeta(1, TX[0], "dc2"),))
    out = shell.step([PostReceived(post)], now_ms=2_000)
    released = shell.write_durable(out.writes[0].seq)
    fetches = [
        effect
        for release in released.releases
        for ready in release.readies
        for effect in ready.bodies
        if isinstance(effect, FetchBody)
    ]
    assert fetches == []
    assert out.next_tick_ms == 2_000 + Timing().body_fetch_delay_ms


def _bodies(out: ShellOutput) -> list[list[str]]:
    return [[body.tx_id for body in write.merged.bodies] for write in out.writes]


def test_a_pushed_body_is_written_with_the_step_that_tells_the_core() -> None:
    """One write (one fsync) for the body and what the core learned with it; the core
    has the body acquired, and sends nothing about it until that write is durable."""
    shell = _shell()
    post = Post(0, "dc2", 1, 1, MergeBase.genesis(), 1, (TxMeta(1, TX[0], "dc2"),))
    out = shell.step([ArrivedBody(TX[0], b"body", b"digest"), PostReceived(post)], now_ms=10)
    assert _bodies(out) == [[TX[0]]] and _incoming(out) == [[TX[0]]]
    assert not out.releases
    assert shell.write_durable(out.writes[0].seq).releases


def test_a_body_alone_still_makes_a_write() -> None:
    shell = _shell()
    out = shell.step([ArrivedBody(TX[0], b"body", b"digest")], now_ms=10)
    assert _bodies(out) == [[TX[0]]]


def test_pushed_bodies_past_the_byte_bound_go_in_the_next_write() -> None:
    """A write stays within one gRPC message: the gathering is sealed before a body
    would take it past ``flush_body_bytes`` (a single bigger body still goes alone)."""
    shell = _shell(writes_in_flight_max=1, flush_body_bytes=10)
    bodies = [ArrivedBody(TX[n], b"x" * 6, b"digest") for n in range(3)]
    first = shell.step(bodies, now_ms=10)
    assert _bodies(first) == [[TX[0]]]
    assert not shell.accepting  # TX[1] sealed on size, waiting for the slot
    second = shell.write_durable(first.writes[0].seq)
    assert _bodies(second) == [[TX[1]]]
    shell.write_durable(second.writes[0].seq)
    assert _bodies(shell.step([], now_ms=20)) == [[TX[2]]]
    alone = _shell(flush_body_bytes=10)
    assert _bodies(alone.step([ArrivedBody(TX[3], b"x" * 50, b"digest")], now_ms=30)) == [[TX[3]]]


def test_pushed_bodies_past_the_count_the_store_takes_go_in_the_next_write() -> None:
    """No write holds more bodies than the store takes in one step (it refuses such a
    write, which ends the coordinator's incarnation): 300 bodies pushed with batched
    submits once arrived in one batch of events."""
    assert FLUSH_BODIES <= BODIES_PER_CALL_MAX
    shell = _shell(writes_in_flight_max=1, flush_bodies=2)
    first = shell.step([ArrivedBody(TX[n], b"x", b"digest") for n in range(5)], now_ms=10)
    assert _bodies(first) == [[TX[0], TX[1]]]
    assert not shell.accepting
    second = shell.write_durable(first.writes[0].seq)
    assert _bodies(second) == [[TX[2], TX[3]]]
    shell.write_durable(second.writes[0].seq)
    assert _bodies(shell.step([], now_ms=20)) == [[TX[4]]]
