"""How the client and admin commands find the cluster, and what they share.

``--endpoints`` is either the ``cluster.json`` that ``txsync dev up`` writes (every DC's
addresses; ``--dc`` picks one, default the first) or HOST:PORT of one DC's
transaction-store, the DC's front door for both the client and the admin API
(comma-separate several DCs' stores). It defaults to ``$TXSYNC_ENDPOINTS``, else
``data/cluster.json``. ``--token`` (default ``$TXSYNC_TOKEN``) is sent as a bearer token
when the cluster requires one; ``--tls-ca`` (default ``$TXSYNC_TLS_CA``) turns TLS on.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from txsync.client.connection import server_name_for
from txsync.client.endpoints import Endpoint, EndpointError, resolve
from txsync.tls import channel_credentials, read_pem

if TYPE_CHECKING:
    from txsync.client import Client, Tls

DEFAULT_ENDPOINTS = "data/cluster.json"
TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Target:
    dc: str
    """The DC's name ("" when only an address was given)."""
    address: str
    """Its transaction-store: client and admin API."""


def add_connection_arguments(
    parser: argparse.ArgumentParser, outputs: Sequence[str] = ("table", "json")
) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--endpoints",
        default=os.environ.get("TXSYNC_ENDPOINTS", DEFAULT_ENDPOINTS),
        help="cluster.json of `txsync dev up`, or [DC=]HOST:PORT[,...] of DCs' "
        "transaction-stores, DC= naming each (default: $TXSYNC_ENDPOINTS, else "
        "data/cluster.json)",
    )
    group.add_argument("--dc", help="which DC of the endpoints to ask (default: the first)")
    group.add_argument(
        "--token",
        default=os.environ.get("TXSYNC_TOKEN", ""),
        help="bearer token, when the cluster requires one (default: $TXSYNC_TOKEN)",
    )
    add_tls_arguments(group)
    parser.add_argument("-o", "--output", choices=outputs, default=outputs[0])


def add_tls_arguments(group: argparse._ActionsContainer) -> None:
    """``--tls-ca``, ``--tls-server-name``, ``--tls-cert``, ``--tls-key`` (defaults from
    the ``TXSYNC_TLS_*`` variables), as every command that reaches a store takes them."""
    group.add_argument(
        "--tls-ca",
        type=Path,
        default=os.environ.get("TXSYNC_TLS_CA") or None,
        help="CA (PEM) to check the stores' TLS certificates with: TLS is used when given "
        "(default: $TXSYNC_TLS_CA)",
    )
    group.add_argument(
        "--tls-server-name",
        default=os.environ.get("TXSYNC_TLS_SERVER_NAME") or None,
        help="the name the store's certificate must carry, when not its address's host; "
        "{dc} stands for each DC's name (the chart's certificates name their DC: give "
        "'{dc}' with a cluster file or DC=HOST:PORT endpoints) "
        "(default: $TXSYNC_TLS_SERVER_NAME)",
    )
    group.add_argument(
        "--tls-cert",
        type=Path,
        default=os.environ.get("TXSYNC_TLS_CERT") or None,
        help="a client certificate (PEM) that identifies you (default: $TXSYNC_TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        type=Path,
        default=os.environ.get("TXSYNC_TLS_KEY") or None,
        help="its private key (default: $TXSYNC_TLS_KEY)",
    )


def tls_of(options: argparse.Namespace) -> Tls | None:
    """The client library's ``Tls`` from the TLS options (the files read now, so that the
    PEM travels as bytes: to a Spark executor, say); None without ``--tls-ca``."""
    from txsync.client import Tls  # noqa: PLC0415 - only the commands that connect

    ca: Path | None = getattr(options, "tls_ca", None)
    if ca is None:
        return None
    if (options.tls_cert is None) != (options.tls_key is None):
        fail("give both --tls-cert and --tls-key, or neither")
    try:
        return Tls(
            read_pem(ca, "CA"),
            read_pem(options.tls_cert, "certificate") if options.tls_cert else None,
            read_pem(options.tls_key, "key") if options.tls_key else None,
            options.tls_server_name,
        )
    except OSError as error:
        fail(str(error))


def targets_of(endpoints: str) -> list[Target]:
    """The DCs ``endpoints`` names: a cluster.json, store addresses, or a DNS name
    (``txsync.client.endpoints``)."""
    try:
        return [Target(e.dc, e.address) for e in resolve(endpoints)]
    except EndpointError as error:
        fail(str(error))


def all_targets(options: argparse.Namespace) -> list[Target]:
    """Every DC the endpoints name, the ``--dc`` one first (only it, if given)."""
    endpoints: str = options.endpoints
    targets = targets_of(endpoints)
    if options.dc and not any(t.dc for t in targets):
        fail("--dc needs DCs by name: a cluster file, or DC=HOST:PORT endpoints")
    if options.dc:
        chosen = [t for t in targets if t.dc == options.dc]
        if not chosen:
            fail(f"no DC {options.dc!r} in {endpoints} (it has {', '.join(t.dc for t in targets)})")
        return chosen
    return targets


def target(options: argparse.Namespace) -> Target:
    return all_targets(options)[0]


def client_of(options: argparse.Namespace, **settings: Any) -> Client:
    """The client library on the connection options: every DC the endpoints name, the
    ``--dc`` one first (the others are where it fails over to)."""
    from txsync.client import Client  # noqa: PLC0415 - only the commands that submit or read

    all_targets(options)  # the same checks and messages as the other commands
    tls = tls_of(options)
    try:
        return Client(options.endpoints, dc=options.dc, token=options.token, tls=tls, **settings)
    except (EndpointError, ValueError) as error:
        fail(str(error))


def metadata(options: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    token: str = options.token
    return (("authorization", f"Bearer {token}"),) if token else ()


def channel(address: str, options: argparse.Namespace, dc: str = "") -> grpc.Channel:
    """A channel to DC ``dc``'s store: TLS when ``--tls-ca`` is given (the name its
    certificate carries: ``--tls-server-name``, ``{dc}`` filled), plaintext otherwise."""
    ca: Path | None = getattr(options, "tls_ca", None)
    if ca is None:
        return grpc.insecure_channel(address)
    cert: Path | None = options.tls_cert
    key: Path | None = options.tls_key
    if (cert is None) != (key is None):
        fail("give both --tls-cert and --tls-key, or neither")
    try:
        credentials = channel_credentials(
            read_pem(ca, "CA"),
            read_pem(cert, "certificate") if cert else None,
            read_pem(key, "key") if key else None,
        )
    except OSError as error:
        fail(str(error))
    settings = []
    try:
        name = server_name_for(options.tls_server_name or "", Endpoint(address, dc))
    except ValueError as error:
        fail(str(error))
    if name:
        settings.append(("grpc.ssl_target_name_override", name))
    return grpc.secure_channel(address, credentials, options=settings)


def describe(error: grpc.RpcError) -> str:
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if code is None or details is None:
        return str(error)
    return f"{code().name}: {details()}"


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    sys.stdout.flush()
