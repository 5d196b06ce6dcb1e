"""Example models users bring, as tables: for tests, benchmarks and README's walk-through.

`production_model_tables()`: the shape of a public production-scale DLRM (the Criteo
Terabyte model's 26 categorical features): 26 tables of dim 128 (fp32), 4 of them with
40M rows (19.07 GB each, more than a 16 GB device), the other 22 from 3 to 3M rows on a
geometric scale, pooling factors 1..100 evenly spread, and no access-count histograms
(users rarely have them): `dreamshard profile` measures them, learned sharders
otherwise estimate them (dreamshard.data.bins). Written out as examples/production_tables.csv
(`python -m dreamshard.data.examples examples/production_tables.csv`; a test keeps the two equal).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dreamshard.tables import Table

PRODUCTION_BIG_ROWS = 40_000_000


def production_model_tables() -> list[Table]:
    rows = [PRODUCTION_BIG_ROWS] * 4 + [int(x) for x in np.geomspace(3, 3_000_000, 22)]
    pooling = np.linspace(1.0, 100.0, 26)
    return [Table(f"cat_{i}", r, 128, float(p)) for i, (r, p) in enumerate(zip(rows, pooling))]


def production_model_frame() -> pd.DataFrame:
    """The same tables as a tables file's columns: name, rows, dim, pooling_factor."""
    return pd.DataFrame([{"name": t.name, "rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor}
                         for t in production_model_tables()])


def write_production_tables(path: str | Path) -> None:
    """Write the production model as a tables file without bins (examples/production_tables.csv: its source)."""
    production_model_frame().to_csv(path, index=False)


if __name__ == "__main__":  # python -m dreamshard.data.examples examples/production_tables.csv
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m dreamshard.data.examples TABLES.csv")
    write_production_tables(sys.argv[1])
