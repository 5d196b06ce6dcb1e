"""The real-kernel backend: FBGEMM's fused embedding operator, on CPU here (CUDA where present)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dreamshard.data.lookups import GeneratedLookups
from dreamshard.errors import DreamShardError, InvalidPlanError
from dreamshard.hardware.comm import Topology, communication_ms, dist_latency_ms
from dreamshard.hardware.fbgemm import (
    CPU_SUPPORTED,
    FbgemmBackend,
    FbgemmConfig,
    pin_threads,
)
from dreamshard.memory import GB, MemoryModel
from dreamshard.plan import Plan, Shard
from dreamshard.tables import Table
from dreamshard.tasks import Task

FAST = FbgemmConfig(batch_size=256, warmup=1, iterations=3)
CUDA = torch.cuda.is_available()


def tiny_tables() -> list[Table]:
    return [
        Table("a", 1000, 16, 5.0),
        Table("b", 300, 8, 2.0),
        Table("c", 2000, 32, 8.0),
        Table("d", 500, 4, 0.5),
    ]


def tiny_task(num_devices: int = 2, memory: MemoryModel | None = None) -> Task:
    return Task.uniform("tiny", tiny_tables(), num_devices, 1.0, memory=memory)


def whole(task: Task, device: int = 0) -> list[Shard]:
    return [Shard(t.name, device, 0, t.dim) for t in task.tables]


@pytest.fixture(scope="module")
def backend() -> FbgemmBackend:
    return FbgemmBackend(GeneratedLookups(seed=0), FAST)


def positive_finite(x: float) -> bool:
    return math.isfinite(x) and x > 0


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value",
    [("batch_size", 0), ("warmup", -1), ("iterations", 0), ("threads", 0), ("device", "tpu"),
     ("memory_budget_gb", 0.0), ("learning_rate", -1.0), ("learning_rate", float("nan")), ("topology", None)],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        FbgemmConfig(**{field: value})


def test_the_pipeline_params_reach_the_backend(project_root):
    """Every key of params.yaml's backend group configures the backend the stages measure with."""
    from dreamshard.project.backend import backend_of
    from dreamshard.project.params import load_params

    params = load_params(project_root / "params.yaml")
    params["backend"]["name"] = "fbgemm"
    cfg = params["backend"]
    backend = backend_of(params, GeneratedLookups())
    assert isinstance(backend, FbgemmBackend)
    assert backend.config.batch_size == cfg["batch_size"]
    assert backend.config.topology == Topology(**cfg["topology"])
    for key, value in cfg["fbgemm"].items():
        assert getattr(backend.config, key) == value, key
    # a changed value arrives too, and a key the backend does not know is an error naming it
    more = cfg["fbgemm"]["iterations"] + 1
    params["backend"]["fbgemm"] = {**cfg["fbgemm"], "iterations": more}
    assert backend_of(params, GeneratedLookups()).config.iterations == more
    params["backend"]["fbgemm"]["iterationz"] = 3
    with pytest.raises(DreamShardError, match="iterationz"):
        backend_of(params, GeneratedLookups())


# ---------------------------------------------------------------- compute cost


def test_compute_cost_is_positive_and_finite(backend):
    task = tiny_task()
    cost = backend.compute_cost(task, whole(task))
    assert positive_finite(cost.fwd_ms) and positive_finite(cost.bwd_ms)


@pytest.mark.parametrize("precision, optimizer", sorted(CPU_SUPPORTED))
def test_every_cpu_supported_combination_runs_and_updates(backend, precision, optimizer):
    task = tiny_task(memory=MemoryModel(precision, optimizer))
    cost = backend.compute_cost(task, whole(task)[:2])
    assert positive_finite(cost.fwd_ms) and positive_finite(cost.bwd_ms)
    fused = backend.build_operator(task, whole(task)[:2])
    assert fused.op.split_embedding_weights()[0].dtype == {"fp32": torch.float32, "fp16": torch.float16}[precision]
    before = [w.detach().clone() for w in fused.op.split_embedding_weights()]
    fused.step()
    after = fused.op.split_embedding_weights()
    assert all(not torch.equal(a, b) for a, b in zip(before, after)), "the backward did not update the weights"


