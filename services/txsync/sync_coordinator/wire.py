"""Protocol messages on the wire: posts and catch-up <-> ``txsync.v1`` peer messages
(the shared types come from ``txsync.codec``).

Decoding never trusts the peer: anything malformed raises ``WireError`` with a reason
that names the field, and the caller answers INVALID_ARGUMENT. Semantic checks (sorted
queues, counters, sizes) stay with the core's ``validation`` module, which the decoder
runs too so that a refused message is refused before it reaches the core.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from txsync.codec import (
    MetaInterner,
    WireError,
    ballot_from_proto,
    ballot_to_proto,
    base_from_proto,
    base_to_proto,
    check_node_id,
    check_number,
    meta_from_proto,
    meta_to_proto,
    metas_from_proto,
    proposal_from_proto,
    proposal_to_proto,
)
from txsync.protocol import (
    Limits,
    Post,
    SyncedEntries,
    ViewAccept,
    ViewAccepted,
    ViewInstall,
    ViewMessage,
    ViewPrepare,
    ViewPromise,
    ViewQuery,
    ViewRefused,
)
from txsync.protocol.validation import post_problem, synced_entries_problem
from txsync.sync_coordinator.post_deltas import KnownPosts, delta_of
from txsync.v1 import peer_pb2

__all__ = [  # the shared codec's names stay importable from here
    "WireError",
    "base_from_proto",
    "base_to_proto",
    "check_node_id",
    "decode_entries",
    "decode_post",
    "entries_from_proto",
    "entries_to_proto",
    "meta_from_proto",
    "meta_to_proto",
    "post_from_proto",
    "post_to_proto",
    "set_post_queue",
    "view_message_from_proto",
    "view_message_to_proto",
]


class UnknownReference(WireError):
    """A post names an earlier post (``delta_from_seq``) this node does not hold: not
    malformed, but undecodable here (the receiver asks for the whole queue)."""


def post_to_proto(post: Post, *, with_queue: bool = True) -> peer_pb2.PostRequest:
    """The post; without its queue when the sender's link fills that in
    (``set_post_queue``: whole, or as a change to an earlier post the peer holds)."""
    message = peer_pb2.PostRequest(
        view_no=post.view_no,
        sender=post.sender,
        epoch=post.epoch,
        seq=post.seq,
        base=base_to_proto(post.base),
        counter=post.counter,
    )
    if with_queue:
        set_post_queue(message, post, None)
    return message


def set_post_queue(message: peer_pb2.PostRequest, post: Post, reference: Post | None) -> bool:
    """Fill in ``post``'s queue, as a change to ``reference`` (an earlier post of the same
    sender that the peer holds, we expect) where that is shorter (``post_deltas``).
    Whether it went as a change."""
    queue = post.queue
    delta = None
    if reference is not None and reference.epoch == post.epoch:
        delta = delta_of(reference.queue, queue)
    del message.queue[:]
    message.queue_len = len(queue)
    if delta is None:
        message.delta_from_seq = message.delta_skip = message.delta_keep = 0
        message.queue.extend(meta_to_proto(meta) for meta in queue)
        return False
    assert reference is not None and reference.seq > 0
    skip, keep = delta
    message.delta_from_seq, message.delta_skip, message.delta_keep = reference.seq, skip, keep
    message.queue.extend(meta_to_proto(meta) for meta in queue[keep:])
    return True


def post_from_proto(
    message: peer_pb2.PostRequest,
    limits: Limits,
    known: KnownPosts | None = None,
    interner: MetaInterner | None = None,
) -> Post:
    """Decode and check a post; one sent as a change is rebuilt from the post it names,
    which ``known`` must hold (UnknownReference otherwise). Its metas come through
    ``interner`` when given (one object per meta in the receiving process)."""
    if len(message.queue) > limits.post_txs_max:
        raise WireError(f"queue: {len(message.queue)} metas exceed {limits.post_txs_max}")
    sender = check_node_id(message.sender, "sender")
    epoch = check_number(message.epoch, "epoch")
    queue = metas_from_proto(message.queue, "queue", interner)
    if message.delta_from_seq:
        reference = None if known is None else known.queue_of(sender, epoch, message.delta_from_seq)
        if reference is None:
            raise UnknownReference(f"post {epoch}/{message.delta_from_seq} of {sender}")
        skip, keep = message.delta_skip, message.delta_keep
        if skip + keep > len(reference):
            raise WireError(
                f"delta: entries {skip}..{skip + keep} of a post of {len(reference)} metas"
            )
        queue = reference[skip : skip + keep] + queue
    if len(queue) != message.queue_len:
        raise WireError(f"queue_len: {message.queue_len}, but the queue holds {len(queue)}")
    post = Post(
        view_no=check_number(message.view_no, "view_no"),
        sender=sender,
        epoch=epoch,
        seq=check_number(message.seq, "seq"),
        base=base_from_proto(message.base),
        counter=check_number(message.counter, "counter"),
        queue=queue,
    )
    problem = post_problem(post, limits)
    if problem is not None:
        raise WireError(problem)
    return post


def entries_to_proto(entries: SyncedEntries) -> peer_pb2.SendSyncedEntriesRequest:
    return peer_pb2.SendSyncedEntriesRequest(
        view_no=entries.view_no,
        sender=entries.sender,
        start=base_to_proto(entries.start),
        entries=[meta_to_proto(meta) for meta in entries.entries],
    )


def entries_from_proto(
    message: peer_pb2.SendSyncedEntriesRequest,
    limits: Limits,
    interner: MetaInterner | None = None,
) -> SyncedEntries:
    if len(message.entries) > limits.catchup_entries_max:
        raise WireError(f"entries: {len(message.entries)} exceed {limits.catchup_entries_max}")
    entries = SyncedEntries(
        view_no=check_number(message.view_no, "view_no"),
        sender=check_node_id(message.sender, "sender"),
        start=base_from_proto(message.start, "start"),
        entries=metas_from_proto(message.entries, "entries", interner),
    )
    problem = synced_entries_problem(entries, limits)
    if problem is not None:
        raise WireError(problem)
    return entries


def decode_post(data: bytes, limits: Limits, known: KnownPosts | None = None) -> Post:
    """Parse and check a serialized ``PostRequest`` (used where raw bytes arrive)."""
    message = peer_pb2.PostRequest()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise WireError(f"not a PostRequest: {error}") from None
    return post_from_proto(message, limits, known)


def decode_entries(data: bytes, limits: Limits) -> SyncedEntries:
    """Parse and check a serialized ``SendSyncedEntriesRequest``."""
    message = peer_pb2.SendSyncedEntriesRequest()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise WireError(f"not a SendSyncedEntriesRequest: {error}") from None
    return entries_from_proto(message, limits)


def view_message_to_proto(message: ViewMessage) -> peer_pb2.SendViewMessageRequest:
    request = peer_pb2.SendViewMessageRequest(sender=message.sender)
    match message:
        case ViewPrepare(_, ballot):
            request.prepare.CopyFrom(ballot_to_proto(ballot))
        case ViewPromise(_, ballot, base, counter, queue, accepted_ballot, accepted):
            promise = request.promise
            promise.ballot.CopyFrom(ballot_to_proto(ballot))
            promise.base.CopyFrom(base_to_proto(base))
            promise.counter = counter
            promise.queue.extend(meta_to_proto(meta) for meta in queue)
            if accepted_ballot is not None and accepted is not None:
                promise.accepted_ballot.CopyFrom(ballot_to_proto(accepted_ballot))
                promise.accepted.CopyFrom(proposal_to_proto(accepted))
        case ViewAccept(_, ballot, proposal):
            request.accept.ballot.CopyFrom(ballot_to_proto(ballot))
            request.accept.proposal.CopyFrom(proposal_to_proto(proposal))
        case ViewAccepted(_, ballot):
            request.accepted.CopyFrom(ballot_to_proto(ballot))
        case ViewInstall(_, proposal, history_len):
            request.install.CopyFrom(proposal_to_proto(proposal))
            request.install_history_len = history_len
        case ViewRefused(_, ballot, view_no, promised):
            request.refused.ballot.CopyFrom(ballot_to_proto(ballot))
            request.refused.view_no = view_no
            if promised is not None:
                request.refused.promised.CopyFrom(ballot_to_proto(promised))
        case ViewQuery(_, view_no):
            request.query_view_no = view_no
    return request


def view_message_from_proto(
    request: peer_pb2.SendViewMessageRequest, limits: Limits
) -> ViewMessage:
    """Shape and sizes only; the core judges whether the message makes sense."""
    sender = check_node_id(request.sender, "sender")
    kind = request.WhichOneof("message")
    if kind == "prepare":
        return ViewPrepare(sender, ballot_from_proto(request.prepare, "prepare"))
    if kind == "promise":
        promise = request.promise
        if len(promise.queue) > limits.post_txs_max:
            raise WireError(
                f"promise.queue: {len(promise.queue)} metas exceed {limits.post_txs_max}"
            )
        accepted = promise.HasField("accepted_ballot")
        return ViewPromise(
            sender,
            ballot_from_proto(promise.ballot, "promise.ballot"),
            base_from_proto(promise.base, "promise.base"),
            check_number(promise.counter, "promise.counter"),
            metas_from_proto(promise.queue, "promise.queue"),
            ballot_from_proto(promise.accepted_ballot, "promise.accepted_ballot")
            if accepted
            else None,
            proposal_from_proto(promise.accepted, "promise.accepted") if accepted else None,
        )
    if kind == "accept":
        return ViewAccept(
            sender,
            ballot_from_proto(request.accept.ballot, "accept.ballot"),
            proposal_from_proto(request.accept.proposal, "accept.proposal"),
        )
    if kind == "accepted":
        return ViewAccepted(sender, ballot_from_proto(request.accepted, "accepted"))
    if kind == "install":
        return ViewInstall(
            sender, proposal_from_proto(request.install, "install"), request.install_history_len
        )
    if kind == "refused":
        refused = request.refused
        promised = (
            ballot_from_proto(refused.promised, "refused.promised")
            if refused.HasField("promised")
            else None
        )
        return ViewRefused(
            sender,
            ballot_from_proto(refused.ballot, "refused.ballot"),
            check_number(refused.view_no, "refused.view_no"),
            promised,
        )
    if kind == "query_view_no":
        return ViewQuery(sender, check_number(request.query_view_no, "query_view_no"))
    raise WireError("message: none of prepare, promise, accept, accepted, install, refused, query")
