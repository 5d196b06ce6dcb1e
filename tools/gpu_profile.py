"""What produced profile_log.txt on the H100 (2026-11-23): one fused operator of 8 reference tables, and one of
the first table alone, at batch 2048 and 65536, timed three ways per iteration: CUDA events (the backend's
protocol), wall clock over 50 back-to-back iterations, and the torch profiler's kernel time over 10 (read its
"Self CUDA time total" / 10; the script's own "device self time/iter" sums nested entries and double counts).

    PYTHONPATH=/tmp/site:$PWD python3 -m tools.gpu_profile   (from the project root, on the GPU; it wrote
    results/gpu/b2048_protocol/profile_log.txt)
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dreamshard.project.data import GeneratedLookups
from dreamshard.project.domain import Shard, Task
from dreamshard.project.hardware import FbgemmBackend, FbgemmConfig
from dreamshard.project.kernels import reference_tables

for batch in (2048, 65536):
    refs = reference_tables(8, 1)
    task = Task.uniform("p", refs, 1, 64.0)
    be = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=batch, device="cuda", memory_budget_gb=16.0))
    for shards in ([Shard(t.name, 0, 0, t.dim) for t in refs], [Shard(refs[0].name, 0, 0, refs[0].dim)]):
        op = be.build_operator(task, shards)
        op.warm_up(20)
        s = op.time_cuda(50).median()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            op.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 50 * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                op.step()
            torch.cuda.synchronize()
        kern = sum(e.self_device_time_total for e in prof.key_averages()) / 10 / 1e3
        print(f"batch {batch} tables {len(shards)}: events fwd {s.fwd_ms:.3f} bwd {s.bwd_ms:.3f} ms; "
              f"wall/iter {wall:.3f} ms; device self time/iter {kern:.3f} ms")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
        sys.stdout.flush()
        del op
