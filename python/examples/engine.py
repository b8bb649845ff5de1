"""A program attached to the node's engine process (`tether engine`,
docs/ENGINE.md): its protocol runs in the engine, which can die or hang
and be replaced with nothing lost. It exchanges messages with an endpoint
embedded in this process.

    tether engine --dir /dev/shm/my-engine --bind 127.0.0.1:7400 &
    python engine.py /dev/shm/my-engine 127.0.0.1:7400
"""
import sys

import tether

engine_dir, engine_addr = sys.argv[1], sys.argv[2]
with tether.Endpoint(1, peers={2: engine_addr}) as embedded:
    with tether.Endpoint(2, engine=engine_dir, peers={1: embedded.local_addr}) as attached:
        for i in range(100):
            attached.send(1, i.to_bytes(4, "little"), timeout=5)
            m = embedded.recv(timeout=5)
            embedded.send(2, m, timeout=5)  # a message is a buffer: sent on without a copy of our own
            assert bytes(attached.recv(timeout=5)) == i.to_bytes(4, "little"), f"round trip {i}"
        print("100 round trips through the engine, each exact")
