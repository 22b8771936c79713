"""The coordinator's shell, driven with a real core: persist before send, with writes in
flight. (The simulator runs the same shell under faults; see tests/sim.)"""

from __future__ import annotations

import uuid

import pytest

from txsync.codec import NODE_ID_CHARS_MAX, SEAL_ENTRIES_MAX, URL_CHARS_MAX, WEIGHT_MAX
from txsync.protocol import (
    MEMBERS_MAX,
    Ballot,
    Configuration,
    FetchBody,
    LocalTx,
    MergeBase,
    Post,
    PostReceived,
    ProtocolNode,
    SendPost,
    Timing,
    TxMeta,
    View,
    ViewProposal,
)
from txsync.protocol.events import PersistViewVote
from txsync.protocol.limits import EVENT_METAS_MOST, INCOMING_TXS_MOST
from txsync.rpc import MESSAGE_BYTES_MAX
from txsync.sync_coordinator.effects import BODY_ENTRY_BYTES_MOST, ArrivedBody, MergedPersist
from txsync.sync_coordinator.shell import (
    FLUSH_BODIES,
    FLUSH_WRITE_BYTES,
    Shell,
    ShellError,
    ShellEvent,
    ShellOutput,
)
from txsync.sync_coordinator.store_wire import persist_request
from txsync.transaction_store.validation import (
    BODIES_PER_CALL_MAX,
    BODY_BYTES_MAX,
    TRACEPARENT_CHARS_MAX,
)

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
    """A write stays within one gRPC message: the gathering is sealed before a body would
    take it past ``FLUSH_WRITE_BYTES``, and a bigger body goes alone, sealed before and
    after it."""
    shell = _shell(writes_in_flight_max=1)
    third = FLUSH_WRITE_BYTES // 3
    first = shell.step([ArrivedBody(TX[n], b"x" * third, b"digest") for n in range(3)], now_ms=10)
    assert _bodies(first) == [[TX[0], TX[1]]]
    shell.write_durable(first.writes[0].seq)
    assert _bodies(shell.step([], now_ms=20)) == [[TX[2]]]

    alone = _shell()
    post = Post(0, "dc2", 1, 1, MergeBase.genesis(), 1, (TxMeta(1, TX[4], "dc2"),))
    events: list[ShellEvent] = [
        PostReceived(post),
        ArrivedBody(TX[3], b"x" * FLUSH_WRITE_BYTES, b"digest"),
        LocalTx(TX[5]),
    ]
    out = alone.step(events, now_ms=30)
    assert _bodies(out) == [[], [TX[3]]] and _incoming(out) == [[TX[4]], []]
    assert alone.write_durable(out.writes[0].seq).step_due
    assert _incoming(alone.step([], now_ms=40)) == [[TX[5]]]


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


def test_the_largest_write_the_shell_can_make_fits_in_one_grpc_message() -> None:
    """The shell seals a write on ``MergedPersist.bytes_bound``, which must bound the
    store's request from above; and with the most one event adds on top of a gathering
    just under the bound, or of a lone body of the largest size, a write must still fit
    the store channel's message (``MESSAGE_BYTES_MAX``: a write over it ends the
    coordinator's incarnation, and every restart meets the same install). Raising a limit
    these sizes rest on means finding room for it here."""
    origin = "o" * NODE_ID_CHARS_MAX

    def metas(count: int) -> list[TxMeta]:
        return [TxMeta(2**63 - 1 - n, str(uuid.UUID(int=n + 1)), origin) for n in range(count)]

    members = [f"{n:02d}" + "m" * (NODE_ID_CHARS_MAX - 2) for n in range(MEMBERS_MAX)]
    addresses = {m: "h" * URL_CHARS_MAX for m in members}
    proposal = ViewProposal(
        View(2**63 - 1, tuple(members)),
        MergeBase(2**63 - 1, str(uuid.UUID(int=1))),
        tuple(metas(SEAL_ENTRIES_MAX)),
        Configuration.of(dict.fromkeys(members, WEIGHT_MAX), 2**63 - 1, addresses),
    )
    ballot = Ballot(2**63 - 1, 2**63 - 1, members[0])
    run = 2 * EVENT_METAS_MOST  # a catch-up, then an ADD of the posts held
    install = MergedPersist(
        counter=2**63 - 1,
        incoming=metas(run),
        synced_start=MergeBase(2**63 - 1, str(uuid.UUID(int=2))),
        synced=metas(run),
        forgotten=dict.fromkeys(str(uuid.UUID(int=n + 1)) for n in range(INCOMING_TXS_MOST)),
        installed=proposal,
        vote=PersistViewVote(ballot, ballot, proposal),
        bodies=[
            ArrivedBody(str(uuid.UUID(int=n + 1)), b"b", b"d" * 32, "t" * TRACEPARENT_CHARS_MAX)
            for n in range(FLUSH_BODIES)
        ],
    )
    install.body_bytes = len(install.bodies)
    assert persist_request(install).ByteSize() <= install.bytes_bound()

    install.bodies, install.body_bytes = [], 0
    largest_event = install.bytes_bound()
    assert FLUSH_WRITE_BYTES + largest_event < MESSAGE_BYTES_MAX, f"{largest_event:,}"
    acquired = MergedPersist(incoming=metas(run), synced=metas(run)).bytes_bound()
    lone_body = BODY_BYTES_MAX + BODY_ENTRY_BYTES_MOST
    assert lone_body + acquired < MESSAGE_BYTES_MAX, f"{lone_body + acquired:,}"
