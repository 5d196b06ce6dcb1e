"""`make test`'s schedule: the files tests/conftest.py starts first exist, and pytest-xdist keeps that order."""
from __future__ import annotations

from conftest import LONGEST_FILES, PROJECT_ROOT


def test_the_longest_files_exist_and_xdist_keeps_their_order():
    tests = PROJECT_ROOT / "tests"
    assert [f for f in LONGEST_FILES if not (tests / f).is_file()] == []  # a renamed file would start late
    (line,) = [ln for ln in (PROJECT_ROOT / "Makefile").read_text().splitlines() if "-m pytest" in ln]
    # without it xdist queues files by their number of tests, and the longest file started late
    assert "--dist loadfile" in line and "--no-loadscope-reorder" in line, line
