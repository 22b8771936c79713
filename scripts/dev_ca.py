#!/usr/bin/env python3
"""Create a development CA and a certificate per node, for mutual TLS between DCs.

    python scripts/dev_ca.py --out ./certs dc1 dc2 dc3

writes ``ca.pem`` and, per node, ``<node>.pem`` and ``<node>.key``. Each node certificate
names the node id as its subject CN and as a DNS name (coordinators check a peer's
certificate against its configured node id in both directions), plus ``localhost`` and
``127.0.0.1`` and any ``--host`` given, and may serve and dial (server and client auth).

For development and tests only: the CA key is left beside the certificates, unencrypted.
Production deployments bring their own CA (the Helm chart takes the files as a Secret).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "TxSync development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


Authority = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def make_ca(out: Path, name: str = "TxSync development CA") -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out / "ca.key", key)
    return cert, key


def make_node(
    out: Path,
    node_id: str,
    ca: Authority,
    hosts: list[str],
) -> None:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(node_id), x509.DNSName("localhost")]
    for host in ["127.0.0.1", *hosts]:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(node_id))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (out / f"{node_id}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out / f"{node_id}.key", key)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nodes", nargs="+", help="node ids to issue certificates for")
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument("--host", action="append", default=[], help="extra host name or IP")
    parser.add_argument("--ca-name", default="TxSync development CA")
    options = parser.parse_args()
    ca = make_ca(options.out, options.ca_name)
    for node in options.nodes:
        make_node(options.out, node, ca, options.host)
    print(f"wrote ca.pem and {len(options.nodes)} node certificate(s) to {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
