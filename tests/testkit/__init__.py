"""Deterministic, offline building blocks for tests, benchmarks and the local demo."""