def test_column_slice_is_accepted(backend):
    task = tiny_task()
    cost = backend.compute_cost(task, [Shard("c", 0, 8, 24), Shard("c", 0, 24, 32), Shard("a", 0, 0, 16)])
    assert positive_finite(cost.fwd_ms) and positive_finite(cost.bwd_ms)


def test_empty_shard_list_costs_nothing(backend):
    cost = backend.compute_cost(tiny_task(), [])
    assert (cost.fwd_ms, cost.bwd_ms) == (0.0, 0.0)


@pytest.mark.parametrize("shard", [Shard("nope", 0, 0, 8), Shard("a", 0, 0, 20), Shard("a", 0, 4, 6), Shard("a", 0, 8, 8)])
def test_bad_shards_are_refused(backend, shard):
    with pytest.raises(InvalidPlanError):
        backend.compute_cost(tiny_task(), [shard])


def test_another_thread_count_is_refused_and_never_changed(backend):
    """The thread count is process-wide: the backend checks it, only the program sets it (pin_threads)."""
    assert torch.get_num_threads() == 1  # the suite pins it, as the stages do
    two = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=256, warmup=1, iterations=3, threads=2))
    with pytest.raises(DreamShardError, match=r"threads=2, but this process runs 1.*pin_threads"):
        two.compute_cost(tiny_task(), whole(tiny_task())[:1])
    assert torch.get_num_threads() == 1
    try:
        pin_threads(two)
        assert torch.get_num_threads() == 2
        assert positive_finite(two.compute_cost(tiny_task(), whole(tiny_task())[:1]).total_ms)
    finally:
        pin_threads(backend)
    assert torch.get_num_threads() == 1


def test_an_allocator_setting_other_than_the_configs_is_refused(backend, monkeypatch):
    """torch reads the huge-pages setting once per process: the backend measures only where it matches."""
    from dreamshard.hardware.allocator import HUGE_PAGES_ENV

    huge = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=256, warmup=1, iterations=3,
                                                                huge_pages=True))
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    with pytest.raises(DreamShardError, match=rf"huge_pages=True, but this process has {HUGE_PAGES_ENV}=None"):
        huge.compute_cost(tiny_task(), whole(tiny_task())[:1])
    monkeypatch.setenv(HUGE_PAGES_ENV, "1")
    with pytest.raises(DreamShardError, match=r"huge_pages=False.*=\'1\'.*backend.fbgemm.huge_pages"):
        backend.compute_cost(tiny_task(), whole(tiny_task())[:1])
    assert "huge pages" in huge.device_name() and "huge pages" not in backend.device_name()
    with pytest.raises(ValueError, match="huge_pages: expected true or false"):
        FbgemmConfig(huge_pages="yes")  # type: ignore[arg-type]


def test_the_allocator_setting_is_importable_before_torch():
    """`python -m pipeline` sets the allocator's environment before anything imports torch: importing
    dreamshard.hardware.allocator (and its package) must not import torch."""
    import subprocess
    import sys

    code = "import sys, dreamshard.hardware.allocator; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pipeline_sets_the_allocator_from_params_before_torch(tmp_path, monkeypatch):
    from dreamshard.hardware.allocator import HUGE_PAGES_ENV, huge_pages_enabled
    from dreamshard.project.backend import huge_pages_from_params

    params = tmp_path / "params.yaml"
    monkeypatch.setenv(HUGE_PAGES_ENV, "1")  # the shell's setting loses to params
    params.write_text("backend: {name: fbgemm, fbgemm: {huge_pages: false}}\n")
    huge_pages_from_params(str(params))
    assert not huge_pages_enabled()
    params.write_text("backend: {name: fbgemm, fbgemm: {huge_pages: true}}\n")
    huge_pages_from_params(str(params))
    assert huge_pages_enabled()


# ---------------------------------------------------------------- what the operator computes


