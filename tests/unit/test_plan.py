"""Plans: validation rules, memory accounting and JSON I/O."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dreamshard.errors import DataFormatError, InvalidPlanError
from dreamshard.memory import MemoryModel
from dreamshard.plan import Plan, Shard, device_memory_bytes, validate_plan
from dreamshard.tables import Table
from dreamshard.tasks import Device, Task

# fp32, exact_sgd: bytes = rows x dim x 4
#   a: 1000 x 16 -> 64000    b: 500 x 8 -> 16000    c: 100 x 32 -> 12800
CAPACITY = 80_000


@pytest.fixture
def task() -> Task:
    tables = (Table("a", 1000, 16, 2.0), Table("b", 500, 8, 1.0), Table("c", 100, 32, 5.0))
    return Task("t", tables, (Device(CAPACITY), Device(CAPACITY)))


def plan(*shards, n=2) -> Plan:
    return Plan(n, tuple(Shard(*s) for s in shards))


VALID = [("a", 0, 0, 16), ("b", 1, 0, 8), ("c", 1, 0, 32)]


def test_a_valid_plan_passes(task):
    validate_plan(task, plan(*VALID))
    assert device_memory_bytes(task, plan(*VALID)) == [64000, 28800]


def test_column_slices_that_tile_the_table_pass(task):
    p = plan(("a", 0, 0, 16), ("b", 1, 0, 8), ("c", 1, 16, 32), ("c", 0, 0, 8), ("c", 1, 8, 16))
    validate_plan(task, p)
    # c's slices take 100 rows x 8 or 16 columns x 4 bytes on their devices
    assert device_memory_bytes(task, p) == [64000 + 3200, 16000 + 6400 + 3200]


def test_plan_exactly_at_capacity_passes(task):
    validate_plan(task, plan(("a", 0, 0, 16), ("b", 0, 0, 8), ("c", 1, 0, 32)))  # device 0: 80000 of 80000
    tight = Task("t", task.tables, (Device(64000), Device(28800)))
    validate_plan(tight, plan(*VALID))
    with pytest.raises(InvalidPlanError, match="device 1: 28800 bytes placed, capacity 28799"):
        validate_plan(Task("t", task.tables, (Device(64000), Device(28799))), plan(*VALID))


@pytest.mark.parametrize(
    "shards, n, pattern",
    [
        pytest.param(VALID[:2], 2, r"table 'c': rows \[0, 100\) x columns \[0, 32\) not placed \(100 rows x dim 32\)",
                     id="missing"),
        pytest.param(VALID + [("b", 0, 0, 8)], 2, r"table 'b': b\[0:8\] and b\[0:8\] overlap: cells placed more than once",
                     id="twice"),
        pytest.param(VALID + [("zz", 0, 0, 8)], 2, r"unknown table 'zz'", id="unknown-table"),
        pytest.param([("a", 0, 0, 16), ("b", 2, 0, 8), ("c", 1, 0, 32)], 2,
                     r"table 'b' on device 2, expected 0\.\.1", id="device-too-high"),
        pytest.param([("a", 0, 0, 16), ("b", -1, 0, 8), ("c", 1, 0, 32)], 2,
                     r"table 'b' on device -1", id="device-negative"),
        pytest.param([("a", 0, 0, 16), ("b", 0, 0, 8), ("c", 0, 0, 32)], 2,
                     r"device 0: 92800 bytes placed, capacity 80000", id="memory-exceeded"),
        pytest.param(VALID, 3, r"plan is for 3 devices, task 't' has 2", id="num-devices"),
        pytest.param(VALID[:2] + [("c", 0, 0, 20), ("c", 1, 16, 32)], 2,
                     r"table 'c': c\[0:20\] and c\[16:32\] overlap", id="slices-overlap"),
        pytest.param(VALID[:2] + [("c", 0, 0, 8), ("c", 1, 16, 32)], 2,
                     r"table 'c': rows \[0, 100\) x columns \[8, 16\) not placed", id="slices-gap"),
        pytest.param(VALID[:2] + [("c", 0, 0, 8), ("c", 1, 8, 28)], 2,
                     r"table 'c': rows \[0, 100\) x columns \[28, 32\) not placed", id="slices-short"),
        pytest.param(VALID[:2] + [("c", 1, 0, 36)], 2, r"table 'c': columns \[0, 36\) outside its dim 32", id="beyond-dim"),
        pytest.param(VALID[:2] + [("c", 0, 0, 6), ("c", 1, 6, 32)], 2,
                     r"table 'c': columns \[0, 6\) must be .*multiples of 4", id="slice-not-multiple-of-4"),
        pytest.param(VALID[:2] + [("c", 0, 0, 8), ("c", 1, 8, 8), ("c", 1, 8, 32)], 2,
                     r"table 'c': columns \[8, 8\) must be a non-empty range", id="empty-slice"),
        pytest.param(VALID[:2] + [("c", 1, 32, 0)], 2, r"table 'c': columns \[32, 0\)", id="reversed-slice"),
        pytest.param(VALID[:2] + [("c", 0, -4, 4), ("c", 1, 4, 32)], 2, r"table 'c': columns \[-4, 4\) outside its dim 32",
                     id="negative-col-start"),
    ],
)
def test_invalid_plans_name_the_table_or_device(task, shards, n, pattern):
    p = plan(*shards, n=n)
    with pytest.raises(InvalidPlanError, match=pattern):
        validate_plan(task, p)


def test_invalid_plan_error_is_a_value_error(task):
    with pytest.raises(ValueError):
        validate_plan(task, plan(*VALID[:2]))


def test_memory_model_counts_optimizer_state_per_shard():
    # row-wise adagrad keeps one fp32 per row in each column slice
    task = Task("t", (Table("a", 1000, 16, 1.0),), (Device(10**6), Device(10**6)),
                MemoryModel("fp16", "exact_row_wise_adagrad"))
    whole = plan(("a", 0, 0, 16))
    split = plan(("a", 0, 0, 8), ("a", 1, 8, 16))
    assert device_memory_bytes(task, whole) == [1000 * 16 * 2 + 1000 * 4, 0]
    assert device_memory_bytes(task, split) == [1000 * 8 * 2 + 1000 * 4] * 2
    assert MemoryModel("fp32", "adam").shard_bytes(10, 4) == 10 * 4 * (4 + 8)
    assert MemoryModel("fp32", "exact_adagrad").shard_bytes(10, 4) == 10 * 4 * 8
    with pytest.raises(ValueError, match="optimizer"):
        MemoryModel("fp32", "sgd")
    with pytest.raises(ValueError, match="weights_precision"):
        MemoryModel("bf16")


def test_from_assignment_places_whole_tables(task):
    p = Plan.from_assignment(task, [0, 1, 1])
    assert p == plan(*VALID)
    with pytest.raises(ValueError, match="2 entries for 3 tables"):
        Plan.from_assignment(task, [0, 1])


# ---------------------------------------------------------------- JSON


def test_plan_json_round_trip(tmp_path, task):
    p = plan(("a", 0, 0, 16), ("b", 1, 0, 8), ("c", 1, 16, 32), ("c", 0, 0, 16))
    path = tmp_path / "out" / "plan.json"
    p.save_json(path, algorithm="size_greedy")
    obj = json.loads(path.read_text())
    assert obj["num_devices"] == 2 and obj["algorithm"] == "size_greedy"
    assert obj["shards"][2] == {"table": "c", "device": 1, "col_start": 16, "col_end": 32}
    back = Plan.load_json(path)
    assert back == p
    assert Plan.from_dict(p.to_dict()) == p
    validate_plan(task, back)


@pytest.mark.parametrize(
    "obj, pattern",
    [
        ([], r"expected a JSON object"),
        ("plan", r"expected a JSON object"),
        ({"shards": []}, r"num_devices: expected a positive integer, got None"),
        ({"num_devices": 0, "shards": []}, r"num_devices: expected a positive integer, got 0"),
        ({"num_devices": True, "shards": []}, r"num_devices: .* got True"),
        ({"num_devices": "2", "shards": []}, r"num_devices: .* got '2'"),
        ({"num_devices": 2.0, "shards": []}, r"num_devices: .* got 2.0"),
        ({"num_devices": 2}, r"shards: expected a list, got NoneType"),
        ({"num_devices": 2, "shards": {"a": 0}}, r"shards: expected a list, got dict"),
        ({"num_devices": 2, "shards": [["a", 0, 0, 16]]}, r"shards\[0\]: expected an object"),
        ({"num_devices": 2, "shards": [{"device": 0, "col_start": 0, "col_end": 16}]}, r"shards\[0\]\.table: expected str"),
        ({"num_devices": 2, "shards": [{"table": 1, "device": 0, "col_start": 0, "col_end": 16}]},
         r"shards\[0\]\.table: expected str, got 1"),
        ({"num_devices": 2, "shards": [{"table": "a", "device": 0, "col_start": 0, "col_end": 16},
                                       {"table": "b", "device": "1", "col_start": 0, "col_end": 8}]},
         r"shards\[1\]\.device: expected int, got '1'"),
        ({"num_devices": 2, "shards": [{"table": "a", "device": False, "col_start": 0, "col_end": 16}]},
         r"shards\[0\]\.device: expected int, got False"),
        ({"num_devices": 2, "shards": [{"table": "a", "device": 0, "col_start": 0.0, "col_end": 16}]},
         r"shards\[0\]\.col_start: expected int, got 0.0"),
        ({"num_devices": 2, "shards": [{"table": "a", "device": 0, "col_start": 0}]},
         r"shards\[0\]\.col_end: expected int, got None"),
    ],
)
def test_from_dict_rejects_bad_shapes(obj, pattern):
    with pytest.raises(DataFormatError, match=r"^my\.json: " + pattern):
        Plan.from_dict(obj, "my.json")


def test_load_json_errors_name_the_file(tmp_path):
    with pytest.raises(DataFormatError, match=r"absent\.json: no such file"):
        Plan.load_json(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataFormatError, match=r"bad\.json: not valid JSON"):
        Plan.load_json(bad)
    shape = tmp_path / "shape.json"
    shape.write_text('{"num_devices": 2, "shards": 3}')
    with pytest.raises(DataFormatError, match=r"shape\.json: shards: expected a list, got int"):
        Plan.load_json(shape)


# ---------------------------------------------------------------- row ranges (row-wise shards)

# a: 1000 rows x 16 cols. Row ranges of whole rows, and row ranges of column slices.
ROWWISE = [("a", 0, 0, 16, 0, 600), ("a", 1, 0, 16, 600, 1000), ("b", 1, 0, 8), ("c", 0, 0, 32)]


def test_row_ranges_that_tile_the_table_pass_and_count_their_rows(task):
    p = plan(*ROWWISE)
    validate_plan(task, p)
    # a's rows 0..600 x 16 x 4 B on device 0 beside c; rows 600..1000 on device 1 beside b
    assert device_memory_bytes(task, p) == [600 * 16 * 4 + 12800, 400 * 16 * 4 + 16000]
    grid = plan(("a", 0, 0, 8, 0, 500), ("a", 1, 8, 16, 0, 500), ("a", 1, 0, 8, 500, 1000), ("a", 0, 8, 16, 500, 1000),
                ("b", 1, 0, 8), ("c", 0, 0, 32))
    validate_plan(task, grid)
    kinds = [s.kind(1000, 16) for s in grid.shards[:4]] + [s.kind(500, 8) for s in grid.shards[4:5]]
    assert kinds == ["row+column"] * 4 + ["table"]
    assert [s.kind(1000, 16) for s in plan(*ROWWISE).shards[:2]] == ["row", "row"]
    assert Shard("c", 0, 8, 16).kind(100, 32) == "column"


@pytest.mark.parametrize("shards, pattern", [
    pytest.param([("a", 0, 0, 16, 0, 600), ("a", 1, 0, 16, 500, 1000)],
                 r"table 'a': a\[0:600, 0:16\] and a\[500:1000, 0:16\] overlap", id="rows-overlap"),
    pytest.param([("a", 0, 0, 16, 0, 600), ("a", 1, 0, 16, 700, 1000)],
                 r"table 'a': rows \[600, 700\) x columns \[0, 16\) not placed", id="rows-gap"),
    pytest.param([("a", 0, 0, 16, 0, 600), ("a", 1, 0, 16, 600, 1001)],
                 r"table 'a': rows \[600, 1001\) must be a non-empty range within its 1000 rows", id="rows-beyond"),
    pytest.param([("a", 0, 0, 16, -1, 600), ("a", 1, 0, 16, 600, 1000)],
                 r"table 'a': rows \[-1, 600\)", id="rows-negative"),
    pytest.param([("a", 0, 0, 16, 0, 0), ("a", 1, 0, 16, 0, 1000)], r"table 'a': rows \[0, 0\) must be a non-empty",
                 id="rows-empty"),
    pytest.param([("a", 0, 0, 8, 0, 500), ("a", 1, 8, 16, 0, 500), ("a", 1, 0, 16, 500, 1000), ("a", 0, 0, 8, 400, 450)],
                 r"a\[0:500, 0:8\] and a\[400:450, 0:8\] overlap", id="block-inside-block"),
])
def test_bad_row_ranges_are_refused_naming_the_cells(task, shards, pattern):
    with pytest.raises(InvalidPlanError, match=pattern):
        validate_plan(task, plan(*shards, ("b", 1, 0, 8), ("c", 0, 0, 32)))


@pytest.mark.parametrize("optimizer, per_row, per_weight", [
    ("exact_sgd", 0, 4), ("exact_row_wise_adagrad", 4, 4), ("exact_adagrad", 0, 8), ("adam", 0, 12)])
def test_memory_of_row_shards_for_every_optimizer(optimizer, per_row, per_weight):
    """A row shard holds its rows' weights and their optimizer state (row-wise state is per row of the shard)."""
    t = Table("t", 1000, 16, 1.0)
    task = Task("m", (t,), (Device(10**9), Device(10**9)), MemoryModel("fp32", optimizer))
    p = Plan(2, (Shard("t", 0, 0, 16, 0, 250), Shard("t", 1, 0, 16, 250, 1000)))
    validate_plan(task, p)
    assert device_memory_bytes(task, p) == [250 * (16 * per_weight + per_row), 750 * (16 * per_weight + per_row)]
    assert sum(device_memory_bytes(task, p)) == task.memory.shard_bytes(1000, 16)


