"""Outputs never clobber (issue 53): every command writes through dreamshard.io.atomic_path, which writes only a
regular file or a new name, never one of the command's inputs, keeps an existing file's mode, writes through a
symbolic link, keeps hard links, and writes `-` to standard output only for text. Ctrl-C exits 130 in one line."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dreamshard.cli import main
from dreamshard.errors import DataFormatError
from dreamshard.io import atomic_path, check_output_file, write_text
from helpers import one_line_error

TABLES = "name,rows,dim,pooling_factor\na,1000,16,2\nb,500,8,1\nc,200,4,0.5\n"


@pytest.fixture
def tables(tmp_path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(TABLES)
    return path


def plan_argv(tables: Path, out: str | Path, *extra: str) -> list[str]:
    return ["plan", "--tables", str(tables), "--devices", "2", "--memory-gb", "1", "--algo", "size_greedy",
            "-o", str(out), *extra]


# ---------------------------------------------------------------- special files and directories


@pytest.fixture(params=[(1, 3), (1, 7)], ids=["null", "full"])
def device(request, tmp_path) -> Path:
    """A character device like /dev/null or /dev/full: made in tmp_path as root (who could rename over the real
    one, should the guard ever break), the real one otherwise (which only root could replace)."""
    real = Path("/dev/null" if request.param == (1, 3) else "/dev/full")
    if os.geteuid() != 0:
        return real
    path = tmp_path / real.name
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*request.param))
    return path


def test_a_device_is_never_replaced(tables, capsys, device):
    before = os.stat(device)
    err = one_line_error(plan_argv(tables, device), capsys)
    assert f"-o {device}: is a character device, not a regular file" in err and ".tmp" not in err
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino and after.st_rdev == before.st_rdev


def test_a_fifo_a_socket_and_a_directory_are_errors(tables, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        assert "is a FIFO (named pipe), not a regular file" in one_line_error(plan_argv(tables, fifo), capsys)
        assert "is a socket, not a regular file" in one_line_error(plan_argv(tables, sock_path), capsys)
    finally:
        sock.close()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISSOCK(os.stat(sock_path).st_mode)
    folder = tmp_path / "adir"
    folder.mkdir()
    assert "is a directory" in one_line_error(plan_argv(tables, folder), capsys)
    with pytest.raises(DataFormatError, match="is a FIFO"):  # the writer itself refuses, not only the command
        write_text("x", fifo)


def test_a_name_ending_in_a_slash_is_a_directory_not_a_file(tables, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(plan_argv(tables, "newdir/"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'newdir/' ends with '/'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "newdir").exists()
    with pytest.raises(DataFormatError, match="ends with '/'"):
        write_text("x", f"{tmp_path}/other/")


def test_an_error_names_the_output_never_a_temporary_file(tables, capsys):
    err = one_line_error(plan_argv(tables, "/proc/version"), capsys)
    assert "-o /proc/version: is read-only" in err and ".tmp" not in err


# ---------------------------------------------------------------- inputs are never outputs


def test_plan_never_writes_over_its_tables(tables, tmp_path, capsys):
    hard = tmp_path / "hard.csv"
    os.link(tables, hard)
    soft = tmp_path / "soft.json"
    soft.symlink_to(tables)
    for out in (tables, hard, soft):
        err = one_line_error(plan_argv(tables, out), capsys)
        assert f"-o {out}: is the input --tables" in err and "give another file name" in err
    assert tables.read_text() == TABLES


def test_plan_never_writes_over_any_input(tables, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(plan_argv(tables, plan)) == 0
    devices = tmp_path / "devices.csv"
    devices.write_text("memory_gb\n1\n1\n")
    constraints = tmp_path / "constraints.json"
    constraints.write_text('{"whole": ["a"]}')
    capsys.readouterr()
    base = ["plan", "--tables", str(tables), "--algo", "size_greedy"]
    err = one_line_error([*base, "--devices-file", str(devices), "-o", str(devices)], capsys)
    assert "is the input --devices-file" in err
    err = one_line_error([*base, "--devices", "2", "--memory-gb", "1", "--constraints", str(constraints), "-o",
                          str(constraints)], capsys)
    assert "is the input --constraints" in err
    err = one_line_error([*base, "--devices", "2", "--memory-gb", "1", "--previous", str(plan), "--max-moved-gb",
                          "1", "--backend", "analytic", "--regime", "super_additive", "-o", str(plan)], capsys)
    assert "is the input --previous" in err
    assert devices.read_text() == "memory_gb\n1\n1\n" and json.loads(plan.read_text())["num_devices"] == 2


def test_profile_never_writes_over_its_inputs(tmp_path, capsys):
    dims = tmp_path / "dims.csv"
    dims.write_text("name,dim\nx,8\n")
    err = one_line_error(["profile", "--lookups", str(tmp_path / "day.pt"), "--dim", str(dims), "-o", str(dims)],
                         capsys)
    assert f"-o {dims}: is the input --dim" in err and dims.read_text() == "name,dim\nx,8\n"


# ---------------------------------------------------------------- what an overwrite keeps


def test_an_overwrite_keeps_the_mode(tables, tmp_path, capsys):
    out = tmp_path / "plan.json"
    out.write_text("old")
    out.chmod(0o640)  # neither a new file's mode nor a temporary file's (0600)
    assert main(plan_argv(tables, out)) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640 and json.loads(out.read_text())["num_devices"] == 2
    new = tmp_path / "new.json"
    assert main(plan_argv(tables, new)) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o666 & ~umask


def test_a_symbolic_link_is_written_through(tables, tmp_path, capsys):
    target = tmp_path / "real" / "plan.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(plan_argv(tables, link)) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["num_devices"] == 2
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "real" / "later.json")
    assert main(plan_argv(tables, dangling)) == 0
    assert dangling.is_symlink() and json.loads((tmp_path / "real" / "later.json").read_text())["num_devices"] == 2


def test_a_hard_link_stays_one_file(tables, tmp_path, capsys):
    out = tmp_path / "plan.json"
    out.write_text("old")
    other = tmp_path / "other-name.json"
    os.link(out, other)
    assert main(plan_argv(tables, out)) == 0
    assert os.path.samefile(out, other) and json.loads(other.read_text())["num_devices"] == 2


def test_a_read_only_file_is_refused(tables, tmp_path, capsys):
    """Even as root, who may write anything: the file's mode says it is not to be written."""
    out = tmp_path / "plan.json"
    out.write_text("keep me")
    out.chmod(0o444)
    err = one_line_error(plan_argv(tables, out), capsys)
    assert f"-o {out}: is read-only (mode 444)" in err and "chmod u+w" in err
    assert out.read_text() == "keep me"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_path(out) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


