"""The project's API: what params.yaml names, read and built as the pipeline builds it, for the stages, the
benchmarks, the experiments and the tools (none of them reaches into another's internals).

Import the submodule you need: `params` (reading params.yaml), `backend` (the cost backend over the recorded
lookups), `tasks` (drawing task families), `costs` (the collected cost data and its split), `cost_network` (the
cost network's fit), `learners` (what the learned sharders train on), `evaluation` (the evaluated tasks and sharders). This
package imports none of them, so each stage depends only on the parts it uses (dvc.yaml follows imports).
"""
