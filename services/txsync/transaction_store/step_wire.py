"""The store's side of the internal API's protobuf for protocol steps, state changes and
the protocol's state: requests decoded to the rules' types (``step_rules``), answers
encoded from them. Pure: the gRPC servicer (``service.py``) and the simulator's store
(``sim/store.py``) both go through it, so the simulator runs the very conversions the
services do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from txsync.codec import (
    WireError,
    base_from_proto,
    base_to_proto,
    check_number,
    meta_from_proto,
    meta_to_proto,
    metas_from_proto,
    proposal_from_proto,
    proposal_to_proto,
    vote_from_proto,
    vote_to_proto,
)
from txsync.ids import tx_id_problem
from txsync.protocol import MergeBase, TxMeta, TxState
from txsync.transaction_store.state import ABSENT_SYNCED_MAX
from txsync.transaction_store.step_rules import (
    BaseAdoption,
    ProtocolState,
    ProtocolStep,
    StateChangeRequest,
)
from txsync.transaction_store.validation import (
    check_state,
    check_traceparent,
    check_tx_id,
    invalid,
)
from txsync.v1 import common_pb2, store_pb2

_STATES = {state.value: state for state in TxState}


def step_from_proto(request: store_pb2.PersistStepRequest) -> ProtocolStep:
    """A coordinator's step as the rules take it; a malformed field is refused as
    INVALID_ARGUMENT, naming it."""
    start = None
    if request.HasField("synced_start"):
        start = MergeBase(request.synced_start.synced_len, request.synced_start.last_tx_id)
    try:
        installed_view = (
            proposal_from_proto(request.installed_view, "installed_view")
            if request.HasField("installed_view")
            else None
        )
        vote = vote_from_proto(request.vote) if request.HasField("vote") else None
    except WireError as error:
        raise invalid(str(error)) from None
    return ProtocolStep(
        counter=request.counter,
        local_seq=request.local_seq,
        incoming=metas_from_request(request.incoming, "incoming"),
        synced_start=start,
        synced=metas_from_request(request.synced, "synced"),
        changes=changes_from_proto(request.state_changes),
        service=request.service or "sync-coordinator",
        forgotten=list(request.forgotten),
        installed_view=installed_view,
        vote=vote,
        bodies=[
            (b.tx_id, b.body, b.digest, check_traceparent(b.traceparent)) for b in request.bodies
        ],
    )


def metas_from_request(messages: Sequence[common_pb2.TxMeta], field: str) -> list[TxMeta]:
    for index, message in enumerate(messages):
        if message.ts == 0:
            raise invalid(f"{field}[{index}]: a meta needs a positive ts")
    try:
        return list(metas_from_proto(messages, field))
    except WireError as error:
        raise invalid(str(error)) from None


def changes_from_proto(messages: Iterable[store_pb2.StateChange]) -> list[StateChangeRequest]:
    changes: list[StateChangeRequest] = []
    for change in messages:
        tx_id, state = change.tx_id, change.state
        if tx_id_problem(tx_id, "") is not None or state not in _STATES:
            index = len(changes)  # name the field only for the one that is refused
            check_tx_id(tx_id, f"changes[{index}].tx_id")
            check_state(state, f"changes[{index}].state")
        changes.append(
            StateChangeRequest(
                tx_id=tx_id,
                state=_STATES[state],
                outcome=change.outcome if change.HasField("outcome") else None,
                at_unix_ms=change.at_unix_ms,
            )
        )
    return changes


def protocol_state_to_proto(
    node_id: str, loaded: ProtocolState
) -> store_pb2.LoadProtocolStateResponse:
    response = store_pb2.LoadProtocolStateResponse(
        node_id=node_id,
        counter=loaded.counter,
        epoch=loaded.epoch,
        merge_base=base_to_proto(loaded.merge_base),
        synced_tail=[meta_to_proto(m) for m in loaded.synced_tail],
        synced_unacquired=[meta_to_proto(m) for m in loaded.synced_unacquired],
        history_len=loaded.history_len,
    )
    for meta, acquired in loaded.incoming:
        response.incoming.add(meta=meta_to_proto(meta), acquired=acquired)
    if loaded.view is not None:
        response.view.CopyFrom(proposal_to_proto(loaded.view))
    if loaded.vote is not None:
        response.vote.CopyFrom(vote_to_proto(loaded.vote))
    return response


SYNCED_OWN_MAX = 2 * ABSENT_SYNCED_MAX
"""Own transactions a copy may name: those listed for an absent DC (at most
``ABSENT_SYNCED_MAX``) and as many again from the history the source holds."""


def adoption_to_proto(adoption: BaseAdoption) -> common_pb2.BaseAdoption:
    message = common_pb2.BaseAdoption(
        meta=meta_to_proto(adoption.meta),
        before=base_to_proto(adoption.before),
        final_state=common_pb2.TxState.ValueType(adoption.final_state.value),
        counter=adoption.counter,
    )
    for position, tx_id in adoption.synced_own:
        message.synced_own.add(position=position, tx_id=tx_id)
    return message


def adoption_from_proto(message: common_pb2.BaseAdoption) -> BaseAdoption:
    """A copy's description as a peer's store gave it (through two dispatches and two
    coordinators); a malformed field is refused as INVALID_ARGUMENT, naming it."""
    if len(message.synced_own) > SYNCED_OWN_MAX:
        raise invalid(f"synced_own: at most {SYNCED_OWN_MAX} per copy")
    try:
        meta = meta_from_proto(message.meta, "meta")
        before = base_from_proto(message.before, "before")
    except WireError as error:
        raise invalid(str(error)) from None
    q = before.synced_len + 1
    synced_own = []
    for i, entry in enumerate(message.synced_own):
        if not 0 < entry.position <= q:
            raise invalid(f"synced_own[{i}].position: {entry.position} is not in 1-{q}")
        synced_own.append((entry.position, check_tx_id(entry.tx_id, f"synced_own[{i}].tx_id")))
    return BaseAdoption(
        meta=meta,
        before=before,
        final_state=check_state(message.final_state, "final_state"),
        counter=check_number(message.counter, "counter"),
        synced_own=tuple(synced_own),
    )
