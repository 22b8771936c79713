"""Each service's command line, built in one place (issue 18).

``txsync dev up`` and the tests' process helpers (``tests/support/processes.py``) start
their services from these builders; a chart test renders the Helm chart and checks that
its containers pass the same flags (the values differ: pod addresses, mounted files), so
a flag added to a service and to one of them but not the other fails a test instead of a
deployment. ``listen`` None leaves ``--listen`` to the caller (the tests add it with a
port file); an optional argument left None is not passed (the service's default holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def store_args(
    node_id: str,
    data: str,
    listen: str | None,
    *,
    coordinator: str | None,
    dispatch: str | None = None,
    peer_stores: Mapping[str, str] | None = None,
    witness: bool = False,
    metrics_listen: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    args = ["transaction-store", "--node-id", node_id, "--data", data, *_listen(listen)]
    if coordinator:
        args += ["--coordinator", coordinator]
    if witness:
        args.append("--witness")
    elif dispatch:
        args += ["--dispatch", dispatch]
    for peer, address in (peer_stores or {}).items():
        args += ["--peer-store", f"{peer}={address}"]
    return [*args, *_metrics(metrics_listen), *extra]


def coordinator_args(
    node_id: str,
    store: str,
    listen: str | None,
    *,
    peers: Mapping[str, str],
    plaintext: bool = True,
    metrics_listen: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    args = ["sync-coordinator", "--node-id", node_id, "--store", store, *_listen(listen)]
    if plaintext:
        args.append("--plaintext")
    for peer, address in peers.items():
        args += ["--peer", f"{peer}={address}"]
    return [*args, *_metrics(metrics_listen), *extra]


def dispatch_args(
    store: str,
    listen: str | None,
    dc: str | None,
    *,
    workers: Mapping[str, str],
    metrics_listen: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    args = ["worker-dispatch", "--store", store, *_dc(dc), *_listen(listen)]
    args += [f"--worker={worker}={address}" for worker, address in workers.items()]
    return [*args, *_metrics(metrics_listen), *extra]


def worker_args(
    worker_id: str,
    dc: str | None,
    data: str | None,
    listen: str | None,
    *,
    postgres: str | None = None,
    metrics_listen: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """``postgres``: a conninfo, to apply to PostgreSQL instead of SQLite in ``data``."""
    database = ["--postgres", postgres] if postgres else ["--data", data or "."]
    args = ["worker", "--worker-id", worker_id, *_dc(dc), *database, *_listen(listen),
            *_metrics(metrics_listen)]  # fmt: skip
    return [*args, *extra]


def _listen(listen: str | None) -> list[str]:
    return ["--listen", listen] if listen else []


def _dc(dc: str | None) -> list[str]:
    return ["--dc", dc] if dc else []


def _metrics(listen: str | None) -> list[str]:
    return ["--metrics-listen", listen] if listen else []


def flags(args: Sequence[str]) -> set[str]:
    """The flags a command line passes (``--name`` of ``--name value`` and ``--name=value``)."""
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
