"""The DLRM embedding_bag file format, per-table statistics and the synthetic generator."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from dreamshard.data.dlrm import (
    MIN_ROWS,
    EmbeddingBagBatch,
    SyntheticConfig,
    generate_synthetic,
    load_dlrm_file,
    sample_table_profiles,
    save_dlrm_file,
    synthetic_pooling,
    table_statistics,
)
from dreamshard.errors import DataFormatError
from dreamshard.tables import NUM_BINS, access_count_bins

# Two tables, three samples each. Table-major offsets:
#   t0: [5, 1 0 | (none) | 7 7]      t1: [2 2 2 | 9 | 0]
LENGTHS = [[1, 0, 2], [3, 1, 1]]
INDICES = [5, 7, 7, 2, 2, 2, 9, 0]
OFFSETS = [0, 1, 1, 3, 6, 7, 8]


def tensors(indices=INDICES, offsets=OFFSETS, lengths=LENGTHS, dtype=torch.int64):
    return (torch.tensor(indices, dtype=dtype), torch.tensor(offsets, dtype=dtype), torch.tensor(lengths, dtype=dtype))


def small_batch() -> EmbeddingBagBatch:
    return EmbeddingBagBatch(np.array(INDICES), np.array(OFFSETS), np.array(LENGTHS))


def write_raw(path: Path, obj) -> Path:
    """torch.save `obj` to `path`, gzipped when the name ends in .gz (no library code involved)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            torch.save(obj, fh)
    else:
        torch.save(obj, path)
    return path


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["batch.pt", "batch.pt.gz"])
def test_save_then_load_round_trips(tmp_path, name):
    path = tmp_path / name
    save_dlrm_file(small_batch(), path)
    got = load_dlrm_file(path)
    for field in ("indices", "offsets", "lengths"):
        arr = getattr(got, field)
        assert arr.dtype == np.int64
        np.testing.assert_array_equal(arr, getattr(small_batch(), field))
    assert (got.num_tables, got.batch_size) == (2, 3)
    is_gzip = path.read_bytes()[:2] == b"\x1f\x8b"
    assert is_gzip == name.endswith(".gz")
    assert [p.name for p in tmp_path.iterdir()] == [name]  # atomic write leaves no temp file behind


@pytest.mark.parametrize("name", ["raw.pt", "raw.pt.gz"])
def test_files_written_by_torch_save_are_read(tmp_path, name):
    # The published files are plain torch.save tuples, possibly of int32 tensors.
    path = write_raw(tmp_path / name, tensors(dtype=torch.int32))
    got = load_dlrm_file(path)
    assert got.indices.dtype == np.int64
    np.testing.assert_array_equal(got.indices, INDICES)
    np.testing.assert_array_equal(got.offsets, OFFSETS)
    np.testing.assert_array_equal(got.lengths, LENGTHS)


def test_decompressed_content_of_gzipped_save_is_reproducible(tmp_path):
    save_dlrm_file(small_batch(), tmp_path / "a.pt.gz")
    first = gzip.decompress((tmp_path / "a.pt.gz").read_bytes())
    save_dlrm_file(small_batch(), tmp_path / "a.pt.gz")
    assert gzip.decompress((tmp_path / "a.pt.gz").read_bytes()) == first


def test_gzipped_save_is_byte_for_byte_reproducible(tmp_path):
    # save_dlrm_file promises (mtime=0) that the same batch gives the same bytes, so that
    # DVC sees no change when the download stage reruns.
    path = tmp_path / "a.pt.gz"
    save_dlrm_file(small_batch(), path)
    first = path.read_bytes()
    save_dlrm_file(small_batch(), path)
    assert path.read_bytes() == first


def test_batch_table_slices_a_tables_first_samples():
    batch = small_batch()
    ix, lg = batch.table(0)
    np.testing.assert_array_equal(ix, [5, 7, 7])
    np.testing.assert_array_equal(lg, [1, 0, 2])
    ix, lg = batch.table(1, 2)
    np.testing.assert_array_equal(ix, [2, 2, 2, 9])
    np.testing.assert_array_equal(lg, [3, 1])
    ix, lg = batch.table(1, 99)  # more than the batch: all of it
    np.testing.assert_array_equal(ix, [2, 2, 2, 9, 0])


