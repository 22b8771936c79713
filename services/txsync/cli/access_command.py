"""``txsync access secret``: one access identity for every DC.

A caller's bearer token is checked by each DC it reaches: the DC it calls, and the
others when that DC gathers for it (cluster-wide status, ``tx get`` at every DC). A chart
release that generated its own tokens knows only those, so with one such secret per DC
every other DC refuses the caller (docs/security.md, "Identity across DCs"). This command
makes the one secret all releases name in ``access.secretName``: a service token, an
admin token and the access file naming both by their SHA-256, as a Kubernetes Secret
(JSON, which ``kubectl apply -f`` reads as it reads YAML). Apply the same output in every
DC's cluster; the chart's multi-DC install refuses to generate per-release tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import secrets
import sys

DEFAULT_NAME = "txsync-access"
TOKEN_BYTES = 30
"""240 random bits per token (40 characters of URL-safe base64), as many as the
chart's generated tokens (40 alphanumerics, 238 bits)."""

_KUBERNETES_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

EPILOG = f"""\
examples:
  txsync access secret > access.json          # once, for every DC
  kubectl --context dc1 -n txsync apply -f access.json
  kubectl --context dc2 -n txsync apply -f access.json
  helm install ... --set access.secretName={DEFAULT_NAME}
  kubectl -n txsync get secret {DEFAULT_NAME} -o jsonpath='{{.data.admin-token}}' | base64 -d

The output holds the tokens themselves: keep it where you keep other secrets, or pipe it
straight into kubectl. Other callers (role client or reader) are added to access.toml in
the secret as [[token]] entries (docs/operations.md, "Access control").
"""


def access_file(service_token: str, admin_token: str) -> str:
    """The access file naming the two tokens by digest (what the chart generates)."""
    entries = (("service", "service", service_token), ("admin", "admin", admin_token))
    return "\n".join(
        f'[[token]]\nname = "{name}"\nrole = "{role}"\n'
        f'sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
        for name, role, token in entries
    )


def secret_manifest(name: str, namespace: str | None) -> dict[str, object]:
    """A Secret with new random tokens, in the keys the chart reads."""
    service_token = secrets.token_urlsafe(TOKEN_BYTES)
    admin_token = secrets.token_urlsafe(TOKEN_BYTES)
    metadata: dict[str, object] = {
        "name": name,
        "labels": {"app.kubernetes.io/part-of": "txsync"},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": {
            "service-token": service_token,
            "admin-token": admin_token,
            "access.toml": access_file(service_token, admin_token),
        },
    }


def run_secret(options: argparse.Namespace) -> int:
    for what, value in (("--name", options.name), ("--namespace", options.namespace)):
        if value is not None and not _KUBERNETES_NAME.fullmatch(value):
            print(
                f"error: {what} {value!r} is not a Kubernetes name (lower-case letters, "
                "digits, '-' and '.', starting and ending with a letter or digit)",
                file=sys.stderr,
            )
            return 2
    json.dump(secret_manifest(options.name, options.namespace), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "access",
        help="make the access secret every DC shares (tokens and access.toml)",
        description="Access control shared by every DC: one identity across DCs.",
    )
    actions = parser.add_subparsers(dest="access_command", metavar="ACTION", required=True)
    secret = actions.add_parser(
        "secret",
        help="print a new Kubernetes Secret (service and admin tokens, access.toml)",
        description=(
            "Print a Kubernetes Secret with a new random service token, a new admin token "
            "and the access file that names both, for every DC's release to name in "
            "access.secretName: one identity across DCs."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    secret.add_argument(
        "--name", default=DEFAULT_NAME, help=f"the Secret's name (default {DEFAULT_NAME})"
    )
    secret.add_argument(
        "--namespace",
        help="the Secret's namespace (default: none, so kubectl's -n or context decides)",
    )
    secret.set_defaults(handler=run_secret)
