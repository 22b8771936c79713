"""What a channel to a DC needs, for both clients: TLS, options, the bearer token. (Kept
apart from ``async_client`` so that the blocking client does not load gRPC's asyncio
layer: every CLI command pays for what it imports.)"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from txsync.client.endpoints import Endpoint, resolve

MESSAGE_BYTES_MAX = 8 * 1024 * 1024
TOKEN_ENV = "TXSYNC_TOKEN"
DC_PLACEHOLDER = "{dc}"


@dataclass(frozen=True, slots=True)
class Tls:
    """TLS to the DCs' stores: the CA that signed their certificates, and optionally a
    certificate of the caller's own (PEM, as bytes or a path)."""

    ca: bytes | Path
    cert: bytes | Path | None = None
    key: bytes | Path | None = None
    server_name: str | None = None
    """The name the stores' certificates carry, when it is not their address's host.
    ``{dc}`` in it stands for each DC's name (from a cluster file or ``DC=HOST:PORT``
    endpoints): the chart's certificates name their DC, so ``"{dc}"`` reaches dc1 as
    ``dc1`` and, failing over, dc2 as ``dc2``; one fixed name would fail the second DC's
    handshake."""

    @classmethod
    def from_environment(cls) -> Tls | None:
        """TLS as the CLI takes it from the environment: ``$TXSYNC_TLS_CA`` (TLS on when
        set), ``$TXSYNC_TLS_CERT`` and ``$TXSYNC_TLS_KEY``, ``$TXSYNC_TLS_SERVER_NAME``.
        None when ``$TXSYNC_TLS_CA`` is not set."""
        ca = os.environ.get("TXSYNC_TLS_CA")
        if not ca:
            return None
        cert, key = os.environ.get("TXSYNC_TLS_CERT"), os.environ.get("TXSYNC_TLS_KEY")
        return cls(
            ca=Path(ca), cert=Path(cert) if cert else None, key=Path(key) if key else None,
            server_name=os.environ.get("TXSYNC_TLS_SERVER_NAME") or None,
        )  # fmt: skip

    def name_for(self, endpoint: Endpoint) -> str:
        """The name ``endpoint``'s certificate must carry ("": its address's host)."""
        return server_name_for(self.server_name or endpoint.server_name, endpoint)

    def credentials(self) -> grpc.ChannelCredentials:
        def pem(value: bytes | Path | None) -> bytes | None:
            return value.read_bytes() if isinstance(value, Path) else value

        if (self.cert is None) != (self.key is None):
            raise ValueError("give both a client certificate and its key, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=pem(self.ca), private_key=pem(self.key),
            certificate_chain=pem(self.cert),
        )  # fmt: skip


def server_name_for(name: str, endpoint: Endpoint) -> str:
    """``name`` with ``{dc}`` filled for ``endpoint`` (the client's and the CLI's rule);
    ValueError if the endpoint names no DC."""
    if DC_PLACEHOLDER not in name:
        return name
    if not endpoint.dc:
        raise ValueError(
            f"the TLS server name {name!r} has {DC_PLACEHOLDER}, and the endpoint "
            f"{endpoint.address} names no DC: give DC=HOST:PORT or a cluster file"
        )
    return name.replace(DC_PLACEHOLDER, endpoint.dc)


def check_names(tls: Tls | None, endpoints: list[Endpoint]) -> None:
    """Refuse now a name template the endpoints cannot fill (not at the first call)."""
    if tls is not None:
        for endpoint in endpoints:
            tls.name_for(endpoint)


def located(
    endpoints: str | Sequence[str] | None, prefer: str | None, tls: Tls | None
) -> list[Endpoint]:
    """``resolve`` again, as a client does after a round in which no DC answered (its
    cluster file read again, its DNS name looked up again), with every TLS name."""
    found = resolve(endpoints, prefer)
    check_names(tls, found)
    return found


def channel_options(endpoint: Endpoint, tls: Tls | None) -> list[tuple[str, int | str]]:
    """Messages up to 8 MiB both ways (as every TxSync service takes), and the name the
    DC's certificate must carry."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
        ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ]
    name = tls.name_for(endpoint) if tls is not None else ""
    if name:
        options.append(("grpc.ssl_target_name_override", name))
    return options


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The bearer token as call metadata (``token`` None: ``$TXSYNC_TOKEN``)."""
    token = os.environ.get(TOKEN_ENV, "") if token is None else token
    return (("authorization", f"Bearer {token}"),) if token else ()