# ---------------------------------------------------------------- `-` is standard output, for text


def test_plan_json_to_standard_output(tables, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(plan_argv(tables, "-")) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_devices"] == 2  # stdout holds the plan alone
    assert "size_greedy: 3 tables on 2 devices" in captured.err and "estimated cost" in captured.err
    assert not (tmp_path / "-").exists()


def test_binary_outputs_refuse_standard_output(tables, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(plan_argv(tables, "-", "--format", "torchrec"), capsys)
    assert "-o -: this output is binary" in err and not (tmp_path / "-").exists()
    with pytest.raises(DataFormatError, match="binary"):
        check_output_file("-", "--png")


# ---------------------------------------------------------------- Ctrl-C


def test_ctrl_c_exits_130_in_one_line_with_no_output(tmp_path):
    """Interrupted while reading its tables (a FIFO nobody writes): exit 130, one line, no plan file."""
    fifo = tmp_path / "tables.csv"
    os.mkfifo(fifo)
    out = tmp_path / "plan.json"
    # as a shell starts it: Ctrl-C's default disposition (a process started with SIGINT ignored, as this test
    # process may be after other tests' servers, keeps ignoring it, and so would the command)
    proc = subprocess.Popen([sys.executable, "-m", "dreamshard.cli", *plan_argv(fifo, out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    writer = os.open(fifo, os.O_WRONLY)  # returns once the command opened the tables file to read
    try:
        time.sleep(0.2)  # into its read, which waits for lines
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "dreamshard: interrupted (Ctrl-C); no partial output was written" and stdout == ""
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["tables.csv"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("dreamshard ")


def test_a_write_error_names_the_output(tmp_path):
    out = tmp_path / "plan.json"
    with pytest.raises(DataFormatError) as err, atomic_path(out, "-o") as tmp:
        raise OSError(28, "No space left on device", str(tmp))
    assert str(err.value) == f"-o {out}: cannot be written: No space left on device"
    assert list(tmp_path.iterdir()) == []


def lookups(tmp_path: Path) -> Path:
    from dreamshard.data.profile import write_lookups_parquet

    path = tmp_path / "lookups.parquet"
    write_lookups_parquet(path, [("t0", np.array([1, 2, 2, 7]), np.array([0, 1, 4]))])
    return path


def test_profile_csv_to_standard_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = lookups(tmp_path)
    assert main(["profile", "--lookups", str(source), "--dim", "8", "--no-progress", "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("name,rows,dim,pooling_factor,bin_0,") and ",t0" not in captured.out
    assert captured.out.splitlines()[1].startswith("t0,100,8,2.0,") and "profile: 1 tables" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lookups.parquet"]
    err = one_line_error(["profile", "--lookups", str(source), "--dim", "8", "-o", str(source)], capsys)
    assert f"-o {source}: is the input --lookups" in err