def test_operator_layout_and_optimizer_update(backend):
    """Forward = sum of the looked-up rows per sample, table-major; backward applies exact SGD."""
    task = tiny_task()
    shards = [Shard("a", 0, 0, 16), Shard("c", 0, 8, 24), Shard("d", 0, 0, 4)]
    fused = backend.build_operator(task, shards)
    weights_before = [w.detach().clone() for w in fused.op.split_embedding_weights()]
    indices, offsets = fused.indices.numpy(), fused.offsets.numpy()
    batch = FAST.batch_size
    assert offsets.shape == (len(shards) * batch + 1,) and offsets[-1] == indices.shape[0]
    assert fused.indices.dtype == torch.int64 and fused.offsets.dtype == torch.int64

    out = fused.step()  # forward, then backward with the fused optimizer update
    assert out.shape == (batch, 16 + 16 + 4)

    col = 0
    lr = FAST.learning_rate
    for t, (shard, w0) in enumerate(zip(shards, weights_before)):
        width = shard.col_end - shard.col_start
        w0 = w0.numpy()
        w1 = fused.op.split_embedding_weights()[t].detach().numpy()
        expected_out = np.zeros((batch, width), dtype=np.float64)
        expected_grad = np.zeros_like(w0, dtype=np.float64)
        g = fused.grad[:, col: col + width].numpy().astype(np.float64)
        for b in range(batch):
            rows = indices[offsets[t * batch + b]: offsets[t * batch + b + 1]]
            expected_out[b] = w0[rows].sum(axis=0)
            np.add.at(expected_grad, rows, g[b])
        np.testing.assert_allclose(out[:, col: col + width].numpy(), expected_out, rtol=1e-5, atol=1e-6)
        touched = np.zeros(w0.shape[0], dtype=bool)
        touched[indices[offsets[t * batch]: offsets[(t + 1) * batch]]] = True
        if touched.any():
            assert not np.array_equal(w1[touched], w0[touched]), f"shard {t}: touched rows were not updated"
            np.testing.assert_allclose(w1, w0 - lr * expected_grad, rtol=1e-4, atol=1e-6)
        # rows nobody reads were never written (any bits, NaN included): they stay as they were
        assert np.array_equal(w1[~touched], w0[~touched], equal_nan=True), f"shard {t}: untouched rows changed"
        col += width


def test_column_slices_of_one_table_share_its_lookups(backend):
    task = tiny_task()
    fused = backend.build_operator(task, [Shard("c", 0, 0, 16), Shard("c", 0, 16, 32)])
    off = fused.offsets.numpy()
    idx = fused.indices.numpy()
    b = FAST.batch_size
    assert np.array_equal(idx[off[0]: off[b]], idx[off[b]: off[2 * b]])


# ---------------------------------------------------------------- plan cost


def test_plan_cost_applies_the_comm_model(backend):
    task = tiny_task(num_devices=2)
    plan = Plan.from_assignment(task, [0, 1, 0, 1])
    cost = backend.plan_cost(task, plan)
    assert len(cost.devices) == 2
    assert cost.backend == "fbgemm" and cost.measured is True and cost.comm == "model"
    assert cost.device_name.startswith("cpu") and "1 thread" in cost.device_name
    for d in cost.devices:
        assert positive_finite(d.fwd_ms) and positive_finite(d.bwd_ms)
    traffic = [[16 + 32, sum(t.pooling_factor * 8 + 4 for t in task.tables[0::2])],
               [8 + 4, sum(t.pooling_factor * 8 + 4 for t in task.tables[1::2])]]  # dims; ids, a length each
    fwd_comm, bwd_comm = communication_ms([d.fwd_ms for d in cost.devices], traffic, FAST.batch_size, FAST.topology)
    fwd_dists, bwd_dists = dist_latency_ms(1, 2, FAST.topology)  # whole tables: one lookup group's dists
    assert [d.fwd_comm_ms for d in cost.devices] == pytest.approx(list(fwd_comm + fwd_dists))
    assert [d.bwd_comm_ms for d in cost.devices] == pytest.approx(list(bwd_comm + bwd_dists))
    assert all(d.bwd_comm_ms > 0 for d in cost.devices)
    assert cost.cost_ms == max(d.total_ms for d in cost.devices)


def test_plan_cost_single_device_has_no_comm(backend):
    task = tiny_task(num_devices=1)
    cost = backend.plan_cost(task, Plan.from_assignment(task, [0, 0, 0, 0]))
    assert len(cost.devices) == 1
    assert cost.devices[0].fwd_comm_ms == 0.0 and cost.devices[0].bwd_comm_ms == 0.0
    assert cost.devices[0].fwd_ms > 0


def test_plan_cost_idle_device_costs_zero_compute(backend):
    task = tiny_task(num_devices=3)
    cost = backend.plan_cost(task, Plan.from_assignment(task, [0, 0, 2, 2]))
    assert (cost.devices[1].fwd_ms, cost.devices[1].bwd_ms) == (0.0, 0.0)
    assert cost.devices[1].fwd_comm_ms > 0  # it still waits for the slowest device's outputs


