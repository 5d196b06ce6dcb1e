"""Task sampling: disjoint pools, feasible tasks, determinism, errors, task files."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dreamshard.data.sampling import TaskFamily, sample_tasks, split_heavy, split_table_pools
from dreamshard.errors import InfeasibleTaskError
from dreamshard.io import write_parquet
from dreamshard.memory import GB, MemoryModel
from dreamshard.placement import find_feasible_assignment
from dreamshard.plan import Plan, validate_plan
from dreamshard.project.params import ParamsError
from dreamshard.tables import BIN_COLUMNS, TABLE_STATS_SCHEMA
from dreamshard.tasks import TASKS_SCHEMA, read_tasks, tasks_to_arrow
from stages import tasks as tasks_stage

NUM_TABLES = 40
# hash sizes from tiny to 1M rows: a 1M-row table at dim 128 (fp32) takes 0.48 GB,
# so tasks of big tables at big dims do not fit 0.5 GB devices and are resampled
ROWS = [100, 1_000, 10_000, 100_000, 1_000_000]


def stats_frame(n: int = NUM_TABLES) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    records = []
    for i in range(n):
        bins = rng.dirichlet(np.ones(len(BIN_COLUMNS)))
        records.append({
            "table_id": i, "name": f"synthetic_t{n}_bs64/t{i:04d}", "source": "synthetic",
            "source_file": f"synthetic_t{n}_bs64.pt.gz", "file_table_index": i, "rows": ROWS[i % len(ROWS)],
            "pooling_factor": float(rng.lognormal(2, 1)), "batch_size": 64, "num_lookups": 1000,
            "num_unique": 100, **dict(zip(BIN_COLUMNS, bins.tolist())),
        })
    return pa.Table.from_pylist(records, schema=TABLE_STATS_SCHEMA).to_pandas()


@pytest.fixture(scope="module")
def stats() -> pd.DataFrame:
    return stats_frame()


def family(**kw) -> TaskFamily:
    base = dict(name="fam-6-2", num_tables=6, num_devices=2, memory_gb=0.5, num_train=5, num_test=3)
    base.update(kw)
    return TaskFamily(**base)


# ---------------------------------------------------------------- pools


@pytest.mark.parametrize("fraction, validation", [(0.25, 0.0), (0.5, 0.2), (0.5, 0.3), (0.8, 0.1)])
def test_pools_are_disjoint_and_cover_all_tables(fraction, validation):
    ids = list(range(100, 100 + 37))
    pools = split_table_pools(ids, fraction, seed=3, validation_fraction=validation)
    train, val, test = pools["train"], pools["validation"], pools["test"]
    assert not set(train) & set(test) and not set(train) & set(val) and not set(val) & set(test)
    assert sorted(train + val + test) == ids
    assert len(test) == round(37 * fraction) and len(val) == round(37 * validation)
    assert pools == split_table_pools(list(reversed(ids)), fraction, 3, validation)  # by seed, not input order
    assert pools != split_table_pools(ids, fraction, 4, validation)
    # the test pool does not depend on the validation share: adding a validation pool takes only training tables
    assert test == split_table_pools(ids, fraction, 3)["test"]


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_pools_reject_a_fraction_outside_0_1(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        split_table_pools(range(10), fraction, seed=0)


@pytest.mark.parametrize("validation", [-0.1, 0.5, 0.9])
def test_pools_reject_a_validation_share_that_leaves_no_training_table(validation):
    with pytest.raises(ValueError, match="validation_fraction"):
        split_table_pools(range(10), 0.5, seed=0, validation_fraction=validation)


# ---------------------------------------------------------------- sample_tasks


def test_sampled_tasks_are_valid_and_feasible(stats):
    pool = list(range(0, NUM_TABLES, 2))
    dims = [4, 12, 128]
    fam = family(num_tables=8, num_devices=2, memory_gb=0.5)
    tasks = sample_tasks(stats, pool, fam, 20, "train", dims, MemoryModel(), np.random.default_rng(0))
    assert len(tasks) == 20
    names = stats.set_index("name")["table_id"]
    seen_dims = set()
    for k, task in enumerate(tasks):
        assert task.name == f"train/fam-6-2/{k:04d}" and task.family == "fam-6-2"
        ids = [int(names[t.name]) for t in task.tables]
        assert len(ids) == 8 and len(set(ids)) == 8, "a table repeated within a task"
        assert set(ids) <= set(pool), "a table from outside the split's pool"
        assert task.num_devices == 2
        assert all(d.memory_bytes == int(0.5 * GB) for d in task.devices)
        seen_dims |= {t.dim for t in task.tables}
        plan = Plan.from_assignment(task, find_feasible_assignment(task))
        validate_plan(task, plan)
        # the tables carry their statistics
        for t, i in zip(task.tables, ids):
            row = stats.loc[stats["table_id"] == i].iloc[0]
            assert (t.rows, t.pooling_factor) == (row["rows"], row["pooling_factor"])
            assert t.bins == tuple(row[BIN_COLUMNS])
    assert seen_dims == set(dims)


@pytest.mark.parametrize("num_tables, count, blocks", [(4, 6, 6), (6, 6, 6), (8, 6, 5), (13, 6, 3), (20, 6, 2)])
def test_grouped_tasks_share_tables_only_within_their_block(stats, num_tables, count, blocks):
    # a pool of 40 tables: as many disjoint blocks of num_tables as it holds, at most one per task
    fam = family(num_tables=num_tables, num_devices=2, memory_gb=4.0)
    tasks = sample_tasks(stats, list(range(NUM_TABLES)), fam, count, "test", [4], MemoryModel(),
                         np.random.default_rng(5), grouped=True)
    names = stats.set_index("name")["table_id"]
    ids = [{int(names[t.name]) for t in task.tables} for task in tasks]
    for i in range(count):
        for j in range(i + 1, count):
            if i % blocks != j % blocks:
                assert not ids[i] & ids[j], f"tasks {i} and {j} of different blocks share a table"
    if blocks == count:  # room for every task: no two share a table
        assert sum(len(x) for x in ids) == len(set().union(*ids))
    else:  # tasks of one block draw from the same few tables: they share some
        assert ids[0] & ids[blocks]


def test_memory_limit_makes_sampling_reject_infeasible_draws(stats):
    # All tables at dim 128 (fp32): a 1M-row table takes 512e6 bytes and a 100k-row one 51.2e6,
    # so a 0.5 GB device (536.9e6 bytes) holding a 1M-row table has room for nothing else.
    # Drawing 4 tables for 2 devices from a pool of both kinds (8 each), only draws with at
    # most one 1M-row table are feasible (28% of them): the others must be resampled.
    pool = [i for i in range(NUM_TABLES) if ROWS[i % len(ROWS)] >= 100_000]
    fam = family(num_tables=4, num_devices=2, memory_gb=0.5)
    tasks = sample_tasks(stats, pool, fam, 10, "test", [128], MemoryModel(), np.random.default_rng(1))
    for task in tasks:
        big = sum(t.rows == 1_000_000 for t in task.tables)
        assert big <= 1
        validate_plan(task, Plan.from_assignment(task, find_feasible_assignment(task)))


def test_sampling_is_deterministic_by_seed(stats):
    pool = list(range(NUM_TABLES))
    fam = family()
    a = sample_tasks(stats, pool, fam, 5, "train", [4, 8, 16], MemoryModel(), np.random.default_rng(11))
    b = sample_tasks(stats, pool, fam, 5, "train", [4, 8, 16], MemoryModel(), np.random.default_rng(11))
    c = sample_tasks(stats, pool, fam, 5, "train", [4, 8, 16], MemoryModel(), np.random.default_rng(12))
    assert a == b
    assert a != c


def test_impossible_memory_raises_infeasible_task_error(stats):
    fam = family(name="tiny-mem", memory_gb=1e-6)
    with pytest.raises(InfeasibleTaskError) as info:
        sample_tasks(stats, list(range(NUM_TABLES)), fam, 1, "train", [64], MemoryModel(), np.random.default_rng(0),
                     max_tries=20)
    msg = str(info.value)
    assert "tiny-mem" in msg and "1e-06 GB" in msg and "no feasible task in 20 samples" in msg


def test_family_larger_than_the_pool_raises_value_error(stats):
    fam = family(name="huge", num_tables=11)
    with pytest.raises(ValueError, match=r"'huge'.*11 tables.*test pool has 10"):
        sample_tasks(stats, list(range(10)), fam, 1, "test", [4], MemoryModel(), np.random.default_rng(0))


def test_tasks_round_trip_through_parquet(tmp_path, stats):
    write_parquet(pa.Table.from_pandas(stats, schema=TABLE_STATS_SCHEMA, preserve_index=False),
                  tmp_path / "tables.parquet")
    memory = MemoryModel("fp16", "exact_row_wise_adagrad")
    tasks = sample_tasks(stats, list(range(NUM_TABLES)), family(), 4, "test", [8, 32], memory,
                         np.random.default_rng(5))
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    write_parquet(tasks_to_arrow(tasks, "test", name_to_id), tmp_path / "test.parquet")
    assert pq.read_schema(tmp_path / "test.parquet").remove_metadata().equals(TASKS_SCHEMA)
    df = pd.read_parquet(tmp_path / "test.parquet")
    assert set(df["split"]) == {"test"}
    assert df["table_ids"].map(list).tolist() == [[name_to_id[t.name] for t in task.tables] for task in tasks]
    back = read_tasks(tmp_path / "test.parquet", tmp_path / "tables.parquet")
    assert back == tasks
    assert back[0].memory == memory


def test_tasks_of_several_hosts_keep_their_hosts_and_kinds_through_parquet(tmp_path, stats):
    """A family on hosts of 2 allowing "host" (TorchRec's table_row_wise): its tasks name each device's host and
    say the kinds; the file keeps both, a file written before those columns existed reads as no host and the
    default kinds, and a devices_per_host that makes no hosts is refused naming the file and the field."""
    write_parquet(pa.Table.from_pandas(stats, schema=TABLE_STATS_SCHEMA, preserve_index=False),
                  tmp_path / "tables.parquet")
    fam = family(name="fam-6-4", num_devices=4, memory_gb=1.0, devices_per_host=2,
                 sharding=["table", "column", "row", "host"])
    tasks = sample_tasks(stats, list(range(NUM_TABLES)), fam, 2, "test", [8], MemoryModel(), np.random.default_rng(5))
    assert [d.host for d in tasks[0].devices] == ["host0", "host0", "host1", "host1"]
    assert tasks[0].per_host() == 2 and tasks[0].sharding == ("table", "column", "row", "host")
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    path = tmp_path / "test.parquet"
    write_parquet(tasks_to_arrow(tasks, "test", name_to_id), path)
    assert read_tasks(path, tmp_path / "tables.parquet") == tasks
    older = pq.read_table(path).drop_columns(["devices_per_host", "sharding"])
    pq.write_table(older, tmp_path / "older.parquet")
    for task in read_tasks(tmp_path / "older.parquet", tmp_path / "tables.parquet"):
        assert task.host_ids() is None and task.sharding == ("table", "column", "row")
    bad = pq.read_table(path).set_column(TASKS_SCHEMA.get_field_index("devices_per_host"), "devices_per_host",
                                          pa.array([3, 3], pa.int32()))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: task test/fam-6-4/0000: devices_per_host: expected 0 .* "
                                         r"divisor of num_devices 4, got 3"):
        read_tasks(tmp_path / "bad.parquet", tmp_path / "tables.parquet")
    with pytest.raises(ValueError, match="sharding host .* needs devices_per_host naming two hosts"):
        family(num_devices=4, sharding=["table", "host"])
    with pytest.raises(ValueError, match="devices_per_host: expected 0 or a divisor of num_devices 2, got 3"):
        family(devices_per_host=3)
    with pytest.raises(ValueError, match="sharding: expected a list of"):
        family(sharding=["column"])


def test_read_tasks_rejects_unknown_table_ids(tmp_path, stats):
    tasks = sample_tasks(stats, list(range(NUM_TABLES)), family(), 1, "test", [8], MemoryModel(),
                         np.random.default_rng(5))
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    write_parquet(tasks_to_arrow(tasks, "test", name_to_id), tmp_path / "test.parquet")
    # a tables file lacking the task's first table
    first = name_to_id[tasks[0].tables[0].name]
    fewer = stats[stats["table_id"] != first]
    write_parquet(pa.Table.from_pandas(fewer, schema=TABLE_STATS_SCHEMA, preserve_index=False),
                  tmp_path / "tables.parquet")
    with pytest.raises(ValueError, match=rf"test/fam-6-2/0000: table_ids \[{first}\]"):
        read_tasks(tmp_path / "test.parquet", tmp_path / "tables.parquet")


# ---------------------------------------------------------------- the tasks stage


def stage_params(tmp_path, **tasks_overrides):
    cfg = {
        "seed": 0,
        "test_fraction": 0.5,
        "validation_fraction": 0.25,
        "dims": [4, 16, 64],
        "profile": "small",
        "profiles": {
            "small": [
                {"name": "f-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 0.5, "num_train": 4, "num_test": 3,
                 "num_validation": 2},
                {"name": "f-10-4", "num_tables": 10, "num_devices": 4, "memory_gb": 0.5, "num_train": 2, "num_test": 2},
            ]
        },
    }
    cfg.update(tasks_overrides)
    return {
        "paths": {"tables": str(tmp_path / "tables.parquet"), "tasks": str(tmp_path / "tasks")},
        "memory": {"weights_precision": "fp32", "optimizer": "exact_sgd"},
        "tasks": cfg,
    }


def run_stage(tmp_path, stats, **overrides):
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.Table.from_pandas(stats, schema=TABLE_STATS_SCHEMA, preserve_index=False),
                  tmp_path / "tables.parquet")
    params = stage_params(tmp_path, **overrides)
    tasks_stage.run(params)
    return {split: read_tasks(tmp_path / f"tasks/{split}.parquet", tmp_path / "tables.parquet")
            for split in ("train", "validation", "test")}


def test_tasks_stage_invariants(tmp_path, stats):
    out = run_stage(tmp_path, stats)
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    pools = split_table_pools(stats["table_id"].tolist(), 0.5, 0, 0.25)
    assert [t.family for t in out["train"]] == ["f-6-2"] * 4 + ["f-10-4"] * 2
    assert [t.family for t in out["validation"]] == ["f-6-2"] * 2
    assert [t.family for t in out["test"]] == ["f-6-2"] * 3 + ["f-10-4"] * 2
    used = {}
    for split, pool in pools.items():
        used[split] = set()
        for task in out[split]:
            assert task.name.startswith(f"{split}/{task.family}/")
            ids = [name_to_id[t.name] for t in task.tables]
            assert len(set(ids)) == len(ids)
            assert set(ids) <= set(pool)
            assert {t.dim for t in task.tables} <= {4, 16, 64}
            validate_plan(task, Plan.from_assignment(task, find_feasible_assignment(task)))
            used[split] |= set(ids)
    assert not used["train"] & used["test"], "a table appears in both train and test tasks"
    assert not used["validation"] & (used["train"] | used["test"]), "a validation table in another split's tasks"
    df = pd.read_parquet(tmp_path / "tasks/train.parquet")
    assert set(df["split"]) == {"train"}
    assert df["task_id"].is_unique


def test_tasks_stage_is_deterministic_by_seed(tmp_path, stats):
    run_stage(tmp_path / "a", stats)
    run_stage(tmp_path / "b", stats)
    run_stage(tmp_path / "c", stats, seed=1)
    for split in ("train", "validation", "test"):
        a = pq.read_table(tmp_path / f"a/tasks/{split}.parquet")
        b = pq.read_table(tmp_path / f"b/tasks/{split}.parquet")
        c = pq.read_table(tmp_path / f"c/tasks/{split}.parquet")
        assert a.equals(b)
        assert not a.equals(c)


def test_an_extra_family_of_the_model_ab_benchmark_draws_the_tasks_the_stage_draws(tmp_path, stats):
    """experiments.model_ab --families: a validation family outside the profile gets the tasks the tasks stage
    would give it in the profile (same pool, seed, dims and stream), and a malformed spec names itself."""
    from experiments.model_ab import extra_tasks, parse_families

    out = run_stage(tmp_path, stats)
    params = stage_params(tmp_path)
    drawn = extra_tasks(params, parse_families("f-6-2:6:2:0.5:2,f-8-2:8:2:0.5:1"))
    assert [t.name for t in drawn] == ["validation/f-6-2/0000", "validation/f-6-2/0001", "validation/f-8-2/0000"]
    assert drawn[:2] == [t for t in out["validation"] if t.family == "f-6-2"]
    with pytest.raises(ValueError, match="'f-8-2:8': expected name:tables:devices:memory_gb:tasks"):
        parse_families("f-8-2:8")
    with pytest.raises(ValueError, match="must be >= 1"):
        parse_families("f-8-0:8:0:0.5:1")


def test_tasks_stage_param_errors(tmp_path, stats):
    with pytest.raises(ParamsError, match="tasks.profile"):
        run_stage(tmp_path, stats, profile="nope")
    with pytest.raises(ParamsError, match="tasks.dims"):
        run_stage(tmp_path, stats, dims=[4, 6])
    with pytest.raises(ValueError, match="needs 30 tables per task but the train pool has 10"):
        run_stage(tmp_path, stats, profiles={"small": [
            {"name": "big", "num_tables": 30, "num_devices": 2, "memory_gb": 1, "num_train": 1, "num_test": 1}]})


# ---------------------------------------------------------------- holdout families


HOLDOUT_FAMILIES = [
    {"name": "f-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 0.5, "num_train": 3, "num_test": 2,
     "num_validation": 2},
    {"name": "heavy-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 0.5, "num_train": 0, "num_test": 2,
     "holdout": "pooling"},
    {"name": "wide-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 2.0, "num_train": 0, "num_test": 2,
     "holdout": "dims"},
]


def test_holdout_families_draw_what_no_training_or_validation_task_holds(tmp_path, stats):
    """tasks.holdout: tables pooled beyond pooling_above are in no train, validation or test pool, only in
    "pooling" families' tasks; "dims" families draw test tables at dims wider than any training dim."""
    above = float(np.quantile(stats["pooling_factor"], 0.7))
    out = run_stage(tmp_path, stats, holdout={"pooling_above": above, "dims": [128, 256]},
                    profiles={"small": HOLDOUT_FAMILIES})
    pooling = dict(zip(stats["name"], stats["pooling_factor"]))
    light, heavy = split_heavy(stats["table_id"].tolist(), stats["pooling_factor"].tolist(), above)
    assert sorted(light + heavy) == sorted(stats["table_id"]) and not set(light) & set(heavy)
    pools = split_table_pools(light, 0.5, 0, 0.25)
    name_to_id = dict(zip(stats["name"], stats["table_id"]))
    for split in ("train", "validation"):
        assert {t.family for t in out[split]} == {"f-6-2"}
        assert all(pooling[t.name] <= above and t.dim <= 64 for task in out[split] for t in task.tables)
    by_family = {f: [t for t in out["test"] if t.family == f] for f in ("f-6-2", "heavy-6-2", "wide-6-2")}
    assert all(len(v) == 2 for v in by_family.values())
    assert all(pooling[t.name] > above for task in by_family["heavy-6-2"] for t in task.tables)
    assert all(t.dim in (128, 256) and name_to_id[t.name] in pools["test"]
               for task in by_family["wide-6-2"] for t in task.tables)
    assert all(t.dim <= 64 and name_to_id[t.name] in pools["test"] for task in by_family["f-6-2"] for t in task.tables)


def test_holdout_settings_and_families_are_checked(tmp_path, stats):
    with pytest.raises(ParamsError, match="tasks.holdout.dims: expected a list of multiples of 4 wider than every dim"):
        run_stage(tmp_path, stats, holdout={"pooling_above": 10.0, "dims": [64]})
    with pytest.raises(ParamsError, match="tasks.holdout.pooling_above"):
        run_stage(tmp_path, stats, holdout={"dims": [128]})
    with pytest.raises(ParamsError, match="a holdout family is test only"):
        run_stage(tmp_path, stats, holdout={"pooling_above": 10.0, "dims": [128]},
                  profiles={"small": [{**HOLDOUT_FAMILIES[1], "num_train": 1}]})
    with pytest.raises(ParamsError, match="holdout: expected one of"):
        run_stage(tmp_path, stats, profiles={"small": [{**HOLDOUT_FAMILIES[1], "holdout": "rows"}]})
    with pytest.raises(ParamsError, match="tasks.holdout names none"):
        run_stage(tmp_path, stats, profiles={"small": [HOLDOUT_FAMILIES[2]]})


def test_a_family_with_dims_of_its_own_trains_wider_and_the_holdout_dims_must_exceed_them(tmp_path, stats):
    """A family's own `dims` (issue 55: training spans wider dims than the test families) are what its tables
    take; family_dims is every family's dims, table_dims those the training tables took; the holdout dims must be
    wider than all of them."""
    from dreamshard.project.tasks import family_dims
    from dreamshard.tasks import table_dims

    wide_train = {"name": "w-6-2", "num_tables": 6, "num_devices": 2, "memory_gb": 2.0, "num_train": 2,
                  "num_test": 0, "num_validation": 1, "dims": [4, 128]}
    profile = {"small": [HOLDOUT_FAMILIES[0], wide_train, HOLDOUT_FAMILIES[2]]}
    out = run_stage(tmp_path, stats, holdout={"pooling_above": 1e9, "dims": [256]}, profiles=profile)
    assert {t.dim for task in out["train"] if task.family == "w-6-2" for t in task.tables} <= {4, 128}
    assert any(t.dim == 128 for task in out["train"] if task.family == "w-6-2" for t in task.tables)
    assert {t.dim for task in out["train"] if task.family == "f-6-2" for t in task.tables} <= {4, 16, 64}
    params = stage_params(tmp_path, holdout={"pooling_above": 1e9, "dims": [256]}, profiles=profile)
    assert family_dims(params) == [4, 16, 64, 128]
    # what training draws at (collect_devices, NeuroShard's augmentation): the training tables' own dims
    assert 128 in table_dims(out["train"]) and set(table_dims(out["train"])) <= {4, 16, 64, 128}
    with pytest.raises(ParamsError, match=r"tasks.holdout.dims: .*families' dims \(max 128\)"):
        run_stage(tmp_path, stats, holdout={"pooling_above": 1e9, "dims": [128]}, profiles=profile)
    with pytest.raises(ParamsError, match="dims: expected a list of positive multiples of 4"):
        run_stage(tmp_path, stats, profiles={"small": [{**wide_train, "dims": [4, 6]}]})
    with pytest.raises(ParamsError, match="a holdout family takes its dims from tasks.holdout"):
        run_stage(tmp_path, stats, holdout={"pooling_above": 1e9, "dims": [256]},
                  profiles={"small": [{**HOLDOUT_FAMILIES[2], "dims": [512]}]})


def test_the_world_profile_needs_the_holdout_its_results_page_gives_it():
    """params.yaml's `world` profile trains at dims up to 256: with the default holdout dims (256, 512) the tasks
    stage refuses it, naming the key; with results/holdout/world-training's overrides it is consistent."""
    from pathlib import Path

    import yaml

    from dreamshard.project.tasks import family_dims, holdout_settings

    root = Path(__file__).resolve().parents[2]
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tasks"]["profile"] = "world"
    with pytest.raises(ParamsError, match="tasks.holdout.dims"):
        holdout_settings(params, family_dims(params))
    page = (root / "results/holdout/world-training/README.md").read_text()
    assert "-S tasks.profile=world" in page and "'tasks.holdout.dims=[384,512]'" in page
    params["tasks"]["holdout"] = {"pooling_above": 100, "dims": [384, 512]}
    assert family_dims(params) == [4, 8, 16, 32, 64, 128, 256]
    assert holdout_settings(params, family_dims(params)) == (100.0, [384, 512])
