"""``txsync access secret``: the one access secret every DC's release names."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate

from txsync.access import AccessPolicy, Role


def _secret(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsync.cli.main", "access", "secret", *arguments],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_secret_is_valid_kubernetes_and_its_file_names_its_tokens(tmp_path: Path) -> None:
    made = _secret("--namespace", "txsync")
    assert made.returncode == 0, made.stderr
    manifest: dict[str, Any] = json.loads(made.stdout)
    kubernetes_validate.validate(manifest, "1.30", strict=True)
    assert manifest["metadata"] == {
        "name": "txsync-access", "namespace": "txsync",
        "labels": {"app.kubernetes.io/part-of": "txsync"},
    }  # fmt: skip
    data = manifest["stringData"]
    assert data["service-token"] != data["admin-token"]
    assert min(len(data["service-token"]), len(data["admin-token"])) >= 40
    (tmp_path / "access.toml").write_text(data["access.toml"])
    policy = AccessPolicy.load(tmp_path / "access.toml")
    for role, token in ((Role.SERVICE, data["service-token"]), (Role.ADMIN, data["admin-token"])):
        caller = policy.caller_of_token(token)
        assert caller is not None and caller.role is role, (role, caller)
        assert hashlib.sha256(token.encode()).hexdigest() in data["access.toml"]
    assert policy.caller_of_token("not-a-token") is None
    again = json.loads(_secret().stdout)["stringData"]
    assert again["admin-token"] != data["admin-token"], "every run makes new tokens"


def test_a_bad_name_is_refused_with_the_rule() -> None:
    refused = _secret("--name", "Access_Secret")
    assert refused.returncode == 2 and not refused.stdout
    assert "not a Kubernetes name" in refused.stderr, refused.stderr