def test_plan_for_another_device_count_is_refused(backend):
    task = tiny_task(num_devices=2)
    with pytest.raises(InvalidPlanError):
        backend.plan_cost(task, Plan(3, tuple(whole(task))))


def test_metadata(backend):
    assert backend.name == "fbgemm" and backend.measured is True
    v = backend.versions()
    assert v["torch"] == torch.__version__ and v["fbgemm_gpu"] not in ("", "not installed")
    threads2 = FbgemmBackend(GeneratedLookups(), FbgemmConfig(threads=2)).device_name()
    assert threads2.startswith("cpu: ") and threads2.endswith("(2 threads)")


# ---------------------------------------------------------------- refusals


def test_memory_budget_is_enforced_before_allocating():
    big = [Table("huge_a", 4_000_000, 128, 1.0), Table("huge_b", 2_000_000, 64, 1.0)]
    task = Task.uniform("big", big, 1, 16.0)
    needed = task.memory.shard_bytes(4_000_000, 128) + task.memory.shard_bytes(2_000_000, 64)
    assert needed > GB  # 2.4 GB of fp32 weights: more than the budget below

    class NoLookups:  # the refusal comes before lookups are generated or anything is allocated
        def lookups(self, table, batch_size):
            raise AssertionError("lookups requested for a refused shard")

    backend = FbgemmBackend(NoLookups(), FbgemmConfig(batch_size=256, memory_budget_gb=1.0))
    with pytest.raises(DreamShardError) as err:
        backend.compute_cost(task, whole(task))
    msg = str(err.value)
    assert "huge_a" in msg and "huge_b" in msg and str(needed) in msg and "memory_budget_gb" in msg


def test_adam_is_refused_on_cpu(backend):
    task = tiny_task(memory=MemoryModel("fp32", "adam"))
    with pytest.raises(DreamShardError, match="adam"):
        backend.compute_cost(task, whole(task))


def test_lookups_outside_the_table_are_refused():
    class Wrong:
        def lookups(self, table, batch_size):
            from dreamshard.data.requests import TableRequests

            return TableRequests(np.full(batch_size, table.rows, dtype=np.int64), np.ones(batch_size, dtype=np.int64))

    task = tiny_task()
    with pytest.raises(DreamShardError, match="outside"):
        FbgemmBackend(Wrong(), FAST).compute_cost(task, whole(task)[:1])


@pytest.mark.skipif(CUDA, reason="CUDA is available here: the refusal only applies without it")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(DreamShardError, match="cuda"):
        FbgemmBackend(GeneratedLookups(), FbgemmConfig(device="cuda"))


# ---------------------------------------------------------------- CUDA


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("memory", [MemoryModel("fp16", "exact_sgd"), MemoryModel("fp32", "adam")])
def test_compute_cost_on_cuda(memory):
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=256, warmup=1, iterations=3, device="cuda"))
    task = tiny_task(memory=memory)
    cost = backend.compute_cost(task, whole(task))
    assert positive_finite(cost.fwd_ms) and positive_finite(cost.bwd_ms)
    assert backend.device_name() == torch.cuda.get_device_name()
    plan = backend.plan_cost(task, Plan.from_assignment(task, [0, 1, 0, 1]))
    assert plan.measured and plan.backend == "fbgemm" and not plan.device_name.startswith("cpu")


# ---------------------------------------------------------------- what holds on every machine
#
# Whether fusing tables costs more or less than running them apart depends on the processor
# (measured: Intel Xeon 1.5-1.8x the sum of singles, AMD EPYC 0.96x), so no test asserts it:
# `python -m benchmarks.cpu_kernels` measures it, and the evaluate stage records the regime it
# measured in metrics/eval.json. The tests below assert only structural relations, with margins
# that load on the other core cannot close.


def test_a_hundred_times_the_lookups_costs_more():
    """The same table with pooling 100 against pooling 1: 100x the rows gathered and updated."""
    heavy = Table("heavy", 100_000, 64, 100.0)
    light = Table("light", 100_000, 64, 1.0)
    task = Task.uniform("work", [heavy, light], 1, 1.0)
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=1024, warmup=1, iterations=5))
    # noise only ever slows a run down: compare the heavy table's fastest run with the light one's slowest
    heavy_ms = [backend.compute_cost(task, [Shard("heavy", 0, 0, 64)]).total_ms for _ in range(2)]
    light_ms = [backend.compute_cost(task, [Shard("light", 0, 0, 64)]).total_ms for _ in range(2)]
    assert min(heavy_ms) > max(light_ms), (heavy_ms, light_ms)


