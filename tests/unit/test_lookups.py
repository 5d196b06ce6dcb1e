"""Lookup sources the kernels read (dreamshard.data.lookups): generated from statistics, or recorded."""
from __future__ import annotations

import numpy as np
import pytest

from dreamshard.data.dlrm import (
    TableProfile,
    generate_lookups,
)
from dreamshard.data.lookups import (
    DEFAULT_ZIPF_ALPHA,
    GeneratedLookups,
    RecordedLookups,
    resize_batch,
)
from dreamshard.data.requests import TableRequests
from dreamshard.errors import DataFormatError
from dreamshard.tables import Table, access_count_bins

# ---------------------------------------------------------------- lookups


def stat_table(name: str, rows: int, pooling: float, alpha: float, batch: int = 1024, seed: int = 0,
               dim: int = 8) -> Table:
    """A table whose bins are those of lookups generated with Zipf exponent `alpha`."""
    idx, _ = generate_lookups(TableProfile(rows, pooling, alpha), batch, seed)
    _, counts = np.unique(idx, return_counts=True)
    return Table(name, rows, dim, pooling, tuple(access_count_bins(counts)))


def test_generated_lookups_are_seeded_and_well_formed():
    t = stat_table("g", 5_000, 6.0, 0.9)
    a = GeneratedLookups(seed=3).lookups(t, 300)
    b = GeneratedLookups(seed=3).lookups(t, 300)
    c = GeneratedLookups(seed=4).lookups(t, 300)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert not (len(a.indices) == len(c.indices) and np.array_equal(a.indices, c.indices))
    for req, batch in ((a, 300), (GeneratedLookups().lookups(t, 17), 17)):
        assert req.batch_size == batch
        assert int(req.lengths.sum()) == len(req.indices)
        assert (req.indices >= 0).all() and (req.indices < t.rows).all()
        assert req.indices.dtype == np.int64
    assert a.lengths.mean() == pytest.approx(6.0, rel=0.2)


def test_generated_lookups_depend_on_the_table_name_not_on_order():
    t1, t2 = stat_table("first", 2_000, 4.0, 0.6), stat_table("second", 2_000, 4.0, 0.6)
    src = GeneratedLookups(seed=1)
    x1 = src.lookups(t1, 100)
    src.lookups(t2, 100)
    y1 = GeneratedLookups(seed=1)
    y1.lookups(t2, 100)
    np.testing.assert_array_equal(y1.lookups(t1, 100).indices, x1.indices)


@pytest.mark.parametrize("alpha", [0.4, 1.2])
@pytest.mark.parametrize("rows, pooling", [(5_000, 5.0), (20_000, 10.0)])
def test_fitted_zipf_exponent_recovers_the_generating_one(alpha, rows, pooling):
    batch = 512
    t = stat_table(f"z{alpha}-{rows}", rows, pooling, alpha, batch=batch, seed=7)
    fitted = GeneratedLookups().zipf_alpha(t, batch)
    assert abs(fitted - alpha) <= 0.2, fitted


def test_zipf_exponent_without_bins_is_the_default():
    assert GeneratedLookups().zipf_alpha(Table("nobins", 1000, 8, 3.0), 256) == DEFAULT_ZIPF_ALPHA
    req = GeneratedLookups().lookups(Table("nobins", 1000, 8, 3.0), 64)
    assert req.batch_size == 64 and (req.indices < 1000).all()


def test_resize_batch_cycles_and_truncates():
    # sample 0 reads [1, 2], sample 1 nothing, sample 2 reads [5, 6, 7]
    req = TableRequests(np.array([1, 2, 5, 6, 7], dtype=np.int64), np.array([2, 0, 3], dtype=np.int64))
    bigger = resize_batch(req, 7)
    np.testing.assert_array_equal(bigger.lengths, [2, 0, 3, 2, 0, 3, 2])
    np.testing.assert_array_equal(bigger.indices, [1, 2, 5, 6, 7, 1, 2, 5, 6, 7, 1, 2])
    smaller = resize_batch(req, 2)
    np.testing.assert_array_equal(smaller.lengths, [2, 0])
    np.testing.assert_array_equal(smaller.indices, [1, 2])
    same = resize_batch(req, 3)
    np.testing.assert_array_equal(same.indices, req.indices)
    np.testing.assert_array_equal(same.lengths, req.lengths)
    empty_lookups = resize_batch(TableRequests(np.zeros(0, np.int64), np.zeros(2, np.int64)), 5)
    assert empty_lookups.batch_size == 5 and len(empty_lookups.indices) == 0
    with pytest.raises(ValueError, match="empty batch"):
        resize_batch(TableRequests(np.zeros(0, np.int64), np.zeros(0, np.int64)), 4)


def test_recorded_lookups_resize_by_table_name():
    req = TableRequests(np.array([3, 1, 4, 1, 5], dtype=np.int64), np.array([1, 1, 3], dtype=np.int64))
    src = RecordedLookups({"rec": req})
    t = Table("rec", 10, 4, 1.0)
    out = src.lookups(t, 5)
    np.testing.assert_array_equal(out.lengths, [1, 1, 3, 1, 1])
    np.testing.assert_array_equal(out.indices, [3, 1, 4, 1, 5, 3, 1])
    assert int(out.lengths.sum()) == len(out.indices)
    np.testing.assert_array_equal(src.lookups(t, 1).indices, [3])
    with pytest.raises(DataFormatError, match="'other'"):
        src.lookups(Table("other", 10, 4, 1.0), 5)
