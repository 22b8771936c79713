"""The shared types of ``proto/txsync/v1/common.proto`` <-> ``txsync.protocol`` values.

One codec for every service: decoding checks ids, node ids and number ranges and raises
``WireError`` naming the field (callers answer INVALID_ARGUMENT, or, replaying their own
log, report corruption). Service-specific messages build on it (``sync_coordinator.wire``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from txsync.ids import is_genesis, tx_id_problem
from txsync.protocol import (
    GENESIS_TX_ID,
    MEMBERS_MAX,
    Ballot,
    ConfigChange,
    Configuration,
    MergeBase,
    PersistViewVote,
    TxMeta,
    View,
    ViewProposal,
)
from txsync.v1 import common_pb2

NODE_ID_CHARS_MAX = 63
COUNTER_MAX = 2**63 - 1
"""Counters, timestamps and lengths travel as uint64 but stay within int64 everywhere."""
URL_CHARS_MAX = 255
WEIGHT_MAX = 1_000
"""A node's vote weight is 1..WEIGHT_MAX."""
SEAL_ENTRIES_MAX = 4_096
"""A seal is one common prefix of posted queues, so it is bounded like a post."""


class WireError(ValueError):
    """A message that cannot be decoded or breaks the contract."""


def check_tx_id(tx_id: str, field: str) -> str:
    problem = None if is_genesis(tx_id) else tx_id_problem(tx_id, field)
    if problem is not None:
        raise WireError(problem)
    return tx_id


_NODE_ID = re.compile(rf"[A-Za-z0-9_.-]{{1,{NODE_ID_CHARS_MAX}}}")


def check_node_id(node_id: str, field: str) -> str:
    if _NODE_ID.fullmatch(node_id):
        return node_id
    if not node_id or len(node_id) > NODE_ID_CHARS_MAX:
        raise WireError(f"{field}: a node id has 1 to {NODE_ID_CHARS_MAX} characters")
    if not all(ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in node_id):
        raise WireError(f"{field}: {node_id!r} may hold only letters, digits, '-', '_' and '.'")
    return node_id


def check_number(value: int, field: str) -> int:
    if value > COUNTER_MAX:
        raise WireError(f"{field}: {value} is above {COUNTER_MAX}")
    return value


def meta_to_proto(meta: TxMeta) -> common_pb2.TxMeta:
    return common_pb2.TxMeta(ts=meta.ts, tx_id=meta.tx_id, origin=meta.origin)


def meta_from_proto(message: common_pb2.TxMeta, field: str = "meta") -> TxMeta:
    return TxMeta(
        ts=check_number(message.ts, f"{field}.ts"),
        tx_id=check_tx_id(message.tx_id, f"{field}.tx_id"),
        # Node ids are few: a store holding thousands of metas keeps one string per node.
        origin=sys.intern(check_node_id(message.origin, f"{field}.origin")),
    )


class MetaInterner:
    """Hands out one ``TxMeta`` object for a meta decoded again and again.

    A coordinator decodes each meta many times: in every post of every peer that holds
    it (each DC posts the others' metas too, and re-posts as it learns), in catch-up
    entries and promises. The posts it keeps as delta references (``KnownPosts``) and
    the core's queues then held 6-7 copies of each meta per coordinator, about 1.3 KB a
    transaction, which set the process's high-water mark under a batched load (issue 47,
    ``docs/benchmarks.md``). Bounded: two generations of ``kept // 2`` metas, the older
    dropped whole when the newer fills (a meta seen again moves to the newer one), so a
    lookup and an eviction are O(1). A meta not found is decoded as before."""

    def __init__(self, kept: int = 16_384) -> None:
        assert kept >= 2
        self._generation_max = kept // 2
        self._newer: dict[str, TxMeta] = {}
        self._older: dict[str, TxMeta] = {}

    def __len__(self) -> int:
        return len(self._newer) + len(self._older)

    def meta(self, ts: int, tx_id: str, origin: str) -> TxMeta:
        """The meta ``(ts, tx_id, origin)``: the one handed out before if it is held."""
        newer = self._newer.get(tx_id)
        if newer is not None and newer.ts == ts and newer.origin == origin:
            return newer
        older = self._older.get(tx_id) if newer is None else None
        if older is not None and older.ts == ts and older.origin == origin:
            meta = older  # promoted, so that it outlives the older generation
        else:
            # Node ids are few: one string per node, not one per meta.
            meta = TxMeta(ts, tx_id, sys.intern(origin))
        if len(self._newer) >= self._generation_max:
            self._older, self._newer = self._newer, {}
        self._newer[tx_id] = meta
        return meta


def metas_from_proto(
    messages: Iterable[common_pb2.TxMeta], field: str, interner: MetaInterner | None = None
) -> tuple[TxMeta, ...]:
    """Every meta checked as ``meta_from_proto`` checks it; the field's name (with the
    index) is only spelled out for a meta that fails, not built for each one. With an
    ``interner``, a meta it holds is its object, not a new one."""
    make = TxMeta if interner is None else interner.meta
    metas: list[TxMeta] = []
    for message in messages:
        ts, tx_id, origin = message.ts, message.tx_id, message.origin
        if ts <= COUNTER_MAX and _is_tx_id(tx_id) and _NODE_ID.fullmatch(origin):
            metas.append(make(ts, tx_id, origin))
        else:
            checked = meta_from_proto(message, f"{field}[{len(metas)}]")
            metas.append(make(checked.ts, checked.tx_id, checked.origin))
    return tuple(metas)


