"""Releases of TxSync side by side: this checkout and the previous release, whose source
is taken from git history and run by this checkout's Python environment.

The compatibility promise (docs/operations.md, "Upgrades") is tested on real processes:
a DC is upgraded or rolled back by stopping its services and starting the other
release's on the same data. pyproject.toml's ``[tool.txsync]`` names the release before
this one by version and commit; ``TXSYNC_PREVIOUS_RELEASE=COMMIT`` runs the same tests
against any other commit.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.support.chart import ROOT

CLI = ["-m", "txsync.cli.main"]


@dataclass(frozen=True)
class Release:
    name: str
    commit: str | None
    """None: this checkout."""

    def unpack(self, into: Path) -> Path | None:
        """The release's ``services/`` (what ``txsync`` imports) under ``into``, from git
        history; None for this checkout, which runs from the installed package."""
        if self.commit is None:
            return None
        try:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", "--format=tar", self.commit, "services"],
                check=True, capture_output=True, timeout=120,
            ).stdout  # fmt: skip
        except subprocess.CalledProcessError as error:
            raise RuntimeError(
                f"release {self.name} ({self.commit}) is not in this clone's history "
                f"(a shallow clone? `git fetch --unshallow`): {error.stderr.decode()}"
            ) from None
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")
        return into / "services"

    def image(self, into: Path) -> str:
        """The release's container image, built offline by its own scripts/build_image.sh
        from its tree (unpacked under ``into``) with this checkout's Python, and tagged
        with its commit; this checkout's is ``txsync:dev``."""
        if self.commit is None:
            return "txsync:dev"
        tree = into / "tree"
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", self.commit],
            check=True, capture_output=True, timeout=120,
        ).stdout  # fmt: skip
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        tag = f"txsync:{self.commit[:12]}"
        subprocess.run(
            [str(tree / "scripts" / "build_image.sh"), tag], check=True, cwd=tree,
            env={**os.environ, "PYTHON": sys.executable}, timeout=1200,
        )  # fmt: skip
        return tag

    def command(self, services: Path | None, args: list[str]) -> list[str]:
        """``txsync ARGS`` as this release runs it. ``env`` sets the import path and then
        becomes the service (exec: the same process, so stopping it and the parent watch
        work as for any service)."""
        if services is None:
            return [sys.executable, *CLI, *args]
        return ["env", f"PYTHONPATH={services}", sys.executable, *CLI, *args]


CURRENT = Release("this checkout", None)


def previous_release() -> Release:
    """The release ``[tool.txsync]`` of pyproject.toml names (also what ``make lint``'s
    ``buf breaking`` checks against), or ``TXSYNC_PREVIOUS_RELEASE``'s commit."""
    chosen = os.environ.get("TXSYNC_PREVIOUS_RELEASE")
    if chosen:
        return Release(chosen, chosen)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["txsync"]
    return Release(project["previous-release"], project["previous-release-commit"])
