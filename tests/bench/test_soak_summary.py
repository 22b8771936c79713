"""The soak's summary reads its samples and the stores' rotations right."""

from __future__ import annotations

from datetime import datetime

from bench.soak import Results, Rotation, Sample, first_rotations

STARTED = datetime(2026, 12, 2, 18, 25, 0).timestamp()


def _sample(at_s: float, store_rss: dict[str, float]) -> Sample:
    rss = {f"{dc} transaction-store": mib for dc, mib in store_rss.items()}
    return Sample(at_s, "load long", int(at_s * 100), rss, {}, None, 0)


def _rotation(dc: str, ended_s: float, took_ms: int, kept: int) -> Rotation:
    logged = datetime.fromtimestamp(STARTED + ended_s).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return Rotation(dc, logged, took_ms, 10, 0, kept)


def test_each_stores_first_rotation_is_framed_by_the_samples_around_it() -> None:
    """The sample before a rotation began and the first after it ended, per store; the
    later rotations and the other stores' samples play no part."""
    samples = [
        _sample(10, {"dc1": 70, "dc2": 69}),
        _sample(20, {"dc1": 71, "dc2": 70}),  # dc1's first rotation runs 21-23 s
        _sample(30, {"dc1": 84, "dc2": 71}),
        _sample(40, {"dc1": 85, "dc2": 83}),  # dc2's runs 31-39 s
        _sample(50, {"dc1": 95, "dc2": 84}),
    ]
    rotations = [
        _rotation("dc1", 44, 1000, 7000),  # logged first, but not its first
        _rotation("dc1", 23, 2000, 6000),
        _rotation("dc2", 39, 8000, 5000),
    ]
    results = Results(samples=samples, rotations=rotations, started_unix=STARTED)
    said = first_rotations(results)
    assert "dc1 71 -> 84 MiB (history 2,000, 6,000 kept)" in said
    assert "dc2 71 -> 83 MiB (history 3,000, 5,000 kept)" in said
    assert first_rotations(Results(samples=samples)) == ""
