"""Reading a service's Prometheus endpoint in tests, with prometheus_client's parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(address: str) -> str:
    """The text of ``http://<address>/metrics``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as answer:
        text: str = answer.read().decode()
    return text


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` with ``labels`` among its labels."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and labels.items() <= found.labels.items():
                return float(found.value)
    raise AssertionError(f"no {name} {labels} in:\n{text}")


def series_without_dc(text: str, dc: str) -> list[str]:
    """Every sample whose ``dc`` label is not ``dc``."""
    return [
        f"{found.name}{found.labels}"
        for family in text_string_to_metric_families(text)
        for found in family.samples
        if found.labels.get("dc") != dc
    ]


def sample_names(text: str) -> set[str]:
    """The name of every sample (``x_bucket``, ``x_count``, ``y_total``, ...)."""
    return {
        found.name for family in text_string_to_metric_families(text) for found in family.samples
    }
