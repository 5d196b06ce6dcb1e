"""The project's API: the one way the stages, the pipeline, the benchmarks, the experiments and the tools reach the
library (tests/unit/test_layers.py holds it; none of them reaches into another's internals).

What params.yaml names, read and built as the pipeline builds it: `params` (reading params.yaml), `backend` (the
cost backend over the recorded lookups; the huge-pages setting before torch starts), `tasks` (drawing task
families), `costs` (the collected cost data and its split), `fit_data` (what the fits learn from), `cost_network`
(the cost network's fit), `learners` and `policy_training` (what the learned sharders train on, and how),
`evaluation` (the evaluated tasks and sharders, and `evaluation_setup`, the evaluate stage's whole setup).

The library's parts they use, one module per topic: `domain` (errors, files, tables, tasks, plans, the memory
model), `data`, `hardware`, `learning`, `sharders`, `evaluation` (bounds, measuring, the journal, summaries,
figures, reports), `collection` (collecting the cost data), `torchrec` (DreamShardPlanner; imports TorchRec),
`kernels` (the kernel measurements' reference tables).

Import the submodule you need. This package imports none of them, so each stage depends only on the parts it
uses (dvc.yaml follows imports).
"""
