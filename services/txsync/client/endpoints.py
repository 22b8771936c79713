"""Where the cluster is: the DCs a client may talk to, in the order it tries them.

Every DC's transaction-store is that DC's front door (client and admin API). A client is
told where they are in one of four ways, all resolved by ``resolve``:

* the ``cluster.json`` that ``txsync dev up`` writes (every DC by name);
* ``[DC=]HOST:PORT[,[DC=]HOST:PORT...]``: one store per DC, each named if ``DC=`` is
  given (so that ``prefer`` and a TLS name template, ``Tls.server_name``, can use it);
* one ``HOST:PORT`` whose name resolves to several addresses (as the chart's headless
  Services publish the DCs): one DC per address, ``dns:///`` in front to insist;
* nothing: ``$TXSYNC_ENDPOINTS``, else ``data/cluster.json``.

``prefer`` (a DC's name from a cluster file, or an address) puts that DC first; the
others follow, so a client fails over in a stable order.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ENDPOINTS_ENV = "TXSYNC_ENDPOINTS"
DEFAULT_CLUSTER_FILE = "data/cluster.json"
DNS_PREFIX = "dns:///"


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str
    """HOST:PORT of the DC's transaction-store."""
    dc: str = ""
    """The DC's name, when a cluster file gave it."""
    server_name: str = ""
    """The name its TLS certificate carries, when the address is an IP resolved from it."""

    def __str__(self) -> str:
        return f"{self.dc} ({self.address})" if self.dc else self.address


class EndpointError(ValueError):
    """The endpoints given name no DC (an unreadable cluster file, a malformed address,
    a name that does not resolve)."""


def resolve(
    endpoints: str | Sequence[str] | None = None, prefer: str | None = None
) -> list[Endpoint]:
    """The DCs ``endpoints`` names (module docstring), ``prefer`` first."""
    found = _named(endpoints)
    if not found:
        raise EndpointError("no endpoints: give a cluster.json or HOST:PORT of a DC's store")
    if prefer:
        chosen = [e for e in found if prefer in (e.dc, e.address)]
        if not chosen:
            names = ", ".join(str(e) for e in found)
            raise EndpointError(f"no DC {prefer!r} among the endpoints ({names})")
        found = chosen + [e for e in found if e not in chosen]
    return found


def looks_like_addresses(text: str) -> bool:
    """``[DC=]HOST:PORT[,...]`` (as opposed to a cluster file's path)."""
    return all(
        ":" in part and part.rsplit(":", 1)[1].isdigit() and not part.endswith(".json")
        for part in text.removeprefix(DNS_PREFIX).split(",")
    )


def _named_address(part: str) -> Endpoint:
    """``DC=HOST:PORT`` or ``HOST:PORT``."""
    dc, equals, address = part.strip().rpartition("=")
    if equals and not dc.strip():
        raise EndpointError(f"{part.strip()!r}: a DC's name before '=' (dc1=HOST:PORT)")
    return Endpoint(address.strip(), dc.strip())


def _named(endpoints: str | Sequence[str] | None) -> list[Endpoint]:
    if endpoints is None:
        endpoints = os.environ.get(ENDPOINTS_ENV) or DEFAULT_CLUSTER_FILE
    if not isinstance(endpoints, str):
        return [e for text in endpoints for e in _named(text)]
    text = endpoints.strip()
    if not looks_like_addresses(text):
        return _from_cluster_file(Path(text))
    if text.startswith(DNS_PREFIX) or (
        "," not in text and "=" not in text and not _is_ip(_host(text))
    ):
        return _from_dns(text.removeprefix(DNS_PREFIX))
    return [_named_address(part) for part in text.split(",") if part.strip()]


def _from_cluster_file(path: Path) -> list[Endpoint]:
    try:
        dcs = json.loads(path.read_text())["dcs"]
        return [Endpoint(str(dc["store"]), str(name)) for name, dc in dcs.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise EndpointError(
            f"cannot read the cluster file {path} (is the cluster up? `make run` writes "
            f"it): {error}"
        ) from None


def _from_dns(address: str) -> list[Endpoint]:
    """One endpoint per address ``address``'s name resolves to (IPv4 ones if it has any:
    a dual-stack host is one DC, not two); a name that resolves to one address stays a
    name, which gRPC resolves itself."""
    host, port = _host(address), address.rsplit(":", 1)[1]
    ips: list[str] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            answers = socket.getaddrinfo(host, int(port), family, socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        except (OSError, UnicodeError) as error:
            raise EndpointError(f"cannot resolve {host!r}: {error}") from None
        ips = sorted({str(answer[4][0]) for answer in answers})
        if ips:
            break
    if not ips:
        raise EndpointError(f"cannot resolve {host!r}: the name has no address")
    if len(ips) == 1:
        return [Endpoint(address)]
    return [Endpoint(_join(ip, port), server_name=host) for ip in ips]


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0].strip("[]")


def _join(ip: str, port: str) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _is_ip(host: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            continue
    return False
