"""A running DC's txlog and rounds read through its admin API (no Spark here: executors
call this, one store each).

``ExportLog`` streams the store's current txlog file as it is on disk (whole frames), so
its rows are exactly those ``txlog_rows`` reads from a data directory, without needing the
directory: the DC may run on another machine or in a pod. Files truncated away
(``bak-*``) are not sent; read them from the data directory. Rounds live only in the
coordinator's memory (its last 1000), so ``ListRounds`` is their only source: a
``rounds`` row is ``(dc, round_no, started_unix_ms, duration_ms, posts_sent,
posts_received, added, empty, idle, outcome)``.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from txsync.client.connection import Tls, channel_options, token_metadata
from txsync.client.endpoints import Endpoint
from txsync.pipeline.txlog_rows import Row, rows_of_payloads
from txsync.transaction_store.txlog.framing import scan
from txsync.v1 import admin_pb2, admin_pb2_grpc

CALL_TIMEOUT_S = 10.0
EXPORT_TIMEOUT_S = 600.0
"""A whole log's stream; a large log over a slow link takes a while."""
NO_COORDINATOR = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
"""How a store answers ``ListRounds`` when its coordinator is down, or when it has none."""
ROUNDS_KEPT = 1000
"""What a coordinator keeps and ``ListRounds`` returns at most."""


def rows_of_store(
    address: str, token: str = "", tls: Tls | None = None, dc: str = ""
) -> Iterator[tuple[str, Row]]:
    """Every row of the DC whose transaction-store answers at ``address``, tagged with
    its dataset's name: its txlog's rows, then its coordinator's recent rounds (none
    when its coordinator does not answer: the log is still the DC's). Over TLS when
    ``tls`` is given (``dc`` fills a ``{dc}`` name template), as the client library
    connects."""
    metadata = token_metadata(token)
    endpoint = Endpoint(address, dc)
    options = channel_options(endpoint, tls)
    with (
        grpc.insecure_channel(address, options=options)
        if tls is None
        else grpc.secure_channel(address, tls.credentials(), options=options)
    ) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        status = stub.GetStatus(
            admin_pb2.GetStatusRequest(), timeout=CALL_TIMEOUT_S, metadata=metadata
        )
        dc = status.local.node_id
        chunks = stub.ExportLog(
            admin_pb2.ExportLogRequest(), timeout=EXPORT_TIMEOUT_S, metadata=metadata
        )
        payloads = (payload for chunk in chunks for _, payload in scan(chunk.records).frames)
        yield from rows_of_payloads(dc, payloads)
        try:
            rounds = stub.ListRounds(
                admin_pb2.ListRoundsRequest(limit=ROUNDS_KEPT),
                timeout=CALL_TIMEOUT_S,
                metadata=metadata,
            ).rounds
        except grpc.RpcError as error:
            if error.code() not in NO_COORDINATOR:
                raise
            return  # its coordinator is down or unknown: the log's rows are all there is
        for info in rounds:
            yield (
                "rounds",
                (
                    dc,
                    info.round_no,
                    info.started.ToMilliseconds(),
                    info.duration.ToNanoseconds() / 1e6,
                    info.posts_sent,
                    info.posts_received,
                    info.added,
                    info.empty,
                    info.idle,
                    info.outcome,
                ),
            )
