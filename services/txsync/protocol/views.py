"""The arithmetic of view changes (PROTOCOL.md §3): weight majorities, the seal rule and
the checks on view messages. ``ProtocolNode`` runs the exchange; this module decides.

Why the seal rule is safe, in short (docs/protocol.md has the long form): an ADD needs a
post from every member of the view at one merge base, a member posts only at its own
base, and a promiser never posts again in the old view. So every ADD of the old view
happened at a base no longer than the shortest promiser's, and each one is a prefix of
every member's queue there with all timestamps at or below every member's counter. The
common prefix of the shortest promisers' queues, cut at their least counter, therefore
holds everything the old view added, and every promiser's synced queue is a prefix of it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from txsync.protocol.limits import MEMBERS_MAX, Limits
from txsync.protocol.model import (
    Configuration,
    MergeBase,
    NodeId,
    TxMeta,
    View,
    ViewPromise,
    ViewProposal,
)
from txsync.protocol.queues import addable_prefix
from txsync.protocol.validation import sorted_metas_problem


def is_weight_majority(nodes: Iterable[NodeId], weights: Mapping[NodeId, int]) -> bool:
    """True if ``nodes`` hold more than half of the configuration's total weight."""
    total = sum(weights.values())
    held = sum(weights[node] for node in set(nodes) if node in weights)
    return 2 * held > total


class SealConflict(Exception):
    """Promisers at the same length disagree on their merge base: the order already forked."""


def seal_after(
    current: ViewProposal, promises: Collection[ViewPromise]
) -> tuple[MergeBase, tuple[TxMeta, ...]]:
    """The old view's final synced queue, as ``(start, entries)``, from the promises of
    at least one of its members (PROTOCOL.md §3, the seal rule).

    A member promiser still short of the current view's own seal never posted at or past
    it, and every ADD of this view happens there or later (the view's first members all
    start from its seal), so in that case the view added nothing.
    """
    members = set(current.view.members)
    old = [promise for promise in promises if promise.sender in members]
    assert old, "a weight majority of promisers always holds a member of the old view"
    view_start = current.seal_end
    if any(promise.base.synced_len < view_start.synced_len for promise in old):
        return view_start, ()
    shortest = min(promise.base.synced_len for promise in old)
    at_shortest = [promise for promise in old if promise.base.synced_len == shortest]
    bases = {promise.base for promise in at_shortest}
    if len(bases) > 1:
        raise SealConflict(f"promisers at length {shortest} hold different bases {bases}")
    least_counter = min(promise.counter for promise in at_shortest)
    entries = addable_prefix([promise.queue for promise in at_shortest], least_counter)
    return at_shortest[0].base, entries


def new_members(
    current: View,
    promises: Collection[ViewPromise],
    seal_end_len: int,
    weights: Mapping[NodeId, int],
    rejoin_lag_max: int,
) -> tuple[NodeId, ...]:
    """Who takes part in the next view: every promiser that is a member now, and every
    excluded promiser that is caught up (within ``rejoin_lag_max`` entries of the seal).

    A member that did not answer is left out: that is how a silent member is excluded.
    If leaving the laggards out would cost the majority, everyone who answered joins.
    """
    chosen = sorted(
        promise.sender
        for promise in promises
        if promise.sender in current.members
        or promise.base.synced_len + rejoin_lag_max >= seal_end_len
    )
    if not is_weight_majority(chosen, weights):
        chosen = sorted(promise.sender for promise in promises)
    return tuple(chosen)


def proposal_problem(
    proposal: ViewProposal, limits: Limits, current: Configuration | None
) -> str | None:
    """Why a proposal or install must be refused, or None if it is well-formed. With
    ``current`` (the acceptor's configuration; an accept, not an install) it must also be
    the same configuration or the next one, at most one node's weight apart."""
    configuration = proposal.configuration
    weights = configuration.as_dict()
    if len(weights) != len(configuration.weights) or len(weights) > MEMBERS_MAX:
        return f"configuration repeats a node or holds more than {MEMBERS_MAX}"
    if list(weights) != sorted(weights) or min(weights.values(), default=0) <= 0:
        return "configuration not sorted, empty, or with a weight below 1"
    members = proposal.view.members
    if list(members) != sorted(set(members)):
        return "members not sorted and unique"
    unknown = [member for member in members if member not in weights]
    if unknown:
        return f"members {unknown} are not configured"
    if not is_weight_majority(members, weights):
        return f"members {list(members)} hold no weight majority"
    if proposal.view.view_no <= 0 or proposal.seal_start.synced_len < 0:
        return "view number or seal start out of range"
    if len(proposal.seal) > limits.post_txs_max:
        return f"{len(proposal.seal)} seal entries exceed post_txs_max={limits.post_txs_max}"
    if current is not None:
        moved = configuration.applied_position - current.applied_position
        before = current.as_dict()
        differing = {n for n in {*before, *weights} if before.get(n) != weights.get(n)}
        if moved < 0 or len(differing) > (1 if moved else 0):
            return "configuration is neither ours nor ours with one later membership change"
    return sorted_metas_problem(proposal.seal, None)


def promise_problem(promise: ViewPromise, limits: Limits) -> str | None:
    """Why a promise must be refused, or None if it is well-formed."""
    if len(promise.queue) > limits.post_txs_max:
        return f"{len(promise.queue)} metas exceed post_txs_max={limits.post_txs_max}"
    if promise.base.synced_len < 0 or promise.counter < 0:
        return "negative length or counter"
    if (promise.accepted is None) != (promise.accepted_ballot is None):
        return "an accepted proposal without its ballot, or the other way round"
    if promise.accepted is not None and promise.accepted.view.view_no != promise.ballot.view_no:
        return "the accepted proposal is for another view change"
    return sorted_metas_problem(promise.queue, promise.counter)
