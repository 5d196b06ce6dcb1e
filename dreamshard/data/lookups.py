"""Where the kernels' lookups come from: recorded data, or generated from a table's statistics.

Recorded: the sample kept by the process stage (data/requests.parquet). A kernel batch
larger than the sample repeats its samples in order; a smaller one takes the first ones.

Generated: a user's tables file carries statistics, not indices. The lookups are then
made by the synthetic dataset's generator (Poisson lengths with the table's pooling
factor, Zipf-ranked rows over its hash size), with the Zipf exponent chosen, from a
grid, as the one whose access-count histogram at the kernel batch size is closest (L1)
to the table's 17 bins.
Tables without bins get DEFAULT_ZIPF_ALPHA. Seeded per table name: reproducible.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dreamshard.data.dlrm import TableProfile, generate_lookups, table_seed
from dreamshard.data.requests import TableRequests
from dreamshard.errors import DataFormatError
from dreamshard.tables import Table, access_count_bins

DEFAULT_ZIPF_ALPHA = 0.8
ZIPF_GRID = tuple(np.round(np.arange(0.0, 2.01, 0.1), 2))


class LookupSource(Protocol):
    def lookups(self, table: Table, batch_size: int) -> TableRequests: ...


def resize_batch(req: TableRequests, batch_size: int) -> TableRequests:
    """The first `batch_size` samples, cycling through the sample when it is smaller."""
    if req.batch_size == 0:
        raise ValueError("cannot resize an empty batch")
    picks = np.arange(batch_size) % req.batch_size
    offsets = np.concatenate([[0], np.cumsum(req.lengths)])
    lengths = req.lengths[picks]
    if batch_size <= req.batch_size:
        return TableRequests(req.indices[: offsets[batch_size]], lengths)
    indices = np.concatenate([req.indices[offsets[p]: offsets[p + 1]] for p in picks]) if lengths.sum() else req.indices[:0]
    return TableRequests(indices.astype(np.int64), lengths)


@dataclass(frozen=True)
class RecordedLookups:
    """Lookups recorded by the process stage, by table name."""

    by_name: Mapping[str, TableRequests]

    def lookups(self, table: Table, batch_size: int) -> TableRequests:
        try:
            req = self.by_name[table.name]
        except KeyError:
            raise DataFormatError(f"no recorded lookups for table {table.name!r}") from None
        return resize_batch(req, batch_size)


@dataclass
class GeneratedLookups:
    """Lookups generated from statistics; the fitted Zipf exponent is kept per table."""

    seed: int = 0
    _alphas: dict[tuple[str, int], float] = field(default_factory=dict)

    def zipf_alpha(self, table: Table, batch_size: int) -> float:
        if table.bins is None:
            return DEFAULT_ZIPF_ALPHA
        key = (table.name, batch_size)
        if key not in self._alphas:
            target = np.asarray(table.bins)
            seed = table_seed(self.seed, table.name)

            def distance(alpha: float) -> float:
                idx, _ = generate_lookups(TableProfile(table.rows, table.pooling_factor, alpha), batch_size, seed)
                _, counts = np.unique(idx, return_counts=True)
                return float(np.abs(np.asarray(access_count_bins(counts)) - target).sum())

            self._alphas[key] = min(ZIPF_GRID, key=distance)
        return self._alphas[key]

    def lookups(self, table: Table, batch_size: int) -> TableRequests:
        profile = TableProfile(table.rows, table.pooling_factor, self.zipf_alpha(table, batch_size))
        indices, lengths = generate_lookups(profile, batch_size, table_seed(self.seed, table.name))
        return TableRequests(indices, lengths)
