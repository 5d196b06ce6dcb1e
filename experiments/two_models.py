"""Can two cost models pick between `dreamshard_cut`'s plan and NeuroShard's? Each task's two plans are rated by
DreamShard's cost network and by NeuroShard's models; the plan both rate cheaper on balance (the geometric mean of
the two models' ratios of NeuroShard's plan over `dreamshard_cut`'s below 1) is kept; beside it, the pick of TorchRec's
perf model (`torchrec_full`'s rating, the fallback's judge). No new measurement: the
measured costs come from a `benchmarks.cut_designs --peer` pass over the same tasks (its tasks.csv, the `params`
variant being `dreamshard_cut` as the project plans; its summary.json beside it names the peer of each family).

    python -m experiments.two_models --root ROOT --measured DIR/tasks.csv [--families ...] [--tasks 12]

Validation tasks only (the tasks cut_designs measured). Prints per family the mean ratio to the TorchRec peer (the
pass's own choice) of each plan, of the kept one and of the better of
the two as measured, and the Kendall tau of each model's ratio against the measured one.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("."), help="project with data/ and models/ from make run")
    parser.add_argument("--measured", type=Path, required=True, help="tasks.csv of a cut_designs --peer pass")
    parser.add_argument("--families", default="dlrm-20-4,dlrm-40-4,dlrm-40-8,dlrm-80-8,dlrm-80-16")
    parser.add_argument("--tasks", type=int, default=12, help="tasks per family, as the pass measured")
    args = parser.parse_args()
    from dreamshard.project.backend import huge_pages_from_params

    huge_pages_from_params(str(args.root / "params.yaml"))  # before torch is imported
    import numpy as np
    import pandas as pd
    import torch

    from benchmarks.cut_designs import PEER, project_at
    from dreamshard.project.evaluation import make_sharders
    from dreamshard.project.learning import kendall_tau
    from dreamshard.project.params import build
    from dreamshard.project.sharders import SearchConfig, load_model, make_sharder
    from dreamshard.project.tasks import read_split

    torch.set_num_threads(1)
    params, model, base = project_at(args.root)
    cut = make_sharder("dreamshard_cut", model=model, cuts=base)
    ns = make_sharder("neuroshard", model=load_model("neuroshard", params["paths"]["neuroshard_model"]),
                      search=build(SearchConfig, params["neuroshard"], "neuroshard"))
    judge = make_sharders(params, int(params["backend"]["batch_size"]), names=["torchrec_full"])[0]
    measured = pd.read_csv(args.measured).pivot_table(index="task", columns="sharder", values="cost_ms")
    missing = {"params", "neuroshard", *PEER} - set(measured.columns)
    if missing:
        raise SystemExit(f"{args.measured}: column sharder: expected rows of {sorted(missing)} (a cut_designs --peer "
                         "pass whose variants include params)")
    summary = args.measured.parent / "summary.json"
    peer = json.loads(summary.read_text()).get("peer", {})
    families = args.families.split(",")
    if set(families) - set(peer):
        raise SystemExit(f"{summary}: peer: expected a TorchRec peer for each of {families}, got {peer}")
    tasks = [t for f in families for t in [t for t in read_split(params, "validation") if t.family == f][:args.tasks]]
    rows = []
    for task in tasks:
        if task.name not in measured.index:
            raise SystemExit(f"{args.measured}: task {task.name!r} not measured there (same --families and --tasks?)")
        plans = {"cut": cut.shard(task), "ns": ns.shard(task)}
        by_cut = cut.own_ms(task, plans["ns"]) / cut.own_ms(task, plans["cut"])
        by_ns = ns.own_ms(task, plans["ns"]) / ns.own_ms(task, plans["cut"])
        by_torchrec = judge.rating_ms(task, plans["ns"]) / judge.rating_ms(task, plans["cut"])
        cost = measured.loc[task.name]
        rows.append({"family": task.family, "cut": cost["params"], "ns": cost["neuroshard"], "by_cut": by_cut,
                     "by_ns": by_ns, "by_torchrec": by_torchrec, "keep_ns": np.sqrt(by_cut * by_ns) < 1})
    table = pd.DataFrame(rows)
    table["peer"] = [measured.loc[t.name, peer[t.family]] for t in tasks]
    table["kept"] = np.where(table["keep_ns"], table["ns"], table["cut"])
    table["torchrec_kept"] = np.where(table["by_torchrec"] < 1, table["ns"], table["cut"])
    table["better"] = np.minimum(table["cut"], table["ns"])
    columns = ["cut", "ns", "kept", "torchrec_kept", "better"]
    ratios = table[columns].div(table["peer"], axis=0).assign(family=table["family"])
    print("mean ratio to the TorchRec peer (`cut`: dreamshard_cut, `ns`: neuroshard, `kept`: the two models' pick, "
          "`torchrec_kept`: TorchRec's perf model's pick, `better`: the cheaper as measured)")
    print(ratios.groupby("family", sort=False).mean().round(3).to_string())
    print("all tasks:", ratios[columns].mean().round(3).to_dict())
    print("NeuroShard's plan kept, by family:", table.groupby("family", sort=False)["keep_ns"].sum().to_dict())
    true = (table["ns"] / table["cut"]).to_numpy()
    print(f"Kendall tau against the measured ratio: cost network {kendall_tau(table['by_cut'].to_numpy(), true):.2f}, "
          f"NeuroShard's models {kendall_tau(table['by_ns'].to_numpy(), true):.2f}, "
          f"TorchRec's perf model {kendall_tau(table['by_torchrec'].to_numpy(), true):.2f}")


if __name__ == "__main__":
    main()
