"""TLS on the transaction-store's client port, and for the clients that call it (issue 17).

The store serves its client port over TLS when given a certificate and key
(``--tls-cert``, ``--tls-key``); with ``--tls-client-ca`` every client must also present a
certificate that CA signed, whose common name the access file can map to a role. Over
plaintext it refuses bearer tokens from anywhere but loopback, unless the operator says
the network is trusted (``--allow-plaintext-tokens``): a token sent in clear can be read
by anyone on the path. Clients (the CLI) verify the store with ``--tls-ca`` and may
present a certificate of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc


def read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise OSError(f"cannot read {what} {path}: {error.strerror}") from None


def server_credentials(cert: bytes, key: bytes, client_ca: bytes | None) -> grpc.ServerCredentials:
    """TLS for a server. With ``client_ca`` every client must present a certificate it
    signed (gRPC for Python cannot ask for one and take calls without), which identifies
    the caller; tokens still work on top."""
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def channel_credentials(
    ca: bytes, cert: bytes | None = None, key: bytes | None = None
) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def is_secure(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    return b"ssl" in (context.auth_context().get("transport_security_type") or [])


def is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``,
    ``unix:...``) is this machine."""
    return peer.startswith(("ipv4:127.", "ipv6:[::1]", "unix:"))
