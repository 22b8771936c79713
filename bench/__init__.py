"""Benchmarks: each prints its figures; none asserts a time (see docs/benchmarks)."""
