"""What the protocol alone costs in latency: the cores of three DCs, nothing else.

    make bench-protocol     (or: .venv/bin/python -m bench.protocol_model --help)

Runs the real ``ProtocolNode`` of each DC in a discrete-event model with no processing
time, no disk and a fixed one-way delay between DCs (bodies take it too). One client per
DC submits a transaction, waits until its own DC holds it ACCEPTED, and submits the next
at once, as ``make bench``'s single-submit clients do. It prints the p50 and p99 of
submit -> ACCEPTED at the client's DC, in round trips, and the posts sent per transaction
(every post costs both ends CPU), for the core as built and for the core with one rule
switched off, side by side:

* ``posts dropped at a base change``: posts held at the old base are dropped instead of
  rebased (what the core did before issue 19).

The real processes add their processing and store writes on top (``make bench``);
what this prints is the floor the protocol itself sets.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from txsync.protocol import (
    BodyAcquired,
    Event,
    FetchBody,
    LocalTx,
    MergeBase,
    Post,
    PostReceived,
    ProtocolNode,
    PushBody,
    Ready,
    SendPost,
    SendSyncedEntries,
    SendViewMessage,
    StateChanged,
    SyncedEntriesReceived,
    Tick,
    TxState,
    ViewMessageReceived,
)

DCS = ("dc1", "dc2", "dc3")


class DroppingCore(ProtocolNode):
    """The core as it was before issue 19: a base change drops every post held there."""

    def _rebased(self, post: Post, base: MergeBase) -> Post | None:
        return None


CoreFactory = Callable[..., ProtocolNode]
VARIANTS: dict[str, CoreFactory] = {
    "as built (posts rebased)": ProtocolNode,
    "posts dropped at a base change": DroppingCore,
}


@dataclass
class _Model:
    one_way_ms: int
    core: CoreFactory
    now: int = 0
    queue: list[tuple[int, int, str, Event]] = field(default_factory=list)
    order: itertools.count[int] = field(default_factory=itertools.count)
    submitted: dict[str, tuple[str, int]] = field(default_factory=dict)
    latencies: list[int] = field(default_factory=list)
    next_tx: itertools.count[int] = field(default_factory=itertools.count)
    ticks: dict[str, int] = field(default_factory=dict)
    posts: int = 0
    """Posts sent, by every DC."""

    def __post_init__(self) -> None:
        self.nodes = {dc: self.core(dc, list(DCS), now_ms=0) for dc in DCS}

    def at(self, when: int, dc: str, event: Event) -> None:
        heapq.heappush(self.queue, (when, next(self.order), dc, event))

    def submit(self, dc: str) -> None:
        tx_id = f"00000000-0000-4000-8000-{next(self.next_tx):012d}"
        self.submitted[tx_id] = (dc, self.now)
        self.at(self.now, dc, LocalTx(tx_id))

    def step(self, dc: str, event: Event) -> None:
        node = self.nodes[dc]
        if not isinstance(event, Tick):
            self.apply(dc, node.step(Tick(self.now)))  # the clock first, as the shell does
        self.apply(dc, node.step(event))

    def apply(self, dc: str, ready: Ready) -> None:
        later = self.now + self.one_way_ms
        for message in ready.messages:
            if isinstance(message, SendPost):
                self.posts += 1
                self.at(later, message.to, PostReceived(message.post))
            elif isinstance(message, SendSyncedEntries):
                self.at(later, message.to, SyncedEntriesReceived(message.entries))
            elif isinstance(message, SendViewMessage):
                self.at(later, message.to, ViewMessageReceived(message.message))
        for body in ready.bodies:
            if isinstance(body, PushBody):
                for peer in body.to:
                    self.at(later, peer, BodyAcquired(body.tx_id))
            elif isinstance(body, FetchBody):
                self.at(later + self.one_way_ms, dc, BodyAcquired(body.tx_id))
        for change in ready.state_changes:
            self.on_state(dc, change)
        due = ready.next_tick_ms
        if due is not None and self.ticks.get(dc) != due:
            self.ticks[dc] = due
            self.at(max(due, self.now), dc, Tick(max(due, self.now)))

    def on_state(self, dc: str, change: StateChanged) -> None:
        if change.state is not TxState.ACCEPTED:
            return
        origin = self.submitted.get(change.tx_id)
        if origin is not None and origin[0] == dc:
            del self.submitted[change.tx_id]
            self.latencies.append(self.now - origin[1])
            self.submit(dc)  # the client's next transaction, at once

    def run(self, txs: int, warmup: int) -> list[int]:
        for dc in DCS:
            self.at(0, dc, Tick(0))
            self.submit(dc)
        while self.queue and len(self.latencies) < txs + warmup:
            self.now, _, dc, event = heapq.heappop(self.queue)
            self.step(dc, event)
        return self.latencies[warmup:]


@dataclass(frozen=True)
class Figures:
    p50_ms: float
    p99_ms: float
    """Submit -> ACCEPTED at the client's DC."""
    posts_per_tx: float
    """Posts sent by all DCs together, per transaction ordered."""


def measure(core: CoreFactory, rtt_ms: int, txs: int) -> Figures:
    model = _Model(rtt_ms // 2, core)
    latencies = sorted(model.run(txs, warmup=txs // 10))
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Figures(statistics.median(latencies), p99, model.posts / len(model.latencies))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument("--rtts", default="10,50,100", help="round-trip times in ms")
    parser.add_argument("--txs", type=int, default=600, help="transactions measured per run")
    options = parser.parse_args()
    print(f"{'variant':<34} {'RTT':>6} {'p50':>9} {'p99':>9} {'p50/RTT':>8} {'p99/RTT':>8} "
          f"{'posts/tx':>9}")  # fmt: skip
    for rtt in (int(r) for r in options.rtts.split(",")):
        for name, core in VARIANTS.items():
            got = measure(core, rtt, options.txs)
            print(f"{name:<34} {rtt:>4}ms {got.p50_ms:>7.1f}ms {got.p99_ms:>7.1f}ms "
                  f"{got.p50_ms / rtt:>8.2f} {got.p99_ms / rtt:>8.2f} "
                  f"{got.posts_per_tx:>9.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
