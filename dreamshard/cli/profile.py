"""`dreamshard profile`: a tables file whose statistics are measured from lookup files (dreamshard.data.profile
computes them; docs/profile.md)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dreamshard.data.profile import ProfileConfig, check_dims, check_output_suffix, profile_lookups, write_profile
from dreamshard.errors import DataFormatError, DreamShardError
from dreamshard.io import check_output_file, is_stdout, output_argument


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `profile` subcommand to `sub` (the `add_subparsers` of the dreamshard command)."""
    p = sub.add_parser("profile", help="measure a tables file's statistics from a sample of lookups",
                       description="Write a tables file (name, rows, dim, pooling_factor, bin_0..bin_16) with the "
                                   "statistics of lookup files: DLRM .pt/.pt.gz files or Parquet (table, indices, "
                                   "offsets). See docs/profile.md.")
    p.add_argument("--lookups", required=True, nargs="+", type=Path, metavar="FILE",
                   help="DLRM-format .pt/.pt.gz files and/or Parquet files with columns table, indices, offsets")
    p.add_argument("--dim", required=True,
                   help="embedding dimension: one integer for every table, or a CSV file with columns name,dim")
    p.add_argument("--rows", help="hash size: one integer for every table, or a CSV file with columns name,rows "
                                  "(default: max(100, max index + 1) of each table)")
    p.add_argument("-o", "--output", required=True, type=output_argument,
                   help="tables file to write: .csv or .parquet, or - (CSV on standard output, the summary on stderr)")
    p.add_argument("--max-memory-gb", type=float, default=ProfileConfig.max_memory_gb,
                   help="bound on the per-table count arrays (16 bytes a distinct row); default %(default)s")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_profile)
    return p


def cmd_profile(args: argparse.Namespace) -> None:
    check_output_suffix(args.output)
    inputs = [("--lookups", args.lookups), ("--dim", args.dim), ("--rows", args.rows)]
    check_output_file(args.output, "-o", [(o, p) for o, p in inputs if p is not None], stdout=True)
    dims = per_table_int(args.dim, "--dim", "dim")
    check_dims(dims)  # before the work, not after it
    rows = None if args.rows is None else per_table_int(args.rows, "--rows", "rows")
    try:
        config = ProfileConfig(args.max_memory_gb, not args.no_progress)
    except ValueError as exc:
        raise DreamShardError(f"--max-memory-gb: {exc}") from None
    tables = profile_lookups(args.lookups, config, rows)
    write_profile(tables, dims, args.output)
    samples = sorted({t.batch_size for t in tables})
    shown = ", ".join(map(str, samples[:5])) + (", ..." if len(samples) > 5 else "")
    print(f"profile: {len(tables)} tables from {len(args.lookups)} file(s), {shown} samples per table -> {args.output}",
          file=sys.stderr if is_stdout(args.output) else sys.stdout)


def per_table_int(text: str, option: str, column: str) -> int | dict[str, int]:
    """`--dim 16` (one for every table) or `--dim dims.csv` (columns name and `column`)."""
    try:
        return int(text)
    except ValueError:
        pass
    path = Path(text)
    if not path.is_file():
        raise DreamShardError(f"{option}: expected an integer or a CSV file of name,{column}; {text!r} is neither")
    try:
        frame = pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - pandas raises many types
        raise DataFormatError(f"{path}: cannot read it as CSV: {exc}") from None
    missing = [c for c in ("name", column) if c not in frame.columns]
    if missing:
        raise DataFormatError(f"{path}: missing column(s) {', '.join(missing)}; expected name,{column}")
    names = frame["name"].astype(str)
    if names.duplicated().any():
        raise DataFormatError(f"{path}: column 'name': table {names[names.duplicated()].iloc[0]!r} appears twice")
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() | (values != values.round())
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataFormatError(f"{path}: column {column!r}: table {names.iloc[i]!r}: expected an integer, "
                              f"got {frame[column].iloc[i]!r}")
    return {n: int(v) for n, v in zip(names, values)}
