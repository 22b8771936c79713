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
    assert [(r.outcome, r.added) for r in adding] == [(RoundOutcome.ADVANCED, 1)]
    assert adding[0].posts_received == 1
    # The post a's ADD used may have gone in an earlier round: a round that follows a
    # completed one starts without a post when it has nothing new to say.
    assert sum(r.posts_sent for r in ended) >= 1
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
