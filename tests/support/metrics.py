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


def quantile(text: str, histogram: str, q: float, **labels: str) -> float:
    """The ``q`` quantile of ``histogram`` (its ``_bucket`` series with ``labels``, summed
    over the rest), interpolated within a bucket as Prometheus's ``histogram_quantile``."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == f"{histogram}_bucket" and labels.items() <= found.labels.items():
                bound = float(found.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + float(found.value)
    if not buckets or buckets[float("inf")] == 0:
        raise AssertionError(f"no observations of {histogram} {labels}")
    bounds = sorted(buckets)
    rank = q * buckets[float("inf")]
    lower, below = 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower  # Prometheus answers the highest finite bound
            return lower + (bound - lower) * (rank - below) / (buckets[bound] - below)
        lower, below = bound, buckets[bound]
    return lower
