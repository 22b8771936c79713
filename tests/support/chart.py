"""Rendering helm/txsync with Helm's own engine (helm-python-sdk bundles it), for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "txsync"
EXAMPLES = ROOT / "k8s"


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Values files merged the way `helm -f a -f b` merges them (maps deeply, the rest
    replaced)."""
    result: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = merged(result[key], value)
            else:
                result[key] = value
    return result


def example_values(example: str, dc_file: str) -> dict[str, Any]:
    folder = EXAMPLES / example
    return merged(
        yaml.safe_load((folder / "cluster.yaml").read_text()),
        yaml.safe_load((folder / dc_file).read_text()),
    )


def render(values: dict[str, Any], release: str, namespace: str) -> list[dict[str, Any]]:
    """Every object the chart renders (tests included), parsed."""
    chart = helm_python.Chart.load(CHART)
    rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def notes(values: dict[str, Any], release: str, namespace: str) -> str:
    chart = helm_python.Chart.load(CHART)
    rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
