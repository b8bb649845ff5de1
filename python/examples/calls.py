"""A request/reply server and its client, as two processes:

    python calls.py server 127.0.0.1:7300 [N]   answers calls to handler 7 (N of them; 0: for ever)
    python calls.py client 127.0.0.1:7300 N     makes N calls and checks every reply

The server takes in any client (no key: accept_unkeyed is the opt-in).
"""
import sys

import tether

REVERSE = 7


def server(addr, calls):
    with tether.Endpoint(1, bind=addr, accept=64, accept_unkeyed=True) as ep:
        ep.register_handler(REVERSE, lambda sender, args: bytes(reversed(args)))
        print(f"serving on {ep.local_addr}", flush=True)
        served = 0
        while calls == 0 or served < calls:
            try:
                ep.serve(timeout=1.0)
                served += 1
            except tether.TimedOut:
                pass
        ep.flush(timeout=5)  # the last replies acknowledged before it goes


def client(addr, calls):
    with tether.Endpoint(2, peers={1: addr}) as ep:
        for i in range(calls):
            args = f"call {i}".encode()
            out = ep.request(1, REVERSE, args, timeout=5)
            if not (out.processed and out.executed and out.reply == args[::-1]):
                sys.exit(f"call {i}: reply {out.reply!r}, processed {out.processed}, executed {out.executed}")
        print(f"{calls} calls answered, every reply right")


if __name__ == "__main__":
    mode, addr = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    server(addr, n) if mode == "server" else client(addr, n)
