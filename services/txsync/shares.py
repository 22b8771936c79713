"""Shared limits with a share per caller, so that one client cannot refuse the others.

A limit such as the store's 10,000 waiting calls protects the process, but a single
client that takes all of it refuses every other client (issue 48). ``Shares`` keeps a
quarter of each limit for the others: one caller may hold at most three quarters, so
however much one client asks, the rest still get in; a lone application still has most
of the room.

A caller is who access control says it is (the token's or certificate's name, which the
access interceptor records for the call: ``CALLER``), or, without access control, the
peer's host: clients on one machine share a share.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from txsync.refusals import Refusal, Refused

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("txsync_caller", default="")
"""The caller's name, set by the access interceptor before the handler runs."""

OTHERS_SHARE = 4
"""1 / OTHERS_SHARE of each limit is kept for the callers that do not hold the most."""


def caller_of(context: grpc.aio.ServicerContext[Any, Any] | None) -> str:
    """Who is calling: the access-control name, or the peer's host ("" for none)."""
    name = CALLER.get()
    if name:
        return name
    if context is None:
        return ""
    peer = context.peer() or ""
    host, _, _ = peer.rpartition(":")  # "ipv4:10.0.0.7:51234", "ipv6:[::1]:51234"
    return host or peer


class Shares:
    """``total`` of something (waits, reads, streams), at most ``total - total //
    OTHERS_SHARE`` of it held by one caller."""

    def __init__(self, what: str, total: int, *, retry_after_ms: int = 0) -> None:
        self.what = what
        self.total = total
        self.per_caller = max(1, total - total // OTHERS_SHARE)
        self.retry_after_ms = retry_after_ms
        self.used = 0
        self._held: dict[str, int] = {}

    def take(self, caller: str, count: int = 1) -> None:
        """Hold ``count`` more for ``caller``, or raise RESOURCE_EXHAUSTED naming the
        limit that refused (the whole, or this caller's share)."""
        held = self._held.get(caller, 0)
        if self.used + count > self.total:
            raise self._refusal(
                f"{self.used:,} {self.what} are in use here (at most {self.total:,})"
            )
        if held + count > self.per_caller:
            raise self._refusal(
                f"{caller or 'this caller'} holds {held:,} {self.what} here, the most one "
                f"caller may (a quarter of {self.total:,} is kept for others)"
            )
        self._held[caller] = held + count
        self.used += count

    def give_back(self, caller: str, count: int = 1) -> None:
        held = self._held.get(caller, 0) - count
        self.used -= count
        if held > 0:
            self._held[caller] = held
        else:
            self._held.pop(caller, None)

    @contextmanager
    def held(self, caller: str, count: int = 1) -> Iterator[None]:
        """``take`` for the block, given back however it ends."""
        self.take(caller, count)
        try:
            yield
        finally:
            self.give_back(caller, count)

    def holding(self, caller: str) -> int:
        return self._held.get(caller, 0)

    def _refusal(self, reason: str) -> Refusal:
        return Refusal(
            Refused.OVERLOADED,
            f"{reason}; retry later",
            retry_after_ms=self.retry_after_ms,
        )
