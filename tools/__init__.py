"""Helpers that are not measurements: the stages on a GPU machine, keeping and continuing long runs (docs/benchmarks.md)."""