def test_row_ranges_round_trip_through_json_and_old_plans_load(tmp_path, task):
    p = plan(*ROWWISE)
    p.save_json(tmp_path / "p.json")
    obj = json.loads((tmp_path / "p.json").read_text())
    assert obj["shards"][0] == {"table": "a", "device": 0, "col_start": 0, "col_end": 16, "row_start": 0, "row_end": 600}
    assert set(obj["shards"][2]) == {"table", "device", "col_start", "col_end"}  # all rows: written as before
    assert Plan.load_json(tmp_path / "p.json") == p
    old = {"num_devices": 2, "shards": [{"table": "a", "device": 0, "col_start": 0, "col_end": 16}]}
    assert Plan.from_dict(old).shards[0].rows(1000) == (0, 1000)
    with pytest.raises(DataFormatError, match=r"shards\[0\]: row_start and row_end go together"):
        Plan.from_dict({"num_devices": 2, "shards": [{**old["shards"][0], "row_start": 5}]})
    with pytest.raises(DataFormatError, match=r"shards\[0\]\.row_end: expected int, got '9'"):
        Plan.from_dict({"num_devices": 2, "shards": [{**old["shards"][0], "row_start": 0, "row_end": "9"}]})


def test_a_pinned_table_off_its_device_is_refused():
    from dataclasses import replace as _replace

    task = Task.uniform("pins", [Table("a", 10, 8, 1.0), Table("b", 10, 8, 1.0)], 2, 1.0)
    pinned = _replace(task, pins=(("a", 1),))
    validate_plan(pinned, Plan(2, (Shard("a", 1, 0, 8), Shard("b", 1, 0, 8))))
    with pytest.raises(InvalidPlanError, match=r"table 'a' is pinned to device 1, but a\[0:8\] is on device 0"):
        validate_plan(pinned, Plan(2, (Shard("a", 0, 0, 8), Shard("b", 1, 0, 8))))
    with pytest.raises(ValueError, match="pin of unknown table 'c'"):
        _replace(task, pins=(("c", 0),))
    with pytest.raises(ValueError, match="pinned to device 2"):
        _replace(task, pins=(("a", 2),))