# ---------------------------------------------------------------- malformed files


def _bad_offsets_start():
    # offsets shifted by one: diffs still equal lengths, but offsets[0] = 1
    return tensors(indices=INDICES + [0], offsets=[o + 1 for o in OFFSETS])


MALFORMED = {
    # case: (object saved, words the message must contain)
    "not_a_tuple": (lambda: {"indices": torch.tensor(INDICES)}, ["tuple", "dict"]),
    "a_bare_tensor": (lambda: torch.tensor(INDICES), ["tuple", "Tensor"]),
    "tuple_of_two": (lambda: tensors()[:2], ["(indices, offsets, lengths)"]),
    "tuple_of_four": (lambda: tensors() + (torch.tensor([1]),), ["(indices, offsets, lengths)"]),
    "not_a_tensor": (lambda: (INDICES, tensors()[1], tensors()[2]), ["indices", "tensor", "list"]),
    "float_indices": (lambda: (torch.tensor(INDICES, dtype=torch.float32),) + tensors()[1:], ["indices", "integer", "float32"]),
    "float_lengths": (lambda: tensors()[:2] + (torch.tensor(LENGTHS, dtype=torch.float64),), ["lengths", "integer"]),
    "lengths_1d": (lambda: tensors(lengths=[1, 0, 2, 3, 1, 1]), ["lengths", "2-D"]),
    "lengths_3d": (lambda: tensors(lengths=[[[1, 0, 2], [3, 1, 1]]]), ["lengths", "2-D"]),
    "indices_2d": (lambda: tensors(indices=[INDICES]), ["indices", "1-D"]),
    "offsets_too_short": (lambda: tensors(offsets=OFFSETS[:-1]), ["offsets", "T*B+1", "7"]),
    "offsets_per_table": (lambda: tensors(offsets=[0, 3, 8]), ["offsets", "T*B+1"]),
    "offsets_not_from_zero": (_bad_offsets_start, ["offsets", "offsets[0]"]),
    "diff_offsets_not_lengths": (lambda: tensors(offsets=[0, 1, 2, 3, 6, 7, 8]), ["offsets", "lengths[0, 1]"]),
    "last_offset_not_num_indices": (
        lambda: tensors(indices=INDICES + [3]), ["offsets", "last offset", "9"]
    ),
    "negative_indices": (lambda: tensors(indices=[5, 7, -7, 2, 2, 2, 9, 0]), ["indices", "negative"]),
    "negative_lengths": (
        lambda: tensors(lengths=[[1, 0, 2], [3, -1, 3]], offsets=[0, 1, 1, 3, 6, 5, 8]), ["lengths", "negative"]
    ),
    "empty_lengths": (lambda: tensors(indices=[], offsets=[0], lengths=[[]]), ["lengths", "B >= 1"]),
}


