"""Every example of the package runs as a user runs it and prints what
it says (docs/PYTHON.md): the request/reply server and client as two
processes, a killed peer's failure and its successor's greeting, and a
program attached to a `tether engine`."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def run(*args, timeout=90):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def free_addr():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_the_request_reply_server_answers_its_client():
    addr = free_addr()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "calls.py"), "server", addr, "200"],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().startswith("serving on")
    client = run(EXAMPLES / "calls.py", "client", addr, "200")
    assert client.returncode == 0, client.stderr
    assert client.stdout.strip() == "200 calls answered, every reply right"
    assert server.wait(timeout=30) == 0


def test_a_killed_peer_is_survived():
    out = run(EXAMPLES / "killed_peer.py")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "first message: delivered"
    assert lines[1].startswith("peer 2 unreachable: messages ")
    assert lines[2:] == ["peer 2 restarted: its new life greeted us", "sent to the new life: delivered"]


def tether_command():
    """The `tether` command: $TETHER_BIN (scripts/test sets it), else on PATH."""
    return os.environ.get("TETHER_BIN") or shutil.which("tether")


def test_a_program_attached_to_an_engine():
    tether_bin = tether_command()
    if not tether_bin:
        pytest.skip("SKIPPED LOUDLY: no `tether` command (set TETHER_BIN, or cargo install --path crates/tether-cli)")
    addr = free_addr()
    engine_dir = f"/dev/shm/tether-pytest-engine-{os.getpid()}"
    engine = subprocess.Popen([tether_bin, "engine", "--dir", engine_dir, "--bind", addr],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert engine.stdout.readline().startswith("tether engine: pid"), "the engine serves"
        out = run(EXAMPLES / "engine.py", engine_dir, addr)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "100 round trips through the engine, each exact"
    finally:
        engine.send_signal(signal.SIGTERM)
        assert engine.wait(timeout=10) == 0
