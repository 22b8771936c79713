"""The core reports every round it starts and ends (tracing and metrics are built on it)."""

from __future__ import annotations

from txsync.protocol import (
    BodyAcquired,
    Event,
    LocalTx,
    PostReceived,
    ProtocolNode,
    PushBody,
    RoundEffect,
    RoundEnded,
    RoundOutcome,
    RoundStarted,
    SendPost,
    Tick,
)


def test_a_round_that_adds_reports_its_posts_and_what_it_added() -> None:
    nodes = {n: ProtocolNode(n, ("a", "b"), now_ms=0) for n in ("a", "b")}
    reports: list[RoundEffect] = []
    inbox: list[tuple[str, Event]] = [("a", LocalTx("tx-1"))]
    for now in range(0, 2_000, 5):  # a message pump: posts arrive 5 ms later
        inbox += [(n, Tick(now)) for n in nodes]
        delivering, inbox = inbox, []
        for to, event in delivering:
            ready = nodes[to].step(event)
            if to == "a":
                reports += ready.rounds
            inbox += [
                (m.to, PostReceived(m.post)) for m in ready.messages if isinstance(m, SendPost)
            ]
            for body in ready.bodies:  # bodies travel instantly
                if isinstance(body, PushBody):
                    inbox += [(peer, BodyAcquired(body.tx_id)) for peer in body.to]
        if any(isinstance(r, RoundEnded) and r.added for r in reports):
            break
    ended = [r for r in reports if isinstance(r, RoundEnded)]
    started = [r.round_no for r in reports if isinstance(r, RoundStarted)]
    adding = [r for r in ended if r.added]
    # Added in a round (ADVANCED), or between rounds by a quiet node, which reports it in
    # the round that the ADD starts (COMPLETE once the peer posts at the new base).
    assert [r.added for r in adding] == [1]
    assert adding[0].outcome in (RoundOutcome.ADVANCED, RoundOutcome.COMPLETE)
    assert adding[0].posts_sent >= 1 and adding[0].posts_received == 1
    assert ended[-1].idle, "with nothing left to order the node goes idle"
    assert started == list(range(1, len(started) + 1)), "rounds count up by one"
    assert [r.round_no for r in ended] == started[: len(ended)], "each start has its end"


def test_a_round_without_a_peer_ends_at_its_deadline_as_an_empty_round() -> None:
    a = ProtocolNode("a", ("a", "b"), now_ms=0)
    first = a.step(Tick(0))
    assert [type(r) for r in first.rounds] == [RoundStarted]
    deadline = first.next_tick_ms
    assert deadline is not None
    ready = a.step(Tick(deadline))
    ended = [r for r in ready.rounds if isinstance(r, RoundEnded)]
    assert [(r.round_no, r.outcome, r.posts_received) for r in ended] == [
        (1, RoundOutcome.DEADLINE, 0)
    ]


def test_rounds_that_bring_nothing_new_slow_down_until_something_is_new() -> None:
    """b never gets tx-1's body, so tx-1 cannot be added: the two nodes' rounds bring
    nothing new. They follow one another every quiet_round_gap_ms (100), not back to back
    (before: a round every message delay, 200 in this second). The body's arrival is news:
    b posts at once, and a adds tx-1 on receipt."""
    nodes = {n: ProtocolNode(n, ("a", "b"), now_ms=0) for n in ("a", "b")}
    started = 0
    added_at: int | None = None
    inbox: list[tuple[str, Event]] = [("a", LocalTx("tx-1"))]
    for now in range(0, 1_500, 5):
        if now == 1_000:
            inbox.append(("b", BodyAcquired("tx-1")))
        inbox += [(n, Tick(now)) for n in nodes]
        delivering, inbox = inbox, []
        for to, event in delivering:
            ready = nodes[to].step(event)
            if to == "a" and now < 1_000:
                started += sum(isinstance(r, RoundStarted) for r in ready.rounds)
            inbox += [
                (m.to, PostReceived(m.post)) for m in ready.messages if isinstance(m, SendPost)
            ]
        if added_at is None and nodes["a"].merge_base.synced_len == 1:
            added_at = now
    assert 5 <= started <= 15, started
    assert added_at is not None and added_at <= 1_010, added_at