@pytest.mark.parametrize("suffix", [".pt", ".pt.gz"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_names_the_file_and_the_field(tmp_path, case, suffix):
    make, words = MALFORMED[case]
    path = write_raw(tmp_path / f"{case}{suffix}", make())
    with pytest.raises(DataFormatError) as info:
        load_dlrm_file(path)
    msg = str(info.value)
    assert str(path) in msg
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"
    assert "\n" not in msg


@pytest.mark.parametrize(
    "name, content",
    [
        ("corrupt.pt.gz", b"\x1f\x8b\x08\x00" + b"not really gzip" * 10),  # gzip header, garbage body
        ("plain_bytes_named.pt.gz", b"this is not gzip at all"),
        ("text.pt", b"indices,offsets,lengths\n1,2,3\n"),
        ("empty.pt", b""),
    ],
)
def test_unreadable_file_is_a_data_format_error(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataFormatError, match="cannot be read as a torch.save file") as info:
        load_dlrm_file(path)
    assert str(path) in str(info.value)


def test_truncated_gzip_is_a_data_format_error(tmp_path):
    good = tmp_path / "good.pt.gz"
    save_dlrm_file(small_batch(), good)
    bad = tmp_path / "truncated.pt.gz"
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(DataFormatError, match="truncated.pt.gz"):
        load_dlrm_file(bad)


def test_gzip_content_in_a_plain_pt_file_is_rejected(tmp_path):
    gz = tmp_path / "x.pt.gz"
    save_dlrm_file(small_batch(), gz)
    plain = tmp_path / "x.pt"
    plain.write_bytes(gz.read_bytes())
    with pytest.raises(DataFormatError, match="x.pt"):
        load_dlrm_file(plain)


def test_missing_file_and_wrong_suffix(tmp_path):
    with pytest.raises(DataFormatError, match="no such file"):
        load_dlrm_file(tmp_path / "absent.pt")
    other = write_raw(tmp_path / "batch.pth", tensors())
    with pytest.raises(DataFormatError, match=r"\.pt or \.pt\.gz"):
        load_dlrm_file(other)


def test_a_list_instead_of_a_tuple_is_accepted(tmp_path):
    # torch.save of a list of three tensors holds the same data; it is read as such.
    got = load_dlrm_file(write_raw(tmp_path / "list.pt", list(tensors())))
    np.testing.assert_array_equal(got.lengths, LENGTHS)


# ---------------------------------------------------------------- statistics


def test_rows_is_at_least_min_rows():
    s = table_statistics(np.array([0, 5, 3, 5]), np.array([2, 2]))
    assert MIN_ROWS == 100
    assert s.rows == 100  # max index 5 -> max(100, 6)
    s = table_statistics(np.array([499, 0, 7]), np.array([1, 2]))
    assert s.rows == 500  # max index 499 -> 500
    s = table_statistics(np.array([99]), np.array([1]))
    assert s.rows == 100


def test_pooling_factor_is_the_mean_length_as_a_float():
    s = table_statistics(np.array([1, 2, 3]), np.array([1, 2]))
    assert isinstance(s.pooling_factor, float)
    assert s.pooling_factor == 1.5
    s = table_statistics(np.array([1, 2, 3]), np.array([0, 0, 3]))
    assert s.pooling_factor == 1.0
    s = table_statistics(np.array([4, 4]), np.array([0, 1, 0, 1]))
    assert s.pooling_factor == 0.5


def test_bins_on_a_hand_computed_example():
    # rows 10..16 accessed 1, 2, 3, 4, 5, 2^15 and 2^15+1 times
    counts = [1, 2, 3, 4, 5, 2**15, 2**15 + 1]
    indices = np.repeat(np.arange(10, 17), counts)
    np.random.default_rng(0).shuffle(indices)
    lengths = np.array([len(indices) // 2, len(indices) - len(indices) // 2])
    s = table_statistics(indices, lengths)
    assert s.rows == 100
    assert s.num_lookups == sum(counts) == 65_552
    assert s.num_unique == 7
    assert s.pooling_factor == 65_552 / 2
    expected = [0.0] * NUM_BINS
    expected[0] = 1 / 7  # count 1: exactly once
    expected[1] = 1 / 7  # count 2: (1, 2]
    expected[2] = 2 / 7  # counts 3, 4: (2, 4]
    expected[3] = 1 / 7  # count 5: (4, 8]
    expected[15] = 1 / 7  # count 2^15: (2^14, 2^15]
    expected[16] = 1 / 7  # count 2^15+1: more than 2^15
    assert len(s.bins) == NUM_BINS
    assert s.bins == pytest.approx(expected, abs=1e-12)


def test_access_count_bins_edges():
    counts = [1, 1, 8, 9, 16, 17, 2**14, 2**14 + 1, 0]  # the zero (a row never read) is not a distinct accessed row
    bins = access_count_bins(counts)
    expected = [0.0] * NUM_BINS
    expected[0] = 2 / 8
    expected[3] = 1 / 8  # 8 in (4, 8]
    expected[4] = 2 / 8  # 9, 16 in (8, 16]
    expected[5] = 1 / 8  # 17 in (16, 32]
    expected[14] = 1 / 8  # 2^14 in (2^13, 2^14]
    expected[15] = 1 / 8  # 2^14+1 in (2^14, 2^15]
    assert bins == pytest.approx(expected, abs=1e-12)
    assert access_count_bins([10**9]) == pytest.approx([0.0] * 16 + [1.0])
    assert access_count_bins([]) == [0.0] * NUM_BINS


def test_statistics_of_a_table_never_looked_up():
    s = table_statistics(np.zeros(0, dtype=np.int64), np.array([0, 0, 0]))
    assert (s.rows, s.pooling_factor, s.num_lookups, s.num_unique) == (100, 0.0, 0, 0)
    assert s.bins == [0.0] * NUM_BINS


# ---------------------------------------------------------------- synthetic generator


@pytest.fixture(scope="module")
def synthetic_200():
    cfg = SyntheticConfig(num_tables=200, batch_size=256, max_rows=100_000, seed=3)
    return cfg, generate_synthetic(cfg)


def test_synthetic_is_deterministic_by_seed(synthetic_200):
    cfg, batch = synthetic_200
    again = generate_synthetic(cfg)
    for field in ("indices", "offsets", "lengths"):
        np.testing.assert_array_equal(getattr(batch, field), getattr(again, field))
    other = generate_synthetic(SyntheticConfig(num_tables=200, batch_size=256, max_rows=100_000, seed=4))
    assert not np.array_equal(other.lengths, batch.lengths)


def test_synthetic_shape_follows_the_config():
    small = generate_synthetic(SyntheticConfig(num_tables=3, batch_size=64, max_rows=5000, seed=1))
    assert small.lengths.shape == (3, 64)
    assert small.offsets[-1] == small.indices.size


def test_synthetic_file_passes_the_format_checks(tmp_path, synthetic_200):
    cfg, batch = synthetic_200
    path = tmp_path / "synthetic_t200_bs256.pt.gz"
    save_dlrm_file(batch, path)
    got = load_dlrm_file(path)
    assert (got.num_tables, got.batch_size) == (200, 256)
    np.testing.assert_array_equal(got.indices, batch.indices)


def test_synthetic_statistics_are_heavy_tailed(synthetic_200):
    cfg, batch = synthetic_200
    stats = [table_statistics(*batch.table(t)) for t in range(batch.num_tables)]
    pooling = np.array([s.pooling_factor for s in stats])
    rows = np.array([s.rows for s in stats])
    assert (pooling < 1).any(), "no table with pooling factor < 1"
    assert (pooling > 50).any(), "no table with pooling factor > 50"
    assert 8 <= pooling.mean() <= 25, pooling.mean()
    assert rows.min() >= 100 and rows.max() <= cfg.max_rows
    assert len(np.unique(rows)) > 100  # varied hash sizes, not a constant
    # the declared hash sizes respect the bounds too (rows above are only max index + 1)
    sizes = [p.hash_size for p in sample_table_profiles(cfg)]
    assert min(sizes) >= cfg.min_rows and max(sizes) <= cfg.max_rows
    assert max(sizes) == cfg.max_rows  # log-normal tail clipped at the cap with 200 tables
    # indices stay within each table's hash size
    for t, p in enumerate(sample_table_profiles(cfg)):
        ix, _ = batch.table(t)
        assert ix.size == 0 or ix.max() < p.hash_size


def test_heavy_tables_follow_the_others_and_leave_them_unchanged():
    """data.synthetic.heavy_tables: more tables pooled log-uniformly in [heavy_pooling_min, max_pooling], after the
    first num_tables, which stay as they were; synthetic_pooling gives every table's measured pooling factor
    before generating it."""
    base = SyntheticConfig(num_tables=30, batch_size=128, max_rows=5000, seed=2)
    heavy = SyntheticConfig(num_tables=30, batch_size=128, max_rows=5000, seed=2, heavy_tables=12, heavy_pooling_min=60.0)
    assert sample_table_profiles(heavy)[:30] == sample_table_profiles(base)
    extra = sample_table_profiles(heavy)[30:]
    assert len(extra) == 12 and all(60.0 <= p.pooling_factor <= heavy.max_pooling for p in extra)
    batch = generate_synthetic(heavy)
    np.testing.assert_array_equal(batch.lengths[:30], generate_synthetic(base).lengths)
    measured = [table_statistics(*batch.table(t)).pooling_factor for t in range(batch.num_tables)]
    assert synthetic_pooling(heavy) == measured
    assert min(measured[30:]) > 50.0
    with pytest.raises(ValueError, match="heavy_pooling_min"):
        sample_table_profiles(SyntheticConfig(num_tables=3, heavy_tables=2, heavy_pooling_min=300.0))
