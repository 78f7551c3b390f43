"""The local run (`scripts/run` = `python -m devstack`) cleans up after itself: stopped with
SIGTERM or SIGHUP as with Ctrl-C, and killed outright its children still go (they are
tethered to it), leaving no server behind and the port free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devstack.processes import ROOT, free_port

pytestmark = pytest.mark.integration


def _children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(c) for c in path.read_text().split()} if path.exists() else set()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # a zombie has exited; its new parent reaps it


def _port_free(port: int) -> bool:
    """Nothing listens there: a server restarted now could bind it (as uvicorn does, with
    SO_REUSEADDR, past the demo connection's TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _serving(tmp_path: Path) -> tuple[subprocess.Popen, set[int], int]:
    port = free_port()
    out = tmp_path / "devstack.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack", "--port", str(port), "--max-tokens", "4"],
        cwd=ROOT,
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 180
    while "Serving" not in out.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, out.read_text()
        time.sleep(0.2)
    assert "Serving" in out.read_text(), out.read_text()
    children = _children(proc.pid)
    assert len(children) == 3, children  # valkey, the worker, the API
    return proc, children, port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_the_local_run_leaves_nothing_behind(tmp_path, sig):
    proc, children, port = _serving(tmp_path)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while not all(_gone(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [c for c in children if not _gone(c)]
    for pid in left:  # do not leak them into the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after {sig.name}: {left}"
    assert _port_free(port)


@pytest.mark.parametrize("keys", ["API_KEYS", "API_KEYS_FILE"])
def test_the_local_run_with_keys_in_the_shell_asks_with_one_and_keeps_them(tmp_path, keys):
    """Keys in the shell were overridden (ALLOW_NO_AUTH=1) or waited on: the readiness poll and
    the demo asked without a key. Now both use the first key given in clear."""
    key = "sk-local-0123456789"
    if keys == "API_KEYS":
        env = {"API_KEYS": f"sha256:{'0' * 64},{key}"}
    else:
        path = tmp_path / "keys"
        path.write_text(f"# the team's\nsha256:{'1' * 64}\n{key} role=operator\n")
        env = {"API_KEYS_FILE": str(path)}
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "devstack", "--port", str(port), "--max-tokens", "4", "--once"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "ALLOW_NO_AUTH": "", **env},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tokens in" in done.stdout  # the demo's answer came, with its usage
