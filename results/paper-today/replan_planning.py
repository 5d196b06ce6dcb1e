"""Planning time of the full run's DreamShard, neuroshard_tw and neuroshard, planned again with the planning workers' BLAS
fix (stages/evaluate.py, commit 7d5a52f: threadpool_limits(1) in each worker), writing replan_planning_ms.csv.

Run in the run's workspace (a clone of 114872a, restored as results/paper-today/README.md says) after adding
`from threadpoolctl import threadpool_limits; threadpool_limits(1)` to its `_start_planner`:

    python replan_planning.py 2 replan_planning_ms.csv PROJECT/results/paper-today/run/state/eval_journal
        # 2 planning workers, as the run; 2 min on 2 cores

It plans every test task with the three sharders in 2 worker processes (the stage's Planner) and compares each
plan with the journal's (`same_plan`): the timings are of the same plans the run measured.
"""
import glob
import json
import sys

import pandas as pd
import torch
import yaml

from dreamshard.tasks import read_tasks
from stages.evaluate import Planner, make_sharders

SHARDERS = ["dreamshard", "neuroshard_tw", "neuroshard"]

if __name__ == "__main__":
    torch.set_num_threads(1)
    params = yaml.safe_load(open("params.yaml"))
    params["evaluate"]["sharders"] = SHARDERS
    sharders = make_sharders(params, 512)
    tasks = read_tasks("data/tasks/test.parquet", "data/tables.parquet")
    j = pd.concat(pd.read_parquet(f) for f in glob.glob(f"{sys.argv[3]}/task-*.parquet"))
    j = j[(j.split == "test") & j.algorithm.isin(SHARDERS)].set_index(["task", "algorithm"])
    with Planner(params, sharders, int(sys.argv[1])) as planner:
        out = planner.plan(tasks)
    rows = []
    for t, planned in zip(tasks, out):
        for x in planned:
            journaled = j.loc[(t.name, x.algorithm)]
            rows.append({"family": t.family, "algorithm": x.algorithm, "ms": x.planning_ms,
                         "journal_ms": float(journaled["planning_ms"]),
                         "same_plan": json.dumps(x.plan.to_dict()["shards"]) == journaled["shards"]})
    df = pd.DataFrame(rows)
    print(df.groupby(["family", "algorithm"], sort=False)
          .agg(p50=("ms", "median"), journal_p50=("journal_ms", "median"), same=("same_plan", "mean"))
          .round(2).to_string())
    df.to_csv(sys.argv[2], index=False)
