"""The coordinator's side of the store's internal API: the durable state it starts from,
decoded, and each merged write, encoded as a ``PersistSteps`` step. Pure: the
coordinator and the simulator (``sim/store.py``) both go through it, so the simulator
runs the very conversions the services do."""

from __future__ import annotations

from txsync.codec import (
    base_to_proto,
    meta_from_proto,
    meta_to_proto,
    proposal_from_proto,
    proposal_to_proto,
    vote_from_proto,
    vote_to_proto,
)
from txsync.protocol import IMPLIED_STATES, DurableState
from txsync.sync_coordinator.effects import MergedPersist
from txsync.v1 import common_pb2, store_pb2

SERVICE = "sync-coordinator"
"""The service named in the history of the states a coordinator writes."""


def durable_from_proto(state: store_pb2.LoadProtocolStateResponse) -> DurableState:
    vote = vote_from_proto(state.vote) if state.HasField("vote") else None
    return DurableState(
        counter=state.counter,
        epoch=state.epoch,
        synced_len=state.merge_base.synced_len,
        synced_tail=tuple(meta_from_proto(m) for m in state.synced_tail),
        incoming=tuple((meta_from_proto(e.meta), e.acquired) for e in state.incoming),
        synced_unacquired=tuple(meta_from_proto(m) for m in state.synced_unacquired),
        view=proposal_from_proto(state.view, "view") if state.HasField("view") else None,
        promised=vote.promised if vote is not None else None,
        accepted_ballot=vote.accepted_ballot if vote is not None else None,
        accepted=vote.accepted if vote is not None else None,
        history_len=state.history_len,
    )


def persist_request(merged: MergedPersist) -> store_pb2.PersistStepRequest:
    request = store_pb2.PersistStepRequest(
        counter=merged.counter,
        incoming=[meta_to_proto(m) for m in merged.incoming],
        synced=[meta_to_proto(m) for m in merged.synced],
        # The store makes the core's INCOMING, ACCEPTED and ENQUEUED itself, from the
        # metas, synced append and bodies it records: those are not sent.
        state_changes=[
            store_pb2.StateChange(tx_id=c.tx_id, state=common_pb2.TxState.ValueType(c.state.value))
            for c in merged.changes
            if c.state not in IMPLIED_STATES
        ],
        service=SERVICE,
        local_seq=merged.local_seq,
        bodies=[
            store_pb2.StoreBodyRequest(
                tx_id=b.tx_id, body=b.body, digest=b.digest, traceparent=b.traceparent
            )
            for b in merged.bodies
        ],
    )
    if merged.synced_start is not None:
        request.synced_start.CopyFrom(base_to_proto(merged.synced_start))
    request.forgotten.extend(merged.forgotten)
    if merged.installed is not None:
        request.installed_view.CopyFrom(proposal_to_proto(merged.installed))
    if merged.vote is not None:
        request.vote.CopyFrom(vote_to_proto(merged.vote))
    return request
