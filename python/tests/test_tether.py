"""The Python package over real UDP on loopback: streams exact and in
order through injected faults, buffers in without a copy beyond the send
log's and out without any, the GIL released while waiting, events naming
exactly what failed, calls to Python handlers, typed errors, accepting."""
import array
import pathlib
import subprocess
import sys
import threading
import time

import pytest
import tether

FAULTS = ["drop:p=0.05", "duplicate:p=0.05", "modify:p=0.02", "reorder:p=0.05"]


def pair(**kw):
    a = tether.Endpoint(1, bind="127.0.0.1:0", **kw.get("a", {}))
    b = tether.Endpoint(2, bind="127.0.0.1:0", peers={1: a.local_addr}, **kw.get("b", {}))
    a.add_peer(2, b.local_addr)
    return a, b


def msg(i):
    n = [1, 9, 700, 3000, 20000][i % 5]
    return bytes((i * 7 + j) % 256 for j in range(n))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_stream_arrives_exact_and_in_order_through_faults(seed):
    a, b = pair(a={"faults": FAULTS, "seed": seed}, b={"faults": FAULTS, "seed": seed + 10})
    sent = [b.send(1, msg(i), timeout=10) for i in range(500)]
    for i in range(500):
        m = a.recv(timeout=10)
        assert m.sender == 2
        assert bytes(m) == msg(i), f"message {i}"
    assert all(s.wait(timeout=10) == "delivered" for s in sent)
    with pytest.raises(tether.TimedOut):
        a.recv(timeout=0.2)  # nothing twice
    assert sum(b.fault_counters().values()) > 0, "faults struck"
    a.close()
    b.close()


def test_buffers_in_and_out():
    a, b = pair()
    data = bytearray(b"0123456789")
    for buf in [data, memoryview(data)[2:6], array.array("B", [1, 2, 3]), b"bytes"]:
        b.send(1, buf)
        m = a.recv(timeout=5)
        assert bytes(m) == bytes(buf)
    view = memoryview(m)  # no copy: a view of the message itself
    assert view.readonly and len(view) == len(m) == 5 and view.tobytes() == b"bytes"
    assert m.data.tobytes() == b"bytes"
    a.close()
    b.close()


def test_the_gil_is_released_while_waiting():
    a, b = pair()
    ran = []

    def late_sender():
        time.sleep(0.2)
        ran.append(True)  # Python code, which needs the GIL
        b.send(1, b"late")

    t = threading.Thread(target=late_sender)
    t.start()
    start = time.monotonic()
    m = a.recv(timeout=5)
    assert bytes(m) == b"late" and ran and time.monotonic() - start < 2
    t.join()
    a.close()
    b.close()


def test_a_peer_gone_is_an_event_naming_what_failed(monkeypatch):
    # Any builder option from the environment (docs/OPERATING.md): a
    # silent peer is given up after 300 ms rather than 5 s.
    monkeypatch.setenv("TETHER_CONFIG_ABANDON_AFTER", "300ms")
    a = tether.Endpoint(1, bind="127.0.0.1:0")
    b = tether.Endpoint(2, bind="127.0.0.1:0", peers={1: a.local_addr})
    a.add_peer(2, b.local_addr)
    assert b.send(1, b"first").wait(timeout=5) == "delivered"
    a.close(linger=0)
    seqs = [b.send(1, msg(i)).seq for i in range(5)]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        e = b.next_event(timeout=15)
        if e.kind == "peer_unreachable":
            break
    assert e.kind == "peer_unreachable" and e.peer == 1
    assert e.first <= seqs[0] and e.end == seqs[-1] + 1
    b.close(linger=0)


def test_calls_reach_python_handlers():
    a, b = pair()
    a.register_handler(7, lambda sender, args: bytes(reversed(args)))
    stop = threading.Event()

    def serving():
        while not stop.is_set():
            try:
                a.serve(timeout=0.1)
            except tether.TimedOut:
                pass

    t = threading.Thread(target=serving)
    t.start()
    for i in range(50):
        args = f"call {i}".encode()
        out = b.request(1, 7, args, timeout=5)
        assert out.processed and out.acked and out.executed is True
        assert out.reply == args[::-1]
    stop.set()
    t.join()
    a.close()
    b.close()


def test_errors_are_typed():
    a, b = pair()
    with pytest.raises(tether.UnknownPeer):
        a.send(9, b"x")
    with pytest.raises(tether.TimedOut):
        a.recv(timeout=0.05)
    with pytest.raises(ValueError):
        tether.Endpoint(3, bind="no address")
    with pytest.raises(tether.ConfigError):
        tether.Endpoint(3, faults=["drop:p=7"])
    assert issubclass(tether.TimedOut, tether.Error)
    a.close()
    with pytest.raises(tether.Closed):
        a.recv(timeout=0.05)
    b.close()


def test_a_stranger_is_refused_unless_accepting_was_enabled():
    closed = tether.Endpoint(1, bind="127.0.0.1:0")
    c = tether.Endpoint(2, bind="127.0.0.1:0", peers={1: closed.local_addr})
    s = c.send(1, b"let me in")
    with pytest.raises(tether.TimedOut):
        closed.recv(timeout=0.5)
    assert s.state() == "pending" and closed.stats()["unknown_source"] > 0
    with pytest.raises(tether.Lingered):  # its message was never acknowledged
        c.close(linger=0)
    closed.close()
    open_ = tether.Endpoint(1, bind="127.0.0.1:0", accept=4, accept_unkeyed=True)
    c = tether.Endpoint(2, bind="127.0.0.1:0", peers={1: open_.local_addr})
    c.send(1, b"let me in")
    assert bytes(open_.recv(timeout=5)) == b"let me in"
    assert open_.next_event(timeout=5).kind in ("peer_accepted", "refused")
    c.close()
    open_.close()


def test_the_hello_world_runs():
    hello = pathlib.Path(__file__).parent.parent / "examples" / "hello.py"
    assert len(hello.read_text().splitlines()) <= 25
    out = subprocess.run([sys.executable, str(hello)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "node 2 says hello",
        "the message was delivered",
        "node 1 answers hello back",
    ]