def test_medians_agree_between_two_runs_within_a_generous_factor():
    """Two measurements of one operator are the same quantity: medians within 4x even on a loaded machine."""
    task = tiny_task()
    backend = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=1024, warmup=1, iterations=7))
    first = backend.compute_cost(task, whole(task))
    second = backend.compute_cost(task, whole(task))
    for a, b in ((first.fwd_ms, second.fwd_ms), (first.bwd_ms, second.bwd_ms)):
        assert positive_finite(a) and positive_finite(b)
        assert 0.25 < a / b < 4.0, (first, second)


def test_a_row_shard_is_its_own_table_fed_the_lookups_in_its_range(backend):
    """Rows [r0, r1) of table c: an operator table of r1 - r0 rows, given c's lookups in the range, rebased."""
    task = tiny_task()
    whole = backend.build_operator(task, [Shard("c", 0, 0, 32)])
    low = backend.build_operator(task, [Shard("c", 0, 0, 32, 0, 700)])
    high = backend.build_operator(task, [Shard("c", 0, 8, 32, 700, 2000)])
    assert [w.shape for w in low.op.split_embedding_weights()] == [(700, 32)]
    assert [w.shape for w in high.op.split_embedding_weights()] == [(1300, 24)]
    b = FAST.batch_size
    idx, off = whole.indices.numpy(), whole.offsets.numpy()
    for sample in (0, 7, b - 1):
        rows = idx[off[sample]: off[sample + 1]]
        lo = low.indices.numpy()[low.offsets.numpy()[sample]: low.offsets.numpy()[sample + 1]]
        hi = high.indices.numpy()[high.offsets.numpy()[sample]: high.offsets.numpy()[sample + 1]]
        assert sorted(lo.tolist()) == sorted(rows[rows < 700].tolist())
        assert sorted((hi + 700).tolist()) == sorted(rows[rows >= 700].tolist())
    assert low.indices.numel() + high.indices.numel() == whole.indices.numel()
    cost = backend.compute_cost(task, [Shard("c", 0, 0, 32, 0, 700), Shard("a", 0, 0, 16)])
    assert positive_finite(cost.fwd_ms) and positive_finite(cost.bwd_ms)
    with pytest.raises(InvalidPlanError, match=r"rows \[700, 2001\) must be a non-empty range within its 2000 rows"):
        backend.compute_cost(task, [Shard("c", 0, 0, 32, 700, 2001)])


