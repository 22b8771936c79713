"""PROTOCOL.md §4 as executable checks, run by the simulator after every step.

The checker watches the durable effects and state changes every node produces, keeps a
reference synced order (the longest seen), and raises ``InvariantViolation`` the moment
any rule breaks, naming the rule by its number in PROTOCOL.md §4.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from txsync.protocol import NodeId, TxId, TxMeta, TxState, ViewProposal, is_allowed_transition


class InvariantViolation(Exception):
    def __init__(self, invariant: int, message: str) -> None:
        super().__init__(f"invariant {invariant} ({INVARIANT_NAMES[invariant]}): {message}")
        self.invariant = invariant


INVARIANT_NAMES = {
    0: "a component refused or asserted",
    1: "prefix consistency",
    2: "no duplicates",
    3: "no loss",
    4: "executability",
    5: "liveness",
    6: "monotonicity",
    7: "workers",
    8: "one view per view number",
    9: "persist before send",
}


class InvariantChecker:
    def __init__(self, nodes: Iterable[NodeId]) -> None:
        self._reference: list[TxId] = []
        self._synced_ids: dict[NodeId, set[TxId]] = {n: set() for n in nodes}
        self._synced_len: dict[NodeId, int] = {n: 0 for n in self._synced_ids}
        self._counter: dict[NodeId, int] = {n: 0 for n in self._synced_ids}
        self._states: dict[NodeId, dict[TxId, TxState]] = {n: {} for n in self._synced_ids}
        self._acked_pending: dict[NodeId, set[TxId]] = {n: set() for n in self._synced_ids}
        self.acked: dict[TxId, NodeId] = {}
        self._views: dict[int, ViewProposal] = {}
        self.latest_view: ViewProposal | None = None
        self._view_no: dict[NodeId, int] = {n: 0 for n in self._synced_ids}
        self._posted_counter: dict[NodeId, int] = {n: 0 for n in self._synced_ids}
        self._own_posted: dict[NodeId, set[TxId]] = {n: set() for n in self._synced_ids}

    @property
    def views_installed(self) -> int:
        return len(self._views)

    @property
    def reference_len(self) -> int:
        return len(self._reference)

    # --- fed by the simulator as effects are applied --------------------------------------

    def on_synced(
        self, node: NodeId, start_len: int, metas: Iterable[TxMeta], body_held_somewhere: bool
    ) -> None:
        if start_len != self._synced_len[node]:
            length = self._synced_len[node]
            raise InvariantViolation(6, f"{node} appended at {start_len} to a queue {length} long")
        ids = self._synced_ids[node]
        position = start_len
        for meta in metas:
            if meta.tx_id in ids:
                raise InvariantViolation(2, f"{node} synced {meta.tx_id} twice")
            if not body_held_somewhere:
                raise InvariantViolation(4, f"{node} synced {meta.tx_id} whose body no node holds")
            if position < len(self._reference):
                if self._reference[position] != meta.tx_id:
                    raise InvariantViolation(
                        1,
                        f"{node} has {meta.tx_id} at position {position}, "
                        f"another node has {self._reference[position]}",
                    )
            else:
                self._reference.append(meta.tx_id)
            ids.add(meta.tx_id)
            self._acked_pending[node].discard(meta.tx_id)
            position += 1
        self._synced_len[node] = position

    def on_state(self, node: NodeId, tx_id: TxId, state: TxState) -> None:
        states = self._states[node]
        current = states.get(tx_id)
        if not is_allowed_transition(current, state):
            name = current.name if current else "unknown"
            raise InvariantViolation(6, f"{node}: tx {tx_id} moved {name} -> {state.name}")
        states[tx_id] = state

    def on_forgotten(self, node: NodeId, tx_ids: Iterable[TxId]) -> None:
        """A node forgot incoming metas of an origin that left its view (PROTOCOL.md §3):
        the node may learn them again later, as if for the first time."""
        states = self._states[node]
        for tx_id in tx_ids:
            if self.acked.get(tx_id) == node:
                raise InvariantViolation(3, f"origin {node} forgot its acknowledged tx {tx_id}")
            if states.get(tx_id) is not TxState.INCOMING:
                raise InvariantViolation(6, f"{node} forgot {tx_id} in state {states.get(tx_id)}")
            del states[tx_id]

    def on_adopted(  # noqa: PLR0917 (the simulator's one call names each)
        self,
        node: NodeId,
        length: int,
        tx_id: TxId,
        state: TxState,
        forgotten: Iterable[TxId],
        own_synced: Iterable[TxId],
    ) -> None:
        """``node`` started past a copy of another DC's worker at position ``length``,
        whose entry is ``tx_id``, applied in ``state``, forgetting the foreign incoming
        metas ``forgotten`` and dropping its own ``own_synced`` (the copy says they are
        synced): it counts as having synced the reference's first ``length`` entries,
        so that syncing one of them again is a duplicate (invariant 2), as is holding
        one of them incoming still (``check_node``); each of ``own_synced`` must be
        among them."""
        reference = self._reference
        if length > len(reference) or reference[length - 1] != tx_id:
            found = reference[length - 1] if length <= len(reference) else None
            raise InvariantViolation(
                1, f"{node} adopted {tx_id} at position {length}, the order has {found}"
            )
        if length <= self._synced_len[node]:
            raise InvariantViolation(
                6, f"{node} adopted position {length} holding {self._synced_len[node]}"
            )
        self.on_forgotten(node, forgotten)
        below = set(reference[:length])
        for own in own_synced:
            if own not in below:
                raise InvariantViolation(
                    3, f"{node} dropped its {own} as synced before {length}: it is not"
                )
        ids = self._synced_ids[node]
        for position in range(self._synced_len[node], length):
            ids.add(reference[position])
            self._acked_pending[node].discard(reference[position])
        self._synced_len[node] = length
        self._states[node][tx_id] = state

    def on_view(self, node: NodeId, installed: ViewProposal) -> None:
        """Every node that installs view ``n`` installs the same members and seal."""
        view_no = installed.view.view_no
        if view_no <= self._view_no[node]:
            raise InvariantViolation(
                6, f"{node} installed view {view_no} while in view {self._view_no[node]}"
            )
        self._view_no[node] = view_no
        known = self._views.setdefault(view_no, installed)
        if self.latest_view is None or view_no > self.latest_view.view.view_no:
            self.latest_view = installed
        if known != installed:
            raise InvariantViolation(
                8, f"view {view_no}: {node} installed {installed}, not {known}"
            )

    def on_restart(self, node: NodeId, durable_counter: int) -> None:
        """A node restarts from its durable state: a counter it raised in memory but never
        wrote (nor, if its shell is right, sent) is gone with the crash."""
        self._counter[node] = durable_counter

    def on_post_sent(self, node: NodeId, counter: int, own: Iterable[TxMeta]) -> None:
        """``node`` sent a post with ``counter``, holding its own transactions ``own``.
        A post's counter promises that no transaction of the sender at or below it is
        missing from where the post's queue puts it (the seal of a view change cuts each
        post at its counter; docs/protocol.md): so an own transaction the node holds for
        the first time at a post has a timestamp above every counter it posted before,
        in any incarnation."""
        posted = self._own_posted[node]
        before = self._posted_counter[node]
        for meta in own:
            if meta.tx_id in posted:
                continue
            if meta.ts <= before:
                raise InvariantViolation(
                    6, f"{node} holds its tx {meta.tx_id} at ts {meta.ts}, at or below "
                    f"counter {before} it posted without it",
                )  # fmt: skip
            posted.add(meta.tx_id)
        self._posted_counter[node] = max(before, counter)

    def on_acked(self, node: NodeId, tx_id: TxId) -> None:
        self.acked[tx_id] = node
        if tx_id not in self._synced_ids[node]:
            self._acked_pending[node].add(tx_id)

    # --- checked after every step ---------------------------------------------------------

    def check_node(
        self,
        node: NodeId,
        *,
        counter: int,
        synced_len: int,
        incoming_ids: Collection[TxId],
        synced_pending: Collection[TxId] = (),
    ) -> None:
        """``synced_pending``: appended by the core, on their way to the disk."""
        if counter < self._counter[node]:
            before = self._counter[node]
            raise InvariantViolation(6, f"{node} counter went from {before} to {counter}")
        self._counter[node] = counter
        if synced_len != self._synced_len[node]:
            raise InvariantViolation(
                6, f"{node} synced length {synced_len}, but it persisted {self._synced_len[node]}"
            )
        synced = self._synced_ids[node]
        both = next((tx for tx in incoming_ids if tx in synced), None)
        if both is not None:
            raise InvariantViolation(2, f"{node} holds {both} both synced and incoming")
        lost = next(
            (
                tx
                for tx in self._acked_pending[node]
                if tx not in incoming_ids and tx not in synced_pending
            ),
            None,
        )
        if lost is not None:
            raise InvariantViolation(3, f"origin {node} dropped acknowledged tx {lost} unsynced")

    def acked_left_with_removed(self, configured: Collection[NodeId]) -> int:
        """Transactions acknowledged at a node since removed and never synced: they left
        with it (``check_converged``)."""
        synced = set(self._reference)
        return sum(
            1 for tx, origin in self.acked.items() if origin not in configured and tx not in synced
        )

    def check_converged(self, nodes: Iterable[NodeId], origins: Collection[NodeId]) -> None:
        """After healing: every tx acknowledged at one of ``origins`` (the configured
        nodes: a removed node's unsynced transactions leave with it) is synced at every
        one of ``nodes``, at one position."""
        for node in nodes:
            if self._synced_len[node] != len(self._reference):
                raise InvariantViolation(
                    5, f"{node} has {self._synced_len[node]} of {len(self._reference)} synced"
                )
            missing = next(
                (
                    tx
                    for tx, origin in self.acked.items()
                    if origin in origins and tx not in self._synced_ids[node]
                ),
                None,
            )
            if missing is not None:
                raise InvariantViolation(3, f"acknowledged tx {missing} never synced at {node}")

    def state_of(self, node: NodeId, tx_id: TxId) -> TxState | None:
        return self._states[node].get(tx_id)
