"""docs/client.md's examples, run in order as one program against a real cluster: the
documentation cannot drift from what the library does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
EXAMPLE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_documented_examples_run(cluster_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    examples = EXAMPLE.findall(DOC.read_text())
    assert len(examples) >= 6, "docs/client.md lost its examples"
    monkeypatch.setenv("TXSYNC_ENDPOINTS", str(cluster_file))
    namespace: dict[str, object] = {"__name__": "docs_client"}
    for number, example in enumerate(examples, start=1):
        code = compile(example, f"{DOC.name} example {number}", "exec")
        exec(code, namespace)  # our own documentation, run as a test
