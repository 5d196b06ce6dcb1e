"""`python -m pipeline.serve -- COMMAND ...`: run COMMAND (`dvc repro`) with one local Prefect server for all its stages.

Without PREFECT_API_URL every `python -m pipeline STAGE` starts a temporary Prefect server of its own, which
takes many times the work of a small stage. `make run` starts one server on a
free local port instead, points every stage at it with PREFECT_API_URL, and stops
it when the command ends, whatever its exit status. The server keeps its state in the project's PREFECT_HOME
and logs to PREFECT_HOME/server.log. Where PREFECT_API_URL is set already (a server of your own), the
command just runs against it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pipeline.__main__ import quiet_local_prefect

STARTUP_TIMEOUT_S = 120.0  # a first start migrates a new database (seconds); a slow machine gets room
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_server(log_path: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> tuple[subprocess.Popen, str]:
    """A Prefect server on a free local port, healthy; its API URL. Fails naming the log if it does not come up."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    prefect = Path(sys.executable).with_name("prefect")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115 - the server writes to it until stop_server
    server = subprocess.Popen([str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(),
                              start_new_session=True)  # its own process group: stop_server ends its children too
    log.close()  # the child holds its own descriptor
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if server.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pipeline.serve: the Prefect server did not answer at {url} within {timeout_s:.0f} s "
                               f"(exit status {server.returncode}); its log {log_path} ends:\n{tail}")
        time.sleep(0.25)
    return server, url


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m pipeline.serve -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    quiet_local_prefect()
    if os.environ.get("PREFECT_API_URL"):
        return subprocess.call(command)
    log_path = Path(os.environ["PREFECT_HOME"]) / "server.log"
    try:
        server, url = start_server(log_path)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        return subprocess.call(command, env={**os.environ, "PREFECT_API_URL": url})
    finally:
        stop_server(server)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
