#!/usr/bin/env python3
"""One client acquiring and releasing a lock of its own, back to back, for a
while: the Python client's row of ``palisade bench server --lang python``.

    python examples/bench.py --endpoints 127.0.0.1:7420 --duration 5

Prints one JSON line: ``{"pairs": N, "elapsed_s": S, "acquire_us": [...]}``
(every acquire's latency, in µs, on this process's monotonic clock).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import List

import palisade


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default=os.environ.get("PALISADE_ENDPOINTS", "127.0.0.1:7420"))
    p.add_argument("--duration", type=float, default=5.0, help="seconds to measure")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--token-file")
    a = p.parse_args()
    token = None
    if a.token_file:
        with open(a.token_file) as f:
            token = f.read().strip()
    name = f"bench-python-{os.getpid()}"
    with palisade.Client(a.endpoints, ca=a.ca, cert=a.cert, key=a.key, token=token, retry_for=30.0) as client:
        # The session is opened by the first acquire: not measured.
        client.acquire(name).release()
        acquire_us: List[int] = []
        start = time.monotonic()
        while time.monotonic() - start < a.duration:
            t = time.monotonic()
            lease = client.acquire(name)
            acquire_us.append(int((time.monotonic() - t) * 1e6))
            lease.release()
        elapsed = time.monotonic() - start
    print(json.dumps({"pairs": len(acquire_us), "elapsed_s": elapsed, "acquire_us": acquire_us}))


if __name__ == "__main__":
    main()
