"""Atomic file output (readers never see a half-written artifact), and users' CSV files read exactly."""
from __future__ import annotations

import contextlib
import csv
import difflib
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dreamshard.errors import DataFormatError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only on success."""
    target = Path(path)
    check_output_file(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; artifacts get ordinary permissions
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_output_file(path: str | os.PathLike, option: str = "") -> None:
    """A file about to be written must not be a directory (the error would otherwise name a temporary file)."""
    if Path(path).is_dir():
        where = f"{option} {path}" if option else str(path)
        raise DataFormatError(f"{where}: is a directory; expected the name of a file to write, e.g. "
                              f"{Path(path) / 'plan.json'}")


def write_parquet(table: pa.Table, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def file_digest(path: str | os.PathLike, algorithm: str = "sha1") -> str:
    """Hex digest of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_text(text: str, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_csv_cells(path: str | os.PathLike, what: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the records of a CSV file, each record with the line it starts on (the header's is
    line 1) and its cells as strings exactly as written: no NA or number parsing, so a name `NA`, `007` or
    `1e3` stays that name. Blank lines are skipped; a header naming a column twice, a record with another
    number of cells than the header, or a file that is not UTF-8 CSV is a DataFormatError naming the line."""
    path = Path(path)
    header: list[str] | None = None
    records: list[tuple[int, list[str]]] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            last = 0
            for cells in reader:
                line, last = last + 1, reader.line_num
                if not cells or (len(cells) == 1 and not cells[0].strip()):
                    continue  # a blank line
                if header is None:
                    header = cells
                    twice = next((c for i, c in enumerate(cells) if c in cells[:i]), None)
                    if twice is not None:
                        raise DataFormatError(f"{path}: line {line}: column {twice!r} appears twice in the header")
                elif len(cells) != len(header):
                    raise DataFormatError(f"{path}: line {line}: {len(cells)} cells, but the header has "
                                          f"{len(header)} columns ({','.join(header)})")
                else:
                    records.append((line, cells))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataFormatError(f"{path}: cannot read {what} as UTF-8 CSV: {exc}") from None
    if header is None:
        raise DataFormatError(f"{path}: empty file; expected a {what} with a header line")
    return header, records


def check_names(given: Sequence[str], known: Sequence[str], origin: str, what: str = "column",
                expected: str | None = None) -> None:
    """Every given column (or key, field) is a known one: an unknown one, a misspelt one say, would otherwise be
    ignored, so it is an error naming it and the nearest known one."""
    expected = expected or ", ".join(known)
    for i, name in enumerate(given):
        if name in known:
            continue
        if not str(name).strip():
            raise DataFormatError(f"{origin}: {what} {i + 1} has no name (an index written without index=False?); "
                                  f"expected {expected}")
        key = str(name).strip().lower()
        near = [k for k in known if k.lower() == key] or difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise DataFormatError(f"{origin}: unknown {what} {name!r}; {hint}expected {expected}")
