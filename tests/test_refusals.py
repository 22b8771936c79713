"""The rules' refusals, by kind, and the gRPC status each is answered with (issue 53:
the mapping lives at the gRPC edge, ``rpc``, and nowhere else)."""

from __future__ import annotations

import grpc

from txsync.refusals import Refusal, Refused
from txsync.rpc import STATUS_OF_REFUSED, ServiceError, service_error


def test_every_kind_of_refusal_has_its_status() -> None:
    assert set(STATUS_OF_REFUSED) == set(Refused)
    # A client tells these apart by status: they must not collapse into one.
    assert STATUS_OF_REFUSED[Refused.OVERLOADED] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert STATUS_OF_REFUSED[Refused.INVALID] is grpc.StatusCode.INVALID_ARGUMENT
    assert STATUS_OF_REFUSED[Refused.TRUNCATED] is grpc.StatusCode.FAILED_PRECONDITION


def test_a_refusal_keeps_its_sentence_and_retry_hint_as_a_status() -> None:
    refusal = Refusal(Refused.OVERLOADED, "9 transactions wait (limit 8)", retry_after_ms=250)
    error = service_error(refusal)
    assert (error.code, error.message, error.retry_after_ms) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "9 transactions wait (limit 8)",
        250,
    )
    already = ServiceError(grpc.StatusCode.NOT_FOUND, "no such tx")
    assert service_error(already) is already
