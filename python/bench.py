"""A 1 KiB stream through the Python package against the same stream
through the Rust API, in one run (the package's bar: at least half the
Rust API's messages a second). `python bench.py [--count N] [--runs R] [--json]`."""
import argparse
import json
import statistics
import threading
import time

import tether


def python_stream(count, size):
    a = tether.Endpoint(1, bind="127.0.0.1:0")
    b = tether.Endpoint(2, bind="127.0.0.1:0", peers={1: a.local_addr})
    a.add_peer(2, b.local_addr)
    data = bytes(size)

    def receive():
        for _ in range(count):
            a.recv(timeout=10)

    rx = threading.Thread(target=receive)
    start = time.perf_counter()
    rx.start()
    for _ in range(count):
        b.send(1, data, timeout=10)
    rx.join()
    rate = count / (time.perf_counter() - start)
    b.close()
    a.close()
    return rate


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", action="store_true")
    o = p.parse_args()
    py, rs = [], []
    for run in range(o.runs):
        # In turns, so the machine's drift falls on both alike.
        py.append(python_stream(o.count, o.size))
        rs.append(tether._rust_stream(o.count, o.size))
        if not o.json:
            print(f"run {run + 1}: {py[-1]:.0f} msgs/s through Python, {rs[-1]:.0f} through Rust")
    ratio = statistics.median(py) / statistics.median(rs)
    doc = {
        "size": o.size,
        "count": o.count,
        "python_msgs_per_s": {"median": statistics.median(py), "min": min(py), "max": max(py)},
        "rust_msgs_per_s": {"median": statistics.median(rs), "min": min(rs), "max": max(rs)},
        "ratio": ratio,
        "bar": 0.5,
        "met": ratio >= 0.5,
    }
    if o.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{o.size} B stream, median of {o.runs}: Python {doc['python_msgs_per_s']['median']:.0f} msgs/s "
          f"(min {min(py):.0f}, max {max(py):.0f}), Rust {doc['rust_msgs_per_s']['median']:.0f} "
          f"(min {min(rs):.0f}, max {max(rs):.0f})")
    print(f"Python / Rust: {ratio:.3f} (bar: >= 0.5); bar {'met' if doc['met'] else 'not met'}")


if __name__ == "__main__":
    main()