def test_the_rows_lookups_read_are_filled_with_a_seeded_uniform_block_the_others_stay_unwritten():
    import torch

    from dreamshard.hardware.fbgemm import INIT_RANGE, fill_read_rows

    block = torch.empty(1000).uniform_(-INIT_RANGE, INIT_RANGE, generator=torch.Generator().manual_seed(0))
    weights = torch.zeros(5000, 3)
    rows = torch.arange(0, 5000, 4)  # 1250 rows, 3750 values: 3 whole blocks and a part
    fill_read_rows(weights, rows, block)
    values = weights[rows].reshape(-1)
    assert torch.equal(values[:1000], block) and torch.equal(values[3000:], block[:750])
    assert float(weights[rows].abs().max()) <= INIT_RANGE and float(weights[rows].std()) > INIT_RANGE / 3
    others = torch.ones(5000, dtype=torch.bool)
    others[rows] = False
    assert not weights[others].any()
    fill_read_rows(weights, torch.empty(0, dtype=torch.int64), block)  # a table nobody looks up: nothing to fill
    config = FbgemmConfig(batch_size=64, warmup=0, iterations=1)
    task = Task.uniform("init", tiny_tables(), 1, 1.0)
    whole = [Shard(t.name, 0, 0, t.dim) for t in task.tables]
    # two backends: each keeps one buffer that its builds' weights view (weight_memory "reused")
    ops = [FbgemmBackend(GeneratedLookups(seed=0), config).build_operator(task, whole) for _ in range(2)]
    a, b = ([w.clone() for w in op.op.split_embedding_weights()] for op in ops)
    assert torch.equal(ops[0].grad, ops[1].grad)  # the same output gradient, the first build as the next
    batch = 64
    offsets = ops[0].offsets.tolist()
    for t, (x, y) in enumerate(zip(a, b)):
        read = ops[0].indices[offsets[t * batch]:offsets[(t + 1) * batch]]
        assert torch.equal(x[read], y[read])  # seeded: the rows read hold the same values every time
        assert bool((x[read] != 0).any(dim=1).all()) and float(x[read].abs().max()) <= INIT_RANGE
    # on CPU the weights are FBGEMM's host buffer, of its own size and type, never zeroed by it
    cells = sum(t.rows * t.dim for t in task.tables)
    assert ops[0].op.weights_host.numel() == cells and ops[0].op.weights_host.dtype == torch.float32
    # measurements (compute_samples) reuse one buffer across builds (weight_memory "reused")
    backend = FbgemmBackend(GeneratedLookups(seed=0), config)
    backend.build_operator(task, whole[:1], reuse_memory=True)
    again = backend.build_operator(task, whole, reuse_memory=True)  # larger: a larger buffer, kept for the next
    ptr = again.op.weights_host.data_ptr()
    for t, w in enumerate(again.op.split_embedding_weights()):  # the rows read, filled in the reused memory
        read = again.indices[again.offsets[t * batch]:again.offsets[(t + 1) * batch]]
        assert torch.equal(w[read], a[t][read])
    assert backend.build_operator(task, whole[1:], reuse_memory=True).op.weights_host.data_ptr() == ptr
    assert backend.build_operator(task, whole).op.weights_host.data_ptr() != ptr  # an inspection: its own memory
    cost = backend.compute_cost(task, whole)
    assert positive_finite(cost.fwd_ms) and backend._weight_pool.data_ptr() == ptr


def test_the_bound_fuses_the_costliest_tables_that_fit_where_all_do_not():
    """A task whose tables do not fit one operator of the backend (the paper profile's largest tasks) still gets
    its lower bound: the fused cost of the costliest tables that fit bounds the fused cost of all (monotone
    fusion); where the probes refuted monotone fusion there is no such bound and the refusal stands."""
    from dreamshard.errors import OverBudgetError
    from dreamshard.evaluation.bounds import EITHER, NON_MONOTONE, lower_bound

    task = tiny_task()
    size = {t.name: task.memory.shard_bytes(t.rows, t.dim) for t in task.tables}
    budget = size["c"] + size["a"]  # the two largest fit together, not all four
    real = FbgemmBackend(GeneratedLookups(seed=0), FbgemmConfig(batch_size=256, warmup=1, iterations=3,
                                                                memory_budget_gb=budget / GB))
    with pytest.raises(OverBudgetError) as err:
        real.compute_cost(task, whole(task))
    assert err.value.needed_bytes == sum(size.values()) and err.value.budget_bytes == budget

    class Recording:  # the real backend; remembers the operators of several tables it was asked for
        name, measured, batch_size, topology = real.name, real.measured, real.batch_size, real.topology
        fused: list[set[str]] = []

        def compute_cost(self, task, shards):
            if len(shards) > 1:
                self.fused.append({s.table for s in shards})
            return real.compute_cost(task, shards)

    spy = Recording()
    bound = lower_bound(spy, task, EITHER)  # type: ignore[arg-type]
    assert positive_finite(bound.total_ms) and positive_finite(bound.compute_mean_ms)
    # all refused, then the costliest that fit: which tables those are follows the measured single costs (on
    # tables this small their order can flip between runs), so the check is that the set fits and is full
    assert spy.fused[0] == set(size) != spy.fused[-1] and len(spy.fused[-1]) > 1
    room = budget - sum(size[t] for t in spy.fused[-1])
    assert room >= 0 and all(size[t] > room for t in set(size) - spy.fused[-1])
    with pytest.raises(OverBudgetError, match="non-monotone"):
        lower_bound(real, task, NON_MONOTONE)


