"""A/Bs and studies: model_ab compares models and decodings by their plans, cost_net studies the cost network
(docs/benchmarks.md)."""