def _is_tx_id(tx_id: str) -> bool:
    return is_genesis(tx_id) or tx_id_problem(tx_id, "") is None


def base_to_proto(base: MergeBase) -> common_pb2.MergeBase:
    return common_pb2.MergeBase(synced_len=base.synced_len, last_tx_id=base.last_tx_id)


def base_from_proto(message: common_pb2.MergeBase, field: str = "base") -> MergeBase:
    length = check_number(message.synced_len, f"{field}.synced_len")
    last = check_tx_id(message.last_tx_id or GENESIS_TX_ID, f"{field}.last_tx_id")
    if (length == 0) != (last == GENESIS_TX_ID):
        raise WireError(f"{field}: only an empty synced queue ends at the genesis id")
    return MergeBase(length, last)


def ballot_to_proto(ballot: Ballot) -> common_pb2.Ballot:
    return common_pb2.Ballot(
        view_no=ballot.view_no, attempt=ballot.attempt, proposer=ballot.proposer
    )


def ballot_from_proto(message: common_pb2.Ballot, field: str = "ballot") -> Ballot:
    return Ballot(
        check_number(message.view_no, f"{field}.view_no"),
        check_number(message.attempt, f"{field}.attempt"),
        check_node_id(message.proposer, f"{field}.proposer"),
    )


def proposal_to_proto(proposal: ViewProposal) -> common_pb2.ViewProposal:
    return common_pb2.ViewProposal(
        view=common_pb2.View(view_no=proposal.view.view_no, members=list(proposal.view.members)),
        seal_start=base_to_proto(proposal.seal_start),
        seal=[meta_to_proto(meta) for meta in proposal.seal],
        configuration=configuration_to_proto(proposal.configuration),
    )


def configuration_to_proto(configuration: Configuration) -> common_pb2.Configuration:
    urls = dict(configuration.addresses)
    return common_pb2.Configuration(
        weights=[
            common_pb2.NodeWeight(node_id=node, weight=weight, url=urls.get(node, ""))
            for node, weight in configuration.weights
        ],
        applied_position=configuration.applied_position,
    )


def proposal_from_proto(message: common_pb2.ViewProposal, field: str = "proposal") -> ViewProposal:
    """Shape only; whether the proposal makes sense is the core's check."""
    if len(message.view.members) > MEMBERS_MAX:
        raise WireError(f"{field}.view.members: more than {MEMBERS_MAX}")
    if len(message.seal) > SEAL_ENTRIES_MAX:
        raise WireError(f"{field}.seal: more than {SEAL_ENTRIES_MAX} entries")
    view = View(
        check_number(message.view.view_no, f"{field}.view.view_no"),
        tuple(check_node_id(m, f"{field}.view.members") for m in message.view.members),
    )
    weights = message.configuration.weights
    if len(weights) > MEMBERS_MAX:
        raise WireError(f"{field}.configuration.weights: more than {MEMBERS_MAX}")
    configuration = Configuration(
        tuple(
            (check_node_id(w.node_id, f"{field}.configuration"), check_weight(w.weight, field))
            for w in weights
        ),
        check_number(message.configuration.applied_position, f"{field}.applied_position"),
        tuple((w.node_id, check_url(w.url, field)) for w in weights if w.url),
    )
    return ViewProposal(
        view,
        base_from_proto(message.seal_start, f"{field}.seal_start"),
        metas_from_proto(message.seal, f"{field}.seal"),
        configuration,
    )


def vote_to_proto(vote: PersistViewVote) -> common_pb2.ViewVote:
    """An acceptor's vote as the store keeps it for its coordinator: the promise, and
    what it accepted (both or neither)."""
    message = common_pb2.ViewVote(promised=ballot_to_proto(vote.promised))
    if vote.accepted_ballot is not None and vote.accepted is not None:
        message.accepted_ballot.CopyFrom(ballot_to_proto(vote.accepted_ballot))
        message.accepted.CopyFrom(proposal_to_proto(vote.accepted))
    return message


def vote_from_proto(message: common_pb2.ViewVote, field: str = "vote") -> PersistViewVote:
    promised = ballot_from_proto(message.promised, f"{field}.promised")
    if not message.HasField("accepted_ballot"):
        return PersistViewVote(promised, None, None)
    return PersistViewVote(
        promised,
        ballot_from_proto(message.accepted_ballot, f"{field}.accepted_ballot"),
        proposal_from_proto(message.accepted, f"{field}.accepted"),
    )


def config_change_from_proto(change: common_pb2.MembershipChange) -> ConfigChange:
    """A membership entry's change for the core (its body was checked when the store took
    it: ``validation.check_membership``)."""
    after = change.after_position if change.HasField("after_position") else None
    return ConfigChange(change.node_id, change.weight, change.url, after)


def check_url(url: str, field: str) -> str:
    if len(url) > URL_CHARS_MAX or (url and ":" not in url):
        raise WireError(f"{field}: {url[:40]!r} is not host:port of at most {URL_CHARS_MAX}")
    return url


def check_weight(weight: int, field: str) -> int:
    if not 1 <= weight <= WEIGHT_MAX:
        raise WireError(f"{field}: weight {weight} is not within 1..{WEIGHT_MAX}")
    return weight
