"""A/Bs and studies: one-off comparisons of models, decoders and measurements (docs/benchmarks.md)."""