def test_plan_key_is_the_plans_identity_whatever_the_shard_order():
    a = Plan(2, (Shard("x", 0, 0, 8), Shard("y", 1, 0, 4, 0, 10), Shard("y", 0, 0, 4, 10, 20)))
    b = Plan(2, tuple(reversed(a.shards)))
    assert a.key() == b.key() and hash(a.key()) == hash(b.key())
    assert Plan(2, (Shard("x", 1, 0, 8), *a.shards[1:])).key() != a.key()  # another device
    assert Plan(2, (Shard("x", 0, 0, 8, 0, 5), Shard("x", 0, 0, 8, 5, None))).key() != \
        Plan(2, (Shard("x", 0, 0, 8),)).key()  # row ranges are part of it
    x = Shard("x", 0, 0, 8)
    in_hbm, in_host, cached = (Plan(1, (replace(x, cache=c),)).key() for c in (None, 0.0, 0.5))
    assert len({in_hbm, in_host, cached}) == 3  # device memory, host memory (fused_uvm) and a cache differ
    assert Plan(1, (replace(x, replica=True),)).key() != in_hbm


def test_a_whole_table_its_limits_refuse_is_refused(task):
    """The checks a whole table in device memory passes quickly still hold its own limits."""
    from dataclasses import replace as with_

    row_only = with_(task, sharding=("table", "row"), table_kinds=(("a", ("row",)),))
    with pytest.raises(InvalidPlanError, match=r"table 'a' is planned table, but it allows row only"):
        validate_plan(row_only, plan(*VALID))
    cached = with_(task, kernels=("fused", "fused_uvm_caching"), must_cache=("b",))
    with pytest.raises(InvalidPlanError, match=r"table 'b' must be UVM-cached"):
        validate_plan(cached, plan(*VALID))
    validate_plan(with_(task, table_kinds=(("a", ("table",)),)), plan(*VALID))


def test_plan_json_writes_a_shard_a_line_and_reads_back(tmp_path, task):
    p = plan(*VALID)
    path = tmp_path / "plan.json"
    p.save_json(path, note='"shards": null')
    lines = path.read_text().splitlines()
    assert lines[2] == '  "shards": [' and lines[3] == '    {"table": "a", "device": 0, "col_start": 0, "col_end": 16},'
    assert json.loads(path.read_text())["note"] == '"shards": null' and Plan.load_json(path) == p
    Plan(2, ()).save_json(path)
    assert json.loads(path.read_text()) == {"num_devices": 2, "shards": []}
    with pytest.raises(ValueError, match="num_devices or shards"):
        p.save_json(path, shards=[])
