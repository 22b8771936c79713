"""Sending to one peer DC (``PeerLink``): the coordinator's loop hands it posts, body
pushes and other messages, and its own task writes them on one long-lived ``Exchange``
stream, in order, so that the loop never waits on a peer. What is sent, in what order,
and what the stream's answers acknowledge is its ``PeerQueue``'s (``peer_queue.py``, a
pure machine). Also the mutual TLS files the links and the peer server use
(``TlsFiles``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc
from opentelemetry import context as otel_context

from txsync.protocol import Post
from txsync.rpc import new_channel
from txsync.sync_coordinator.peer_queue import OtherMessage, PeerQueue
from txsync.telemetry import attached
from txsync.v1 import (
    peer_pb2,
    peer_pb2_grpc,
)

log = logging.getLogger(__name__)

PEER_CHANNEL_OPTIONS = [
    # gRPC's default reconnect backoff grows to 120 s: after a long partition a healed
    # peer could stay unreached for minutes. Rounds need it back within a few seconds.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
STREAM_RETRY_MIN_S = 0.05
STREAM_RETRY_MAX_S = 2.0
"""Backoff before a peer's stream is opened again after one that never answered failed:
doubling from the least to the most (as the channel's reconnect backoff)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM bytes for mutual TLS between DCs: our CA, this node's certificate and key."""

    ca: bytes
    cert: bytes
    key: bytes

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )


class PeerLink:
    """Sends to one peer from its own task, so that the loop never waits on a peer, on one
    long-lived ``Exchange`` stream, in order: what to send, and in what order, is its
    ``PeerQueue``'s to decide (bodies ahead of posts, the newest post per base, posts as
    deltas, bounded queues, acknowledgements); this adapter writes it.

    The stream's own flow control holds the sender back when the peer reads slowly;
    meanwhile the queue takes newer posts and drops the oldest of the rest. A stream that
    fails (the peer went away, refused a message) is opened again after a backoff."""

    def __init__(self, node_id: str, address: str, tls: TlsFiles | None) -> None:
        self.node_id = node_id
        if tls is None:
            self._channel = new_channel(address, options=PEER_CHANNEL_OPTIONS)
        else:
            # The peer's certificate must name its node id, whatever address we dial.
            self._channel = new_channel(
                address,
                tls.channel_credentials(),
                options=[*PEER_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", node_id)],
            )
        self.stub = peer_pb2_grpc.PeerServiceStub(self._channel)
        self.queue = PeerQueue()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0
        """Streams that ended in an error."""
        self._answers = 0
        """Post answers received, over all streams (a stream that answered worked)."""
        self.outcomes_sent = 0
        """The last of our finished outcomes put on a post to this peer."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"to-{self.node_id}")

    def post(self, message: peer_pb2.PostRequest, post: Post) -> None:
        """Queue ``post`` (``message`` is it without its queue, with the outcomes)."""
        self.queue.post(message, post)
        self._wakeup.set()

    def send(self, message: OtherMessage) -> None:
        self.queue.send(message)
        self._wakeup.set()

    def push(self, sender: str, push: peer_pb2.PushBodyRequest) -> None:
        self.queue.push(sender, push)
        self._wakeup.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._channel.close()

    async def _run(self) -> None:
        backoff_s = STREAM_RETRY_MIN_S
        while True:
            while not self.queue.pending():  # a stream is opened when there is something to send
                self._wakeup.clear()
                await self._wakeup.wait()
            answered_before = self._answers
            try:
                await self._stream()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
                self.failed += 1
                code = error.code().name if isinstance(error, grpc.aio.AioRpcError) else error
                log.debug("to %s: stream ended: %s", self.node_id, code)
            self.queue.stream_ended()
            if self._answers != answered_before:
                backoff_s = STREAM_RETRY_MIN_S  # it worked for a while: try again at once
            else:
                # A backoff, not a poll: the peer is down or refuses us, and opening a
                # stream per message would spin.
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, STREAM_RETRY_MAX_S)

    async def _stream(self) -> None:
        """One stream, written until it fails: the reader's end wakes the writer."""
        # Opened outside any trace: the stream outlives whatever span was current, and
        # its messages carry their own trace context (a post its round's, a body its
        # transaction's).
        with attached(otel_context.Context()):
            call = self.stub.Exchange()
        self.queue.stream_opened()
        reader = asyncio.get_running_loop().create_task(self._read_answers(call))
        try:
            while not reader.done():
                if not self.queue.pending():
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await call.write(self.queue.next_message())
                self.sent += 1
            await reader  # its error, if it failed
        finally:
            if reader.done() and not reader.cancelled():
                reader.exception()  # retrieved: the write's error is the one raised
            reader.cancel()
            call.cancel()

    async def _read_answers(self, call: _PeerStream) -> None:
        try:
            async for answer in call:
                self._answers += 1
                self.queue.answered(answer)
                if answer.whole_needed:
                    self._wakeup.set()  # the post goes again
        finally:
            self._wakeup.set()  # the writer sees the stream is over


_PeerStream = grpc.aio.StreamStreamCall[peer_pb2.ExchangeRequest, peer_pb2.ExchangeResponse]
