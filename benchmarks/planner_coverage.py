"""Does the default `DreamShardPlanner()` plan every case that TorchRec's planner or one of our greedy sharders plans?

    python -m benchmarks.planner_coverage [--out results/planner-coverage] [--ranks 1,2,4,8,16,32,64]
                                          [--hbm-gib 0.05,0.2,1,4,16,80]

Two models on the meta device: MLPerf DLRM-DCNv2's 26 tables (benchmarks.mlperf_dcnv2) and a small one of 12
tables (100 to 2M rows, dims 16 to 128). For each number of ranks (one host) and HBM per rank, each planner plans
the model with TorchRec's default sharders and storage reservation: TorchRec's `EmbeddingShardingPlanner`,
`DreamShardPlanner(algo="size_lookup_greedy")` and the default `DreamShardPlanner()`. A case fails when the
planner raises; the error's TorchRec type is recorded. Writes summary.json and README.md to --out; the answer is
the list of cases where the default fails and another plans.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

GIB = 1024**3
SMALL = [(100, 16), (1_000, 32), (5_000, 64), (20_000, 128), (50_000, 16), (100_000, 64), (200_000, 32),
         (400_000, 128), (800_000, 16), (1_000_000, 64), (1_500_000, 32), (2_000_000, 128)]
PLANNERS = ("torchrec", "size_lookup_greedy", "default")


def small_model():
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    module = torch.nn.Module()
    module.ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (rows, dim) in enumerate(SMALL)], device=torch.device("meta"))
    return module


def plan_once(which: str, model_name: str, ranks: int, hbm_gib: float) -> dict[str, Any]:
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.sharding_plan import get_default_sharders

    from benchmarks import mlperf_dcnv2
    from dreamshard.project.torchrec import DreamShardPlanner, quiet_torchrec

    model = mlperf_dcnv2.model() if model_name == "mlperf" else small_model()
    constraints = mlperf_dcnv2.constraints() if model_name == "mlperf" else {}
    topo = Topology(world_size=ranks, local_world_size=ranks, compute_device="cuda", hbm_cap=int(hbm_gib * GIB))
    if which == "torchrec":
        planner: Any = EmbeddingShardingPlanner(topo, batch_size=512, constraints=constraints)
    elif which == "default":
        planner = DreamShardPlanner(topo, batch_size=512, constraints=constraints, debug=False)
    else:
        planner = DreamShardPlanner(topo, batch_size=512, constraints=constraints, algo=which, debug=False)
    start = time.perf_counter()
    try:
        with quiet_torchrec():
            planner.plan(model, get_default_sharders())
        return {"ok": True, "seconds": time.perf_counter() - start}
    except PlannerError as exc:
        return {"ok": False, "seconds": time.perf_counter() - start, "error_type": exc.error_type.name,
                "error": " ".join(str(exc).split())[:300]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/planner-coverage"))
    ap.add_argument("--ranks", default="1,2,4,8,16,32,64")
    ap.add_argument("--hbm-gib", default="0.05,0.2,1,4,16,80")
    args = ap.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",")]
    memories = [float(x) for x in args.hbm_gib.split(",")]
    rows = []
    for model_name in ("small", "mlperf"):
        for n in ranks:
            for gib in memories:
                row: dict[str, Any] = {"model": model_name, "ranks": n, "hbm_gib": gib}
                for which in PLANNERS:
                    row[which] = plan_once(which, model_name, n, gib)
                rows.append(row)
                print(model_name, n, gib, {w: row[w]["ok"] for w in PLANNERS}, flush=True)
    missed = [r for r in rows if not r["default"]["ok"] and (r["torchrec"]["ok"] or r["size_lookup_greedy"]["ok"])]
    args.out.mkdir(parents=True, exist_ok=True)
    from dreamshard.project.domain import write_text

    write_text(json.dumps({"cases": rows, "missed": missed}, indent=1) + "\n", args.out / "summary.json")
    print(f"{len(missed)} of {len(rows)} cases: the default fails where another plans")


if __name__ == "__main__":
    main()