def test_sequence_tables_are_measured_without_pooling_one_operator_per_width(backend):
    """An EmbeddingCollection's tables (sequence: a row per id, nothing pooled) run in TBE operators without
    pooling, one per width, beside the device's pooled operator: each built as TorchRec runs it, their
    timings summed."""
    from dataclasses import replace

    from dreamshard.hardware.fbgemm import operator_groups

    tables = [replace(t, sequence=t.name in ("a", "b", "c")) for t in tiny_tables()]
    task = Task.uniform("seq", tables, 1, 1.0)
    shards = [Shard("a", 0, 0, 16), Shard("b", 0, 0, 8), Shard("c", 0, 0, 16), Shard("c", 0, 16, 32),
              Shard("d", 0, 0, 4)]
    groups = operator_groups(task, shards)
    assert [[s.table for s in g] for g in groups] == [["d"], ["b"], ["a", "c", "c"]]
    with pytest.raises(DreamShardError, match="several operators"):
        backend.build_operator(task, shards)
    seq = backend.build_operator(task, groups[2])
    out = seq.step()
    assert out.shape == (seq.indices.numel(), 16)  # a row per id of the one width, nothing pooled
    b = FAST.batch_size
    offsets, indices = seq.offsets.tolist(), seq.indices
    before = seq.op.split_embedding_weights()[0].clone()
    # the rows an id of table "a" reads come back one by one, in order
    first = indices[offsets[0]:offsets[b]]
    np.testing.assert_allclose(seq.op(seq.indices, seq.offsets)[: first.numel()].detach().numpy(),
                               before[first].numpy(), rtol=1e-6)
    pooled = backend.build_operator(task, groups[0])
    assert pooled.step().shape == (b, 4)
    samples = backend.compute_samples(task, shards)
    assert len(samples.fwd_ms) == FAST.iterations and all(positive_finite(x) for x in samples.fwd_ms + samples.bwd_ms)
    cost = backend.compute_cost(task, shards)
    assert cost.total_ms > backend.compute_cost(task, groups[0]).total_ms


