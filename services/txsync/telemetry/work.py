"""Counts of the work a process does, to divide by the transactions it handled.

Issue 20 asks what a transaction costs in fsyncs, log entries, body files, body encodes
and decodes, thread hops and gRPC messages, per service; ``make bench-rpcs`` reads these
counts from every process's ``/metrics`` before and after a loaded window and prints them
per transaction.

The counts are plain integers in one process-wide object (like ``prometheus_client``'s
default registry): an increment costs tens of nanoseconds, far below the work it counts,
so they are always on. Threads increment some of them (the txlog writer's fsyncs); a
lost increment under a race would only make a benchmark figure one lower.

gRPC messages are counted where every served method's messages pass anyway
(``txsync.rpc.add_service``): received requests and sent responses, by method, at the
server. Every message between TxSync processes has a server at one end, so summing the
servers of a cluster counts each message once.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import ParamSpec, TypeVar

FSYNCS = "fsyncs"
"""``fsync`` calls: txlog appends, body files and their directories."""
LOG_BATCHES = "log_batches"
"""Frames handed to the txlog's group-commit writer (each one ``LogBatch``)."""
LOG_ENTRIES = "log_entries"
"""Entries in those frames."""
STATE_ENTRIES = "state_entries"
"""Of those, entries that move one transaction's state (``TxStateChanged``)."""
BODY_FILES = "body_files"
"""Body files written (gzip, the seed's on-disk layout)."""
THREAD_HOPS = "thread_hops"
"""Calls handed to a worker thread (``asyncio.to_thread``) and awaited."""
DB_COMMITS = "db_commits"
"""Transactions committed to a worker's database (including position-only ones)."""
STAMPS_RENEWED = "stamps_renewed"
"""Local submits the coordinator stamped anew: its counter had passed the store's stamp
(each costs the write and fsync the stamp saves)."""
STAMPS_AT_CLOCK = "stamps_at_clock"
"""Calls whose local submits the store stamped at least at its wall clock (under load:
``TransactionStore._stamp_clock_us``)."""
BODY_ENCODES = "body_encodes"
"""Transaction bodies serialized: each submitted body, by the store it was submitted to
(a retry's again, before it is found to be one); nobody else encodes a body."""
BODY_DECODES = "body_decodes"
"""Transaction bodies parsed: a submit's, as its request is read; a peer's, as the
coordinator and the store check it; a worker's, to apply it; a body read for a client."""
REQUESTS_DECODED_LATE = "requests_decoded_late"
"""Requests a handler decoded itself once it had room (``txsync.rpc.decode_request``)."""
SUBMIT_BATCHES_QUEUED = "submit_batches_queued"
"""``SubmitBatch`` calls that waited, undecoded, for another's staging to end (the
store's ``SUBMIT_BATCHES_STAGED``)."""
INLINE_WRITES = "inline_writes"
"""txlog writes made on the event loop's thread, not handed to a worker thread (a quiet
store: ``GroupCommitWriter``)."""

KINDS = (
    FSYNCS, LOG_BATCHES, LOG_ENTRIES, STATE_ENTRIES, BODY_FILES, THREAD_HOPS, DB_COMMITS,
    STAMPS_RENEWED, STAMPS_AT_CLOCK, INLINE_WRITES, BODY_ENCODES, BODY_DECODES,
    REQUESTS_DECODED_LATE, SUBMIT_BATCHES_QUEUED,
)  # fmt: skip

counts: collections.Counter[str] = collections.Counter()
"""Work done so far in this process, by kind (one of ``KINDS``)."""
received: collections.Counter[str] = collections.Counter()
"""gRPC messages received by this process's servers, by method name."""
sent: collections.Counter[str] = collections.Counter()
"""gRPC messages sent by this process's servers (responses, stream messages), by method."""
received_bytes: collections.Counter[str] = collections.Counter()
"""Bytes of those messages received, by method; a stream of several kinds of message (a
``oneof message``, as ``Exchange``) by method and kind, e.g. ``Exchange.post``."""
sent_bytes: collections.Counter[str] = collections.Counter()
"""Bytes of those messages sent, by method."""


def count(kind: str, n: int = 1) -> None:
    counts[kind] += n


Params = ParamSpec("Params")
Result = TypeVar("Result")


async def in_thread(
    function: Callable[Params, Result], *args: Params.args, **kwargs: Params.kwargs
) -> Result:
    """``asyncio.to_thread``, counted as a thread hop."""
    counts[THREAD_HOPS] += 1
    return await asyncio.to_thread(function, *args, **kwargs)


async def in_pool(
    pool: Executor, function: Callable[Params, Result], *args: Params.args, **kwargs: Params.kwargs
) -> Result:
    """``function`` on a thread of ``pool`` (threads kept apart from the default ones),
    counted as a thread hop."""
    counts[THREAD_HOPS] += 1
    return await asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(function, *args, **kwargs)
    )
