"""Atomic file output (readers never see a half-written artifact), and users' CSV files read exactly.

`atomic_path` is the one writer of every output: it writes a temporary file beside the target and renames it
onto the target only on success. Only a regular file or a new name is written: a directory, a device, a FIFO or
a socket is an error (never renamed over, even as root), and so is a read-only file. An existing file keeps
its mode (and, where allowed, its owner); a symbolic link is written through to the file it names; a file with
other hard links is rewritten in place once the new content is complete, so that every link sees it. `-` is
standard output where the caller allows it (text outputs only).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import difflib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dreamshard.errors import DataFormatError

STDOUT = "-"  # the output name that means standard output, for the outputs that are text

# the inputs a command reads, by option: (option, path or paths, None where not given)
Inputs = Iterable[tuple[str, Any]]


def is_stdout(path: str | os.PathLike) -> bool:
    """Does the output name `path` mean standard output (`-o -`)?"""
    return os.fspath(path) == STDOUT


def output_argument(text: str) -> Path:
    """argparse type of an output option: a name ending in `/` names a directory, refused here, while the slash is
    still there to see (Path drops it)."""
    if text != STDOUT and text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} ends with '/', so it names a directory; expected the name of a "
                                         f"file to write, e.g. {text}plan.json")
    return Path(text)


def _where(path: str | os.PathLike, option: str) -> str:
    return f"{option} {os.fspath(path)}" if option else os.fspath(path)


_SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def output_target(path: str | os.PathLike, option: str = "") -> Path:
    """The file that writing `path` replaces: `path`, or the file a symbolic link at `path` names. A DataFormatError
    naming `option` and `path` unless that is a regular, writable file or a new name in a folder (or a folder to
    be made)."""
    where = _where(path, option)
    if os.fspath(path).endswith(("/", os.sep)):
        raise DataFormatError(f"{where}: ends with '/', so it names a directory; expected the name of a file to write")
    target = Path(os.path.realpath(path))  # a link is written through: its target is the file replaced
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target  # a new name
    except OSError as exc:  # a link loop, a component that is a file, no permission to look
        raise DataFormatError(f"{where}: cannot be written: {exc.strerror}; expected the name of a regular file "
                              "to write") from None
    if stat.S_ISDIR(st.st_mode):
        raise DataFormatError(f"{where}: is a directory; expected the name of a file to write, e.g. "
                              f"{Path(path) / 'plan.json'}")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _SPECIAL if test(st.st_mode)), "a special file")
        raise DataFormatError(f"{where}: is {kind}, not a regular file; expected a regular file or a new name to "
                              "write (special files are never replaced)")
    if not st.st_mode & 0o222 or not os.access(target, os.W_OK):
        raise DataFormatError(f"{where}: is read-only (mode {stat.S_IMODE(st.st_mode):o}); make it writable "
                              "(chmod u+w) or give another file name")
    return target


def check_output_file(path: str | os.PathLike, option: str = "", inputs: Inputs = (), stdout: bool = False) -> None:
    """Before any work: `path` may be written (output_target), is none of the command's `inputs` (the same file,
    through a link or a hard link, is an error), and is `-` only where `stdout` allows it."""
    if is_stdout(path):
        _check_stdout(option, stdout)
        return
    target = output_target(path, option)
    for label, given in inputs:
        for one in ([] if given is None else [given] if isinstance(given, (str, os.PathLike)) else given):
            if is_stdout(one):
                continue
            try:
                same = os.path.samefile(target, one)
            except (OSError, ValueError):
                continue  # either is not there (a new output): not the same file
            if same:
                also = "" if os.fspath(one) == os.fspath(path) else f" (the same file as {one})"
                raise DataFormatError(f"{_where(path, option)}: is the input {label}{also}; writing it would "
                                      "destroy the input; give another file name")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Do two output names write one file: the same path once links are followed, or hard links of one file?"""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _check_stdout(option: str, allowed: bool) -> None:
    if not allowed:
        raise DataFormatError(f"{_where(STDOUT, option)}: this output is binary, not text for standard output; "
                              "give a file name")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, option: str = "", stdout: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path` (output_target: a link's target); rename it onto `path` only on
    success, keeping an existing file's mode. `-` with `stdout`: the text written goes to standard output, once
    complete."""
    if is_stdout(path):
        _check_stdout(option, stdout)
        folder = tempfile.mkdtemp(prefix=".dreamshard-")
        try:
            out = Path(folder) / "out"
            yield out
            sys.stdout.write(out.read_text(encoding="utf-8"))
            sys.stdout.flush()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    where = _where(path, option)
    target = output_target(path, option)
    try:
        existing: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        existing = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise DataFormatError(f"{where}: cannot be written: {exc.strerror} ({exc.filename}); expected a file "
                              "in a folder this user may write") from None
    os.close(fd)
    try:
        if existing is not None:
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
            with contextlib.suppress(OSError):  # root writing another user's file: it stays theirs
                os.chown(tmp, existing.st_uid, existing.st_gid)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; new artifacts get ordinary permissions
        yield Path(tmp)
        output_target(path, option)  # still a file to replace (nothing swapped a device in meanwhile)
        if existing is not None and existing.st_nlink > 1:
            shutil.copyfile(tmp, target)  # in place: every hard link of it sees the new content
            os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and (tmp in (exc.filename, exc.filename2) or tmp in str(exc)):
            reason = exc.strerror or str(exc).replace(tmp, os.fspath(path))  # the output's name, not the temporary's
            raise DataFormatError(f"{where}: cannot be written: {reason}") from None
        raise


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


def write_text(text: str, path: str | os.PathLike, option: str = "", stdout: bool = False) -> None:
    """Write `text` to `path` atomically (atomic_path); `-` with `stdout`: to standard output."""
    with atomic_path(path, option, stdout) as tmp:
        tmp.write_text(text, encoding="utf-8")


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
