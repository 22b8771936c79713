"""Deliberately broken protocol cores: the simulator must catch each of them."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from txsync.protocol import (
    DurableState,
    Event,
    MergeBase,
    NodeId,
    PersistIncoming,
    Post,
    ProtocolNode,
    Ready,
    TxMeta,
    ViewPromise,
    ViewProposal,
)
from txsync.protocol.queues import addable_prefix

NO_CUT = 2**62


class NoCutCore(ProtocolNode):
    """ADD without the ts <= L cut. Harmless while ADD needs every member's post: each
    post's counter covers every ts it carries (docs/protocol.md, 'The cut')."""

    def _addable(self, queues: Sequence[Sequence[TxMeta]], limit_ts: int) -> tuple[TxMeta, ...]:
        return addable_prefix(queues, NO_CUT)


class MajorityAddNoCutCore(ProtocolNode):
    """The seed's 'continue without the missing ones' decided per node: ADD as soon as a
    majority posted, and without the cut. Forks the order."""

    def _try_add(self) -> bool:
        if 2 * len(self._posts) <= len(self._members):
            return False
        prefix = addable_prefix([post.queue for post in self._posts.values()], NO_CUT)
        if not prefix:
            return False
        self._append_synced(prefix, holders=())
        self._after_base_change()
        return True


class ForgetfulCounterCore(ProtocolNode):
    """Restarts with its counter at zero, as if the counter were never made durable."""

    def __init__(self, *args: Any, durable: DurableState | None = None, **kwargs: Any) -> None:
        if durable is not None:
            durable = DurableState(
                counter=0,
                epoch=durable.epoch,
                synced_len=durable.synced_len,
                synced_tail=durable.synced_tail,
                incoming=durable.incoming,
                synced_unacquired=durable.synced_unacquired,
            )
        super().__init__(*args, durable=durable, **kwargs)


class UnionAddCore(ProtocolNode):
    """ADD the longest posted queue instead of the common prefix."""

    def _addable(self, queues: Sequence[Sequence[TxMeta]], limit_ts: int) -> tuple[TxMeta, ...]:
        longest: Sequence[TxMeta] = ()
        for queue in queues:
            if len(queue) > len(longest):
                longest = queue
        return tuple(longest)


class UnfrozenPromiseCore(ProtocolNode):
    """Keeps posting and adding in its view after promising to leave it, so the seal no
    longer bounds what the old view added."""

    def _is_frozen(self) -> bool:
        return False


class SealWithoutQueuesCore(ProtocolNode):
    """Seals the old view at the shortest promiser's base, ignoring the queues posted
    there: whatever an ADD at that base appended elsewhere is lost to the new view."""

    def _seal(self, promises: Collection[ViewPromise]) -> tuple[MergeBase, tuple[TxMeta, ...]]:
        start, _ = super()._seal(promises)
        return start, ()


class StalePostsKeptCore(ProtocolNode):
    """Keeps a post from an earlier base as if it had been posted at the new one, queue
    and all, without checking that it begins with the entries appended since (the check
    that makes a rebased post true at the new base: docs/protocol.md)."""

    def _rebased(self, post: Post, base: MergeBase) -> Post | None:
        return replace(post, base=base)


class ForgetsForeignMetasCore(ProtocolNode):
    """Writes the metas of its own transactions but not those it merged from peers'
    posts, which it still posts: a restart forgets what its peers were told it holds
    (docs/protocol.md, "Durability")."""

    def step(self, event: Event) -> Ready:
        ready = super().step(event)
        kept = []
        for effect in ready.persist:
            if isinstance(effect, PersistIncoming):
                own = tuple(meta for meta in effect.metas if meta.origin == self.node_id)
                if not own:
                    continue
                effect = PersistIncoming(own)
            kept.append(effect)
        return replace(ready, persist=tuple(kept))


class SealBehindHistoryCore(ProtocolNode):
    """Appends an installed view's seal however far behind the sender's history it is
    (``ViewInstall.history_len`` ignored): a DC its peers let go past ``--peer-hold-max``
    takes metas whose bodies every DC truncated (invariant 4)."""

    def _install(
        self, proposal: ViewProposal, *, source: NodeId | None, source_history_len: int = 0
    ) -> None:
        super()._install(proposal, source=source, source_history_len=0)
