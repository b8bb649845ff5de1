"""Surviving a killed peer: what the application sees.

A receiver runs as a child process; this process streams messages to it,
kills it with SIGKILL mid-stream, and reads the event that says exactly
which messages failed (and which of those may still have arrived, their
acknowledgement lost with the peer). A new receiver takes the old one's
place at the same address and greets this process (it is given this
one's address): the restart is an event, and the stream goes on with the
new life.

    python killed_peer.py
"""
import os
import signal
import socket
import subprocess
import sys

import tether


def receiver(addr, sender):
    with tether.Endpoint(2, bind=addr, peers={1: sender}) as ep:
        while True:
            ep.recv()  # until killed


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def start(addr, sender):
    return subprocess.Popen([sys.executable, __file__, "receiver", addr, sender])


def main():
    # A silent peer is given up after a second (the default is 5 s).
    os.environ["TETHER_CONFIG_ABANDON_AFTER"] = "1s"
    addr, me = free_port(), free_port()
    child = start(addr, me)
    with tether.Endpoint(1, bind=me, peers={2: addr}) as ep:
        first = ep.send(2, b"are you there?")
        print("first message:", first.wait(timeout=10))
        sent = [ep.send(2, b"x" * 1000, timeout=5) for _ in range(200)]
        child.send_signal(signal.SIGKILL)
        child.wait()
        sent += [ep.send(2, b"after the kill", timeout=5) for _ in range(5)]
        while (e := ep.next_event(timeout=30)).kind != "peer_unreachable":
            pass
        delivered = sum(s.state() == "delivered" for s in sent)
        print(f"peer {e.peer} unreachable: messages {e.first} to {e.end - 1} failed "
              f"({e.in_doubt_end - e.first} of them perhaps delivered, ack lost); {delivered} were acknowledged")
        assert all(s.state() in ("delivered", "failed: peer unreachable") for s in sent)
        child = start(addr, me)  # a new life at the same address
        while (e := ep.next_event(timeout=30)).kind != "peer_restarted":
            pass
        print(f"peer {e.peer} restarted: its new life greeted us")
        print("sent to the new life:", ep.send(2, b"hello again").wait(timeout=10))
    child.kill()
    child.wait()


if __name__ == "__main__":
    receiver(sys.argv[2], sys.argv[3]) if sys.argv[1:2] == ["receiver"] else main()
