"""The protocol core does no I/O, reads no clock and draws no random numbers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import txsync.protocol

CORE_DIR = Path(txsync.protocol.__file__).parent
ALLOWED_IMPORTS = {
    "__future__",
    "bisect",
    "collections.abc",
    "dataclasses",
    "enum",
    "itertools",
    "typing",
}
FORBIDDEN_MODULES = {
    "asyncio", "grpc", "logging", "random", "secrets", "selectors", "socket", "sqlite3",
    "ssl", "subprocess", "threading", "time", "uuid", "datetime", "os",
}  # fmt: skip


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_core_imports_only_pure_modules() -> None:
    files = sorted(CORE_DIR.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        foreign = {
            name
            for name in _imports(path)
            if name not in ALLOWED_IMPORTS and not name.startswith("txsync.protocol")
        }
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_importing_the_core_loads_no_io_clock_or_randomness() -> None:
    probe = (
        "import sys; before = set(sys.modules); import txsync.protocol; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "txsync.protocol.node" in loaded
    assert not FORBIDDEN_MODULES.intersection(loaded), FORBIDDEN_MODULES.intersection(loaded)