def test_torchrecs_lookup_groups_one_operator_per_sharding_kind(backend, monkeypatch):
    """lookup_groups "kind" (the default): a device's whole tables, column slices and row blocks run in one operator
    per kind, as TorchRec's lookup groups run them (each kind its own TBE), their timings summed; "device" fuses them
    all into one."""
    from dataclasses import replace

    from dreamshard.hardware.fbgemm import FbgemmBackend, operator_groups, sharding_kind

    tables = tiny_tables()  # a 16, b 8, c 32, d 4 wide
    task = Task.uniform("kinds", tables, 1, 1.0)
    by_name = {t.name: t for t in tables}
    shards = [Shard("a", 0, 0, 16), Shard("b", 0, 0, 8, 0, by_name["b"].rows // 2), Shard("c", 0, 0, 16),
              Shard("d", 0, 0, 4)]
    assert [sharding_kind(s, by_name[s.table]) for s in shards] == ["table", "row", "column", "table"]
    assert [[s.table for s in g] for g in operator_groups(task, shards)] == [["a", "b", "c", "d"]]
    assert [[s.table for s in g] for g in operator_groups(task, shards, by_kind=True)] == [["c"], ["b"], ["a", "d"]]
    kinds = FbgemmBackend(backend.lookups, replace(backend.config, lookup_groups="kind"))
    fused = FbgemmBackend(backend.lookups, replace(backend.config, lookup_groups="device"))
    built = []
    original = FbgemmBackend.build_operator

    def counting(self, task, shards, reuse_memory=False):
        built.append(sorted(s.table for s in shards))
        return original(self, task, shards, reuse_memory)

    monkeypatch.setattr(FbgemmBackend, "build_operator", counting)
    assert kinds.compute_cost(task, shards).fwd_ms > 0
    assert sorted(built) == [["a", "d"], ["b"], ["c"]]  # three operators, each timed
    built.clear()
    fused.compute_cost(task, shards)
    assert built == [["a", "b", "c", "d"]]
    with pytest.raises(ValueError, match="lookup_groups"):
        replace(backend.config, lookup_groups="table")


class CountingLookups(GeneratedLookups):
    """Real generated lookups that count what the backend asks for."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.asked: list[str] = []

    def lookups(self, table, batch_size):
        self.asked.append(table.name)
        return super().lookups(table, batch_size)


def test_a_shards_lookups_are_drawn_once_kept_read_only_and_the_same_as_fresh(monkeypatch):
    """Builds reuse a shard's lookups and rows read (FbgemmBackend.shard_inputs): the source is asked once per
    table, the operator's inputs equal a fresh backend's, and past the cache's budget they are found again."""
    from dreamshard.hardware import fbgemm

    task = tiny_task()
    shards = [Shard("c", 0, 0, 32, 0, 700), Shard("a", 0, 0, 16), Shard("c", 0, 0, 32, 700, 2000)]
    source = CountingLookups()
    kept = FbgemmBackend(source, FAST)
    first, again = (kept.build_operator(task, shards) for _ in range(2))
    assert sorted(source.asked) == ["a", "c"]  # c's two row ranges both come from its one draw
    fresh = FbgemmBackend(GeneratedLookups(seed=0), FAST).build_operator(task, shards)
    for op in (first, again):
        assert torch.equal(op.indices, fresh.indices) and torch.equal(op.offsets, fresh.offsets)
    part = kept.shard_inputs(task.tables[2], 700, 2000, FAST.batch_size)
    assert np.array_equal(part.read_rows, np.unique(part.indices)) and part.indices.max() < 1300
    for array in (part.indices, part.lengths, part.read_rows):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    monkeypatch.setattr(fbgemm, "SHARD_INPUT_CACHE_BYTES", 1)  # room for one shard's inputs only
    tight = FbgemmBackend(source, FAST)
    source.asked.clear()
    for _ in range(2):
        op = tight.build_operator(task, shards)
        assert torch.equal(op.indices, fresh.indices) and torch.equal(op.offsets, fresh.offsets)
    assert len(tight._shard_inputs) == 1 and len(source.asked) > 2  # dropped, then drawn again
    from dreamshard.tables import NUM_BINS

    listed = Task.uniform("listed", [Table("e", 800, 8, 3.0, bins=[1.0 / NUM_BINS] * NUM_BINS)], 1, 1.0)
    assert positive_finite(kept.compute_cost(listed, [Shard("e", 0, 0, 8)]).total_ms)  # bins given as a list


def test_a_probes_readings_come_from_one_build_of_each_operator(backend, monkeypatch):
    """compute_readings (the bounds' probes, via hardware.base.least_reading): `readings` readings of a device's
    operators, each built and warmed up once, each reading `iterations` timed steps per operator; ProbeCache keeps
    the least. A device of two lookup groups builds two operators and sums their timings reading by reading."""
    from dreamshard.evaluation.evaluate import ProbeCache
    from dreamshard.hardware.fbgemm import FbgemmBackend, FusedOperator

    task = tiny_task(1)
    by_name = {t.name: t for t in task.tables}
    built, timed, readings = [], [], []
    original_build, original_time = FbgemmBackend.build_operator, FusedOperator.time_cpu

    def counting(self, task, shards, reuse_memory=False):
        built.append(sorted(s.table for s in shards))
        return original_build(self, task, shards, reuse_memory)

    def timing(self, iterations):
        timed.append(iterations)
        return original_time(self, iterations)

    monkeypatch.setattr(FbgemmBackend, "build_operator", counting)
    monkeypatch.setattr(FusedOperator, "time_cpu", timing)
    got = backend.compute_readings(task, whole(task)[:1], 3)
    assert len(got) == 3 and all(positive_finite(c.total_ms) for c in got)
    assert len(built) == 1 and timed == [backend.config.iterations] * 3
    built.clear()
    two_kinds = [Shard("a", 0, 0, 16), Shard("b", 0, 0, 8, 0, by_name["b"].rows // 2)]  # table- and row-wise
    assert len(backend.compute_readings(task, two_kinds, 2)) == 2 and sorted(built) == [["a"], ["b"]]
    assert backend.compute_readings(task, [], 2) == [type(got[0])(0.0, 0.0)] * 2
    with pytest.raises(ValueError, match="readings"):
        backend.compute_readings(task, whole(task), 0)

    original_read = FbgemmBackend.compute_readings

    def recording(self, task, shards, n):
        readings.append(original_read(self, task, shards, n))
        return readings[-1]

    monkeypatch.setattr(FbgemmBackend, "compute_readings", recording)
    built.clear()
    probes = ProbeCache(backend, rounds=3)
    least = probes.compute_cost(task, whole(task)[:1])
    assert len(built) == 1 and least == min(readings[0], key=lambda c: c.total_ms)
    assert probes.compute_cost(task, whole(task)[:1]) == least and len(built) == 1  # kept for later tasks
