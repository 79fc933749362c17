#!/usr/bin/env python3
"""A fenced write: the lock's token travels with every write, and the store
refuses a write whose token is older than one it has accepted.

    palisade serve &                       # a node on 127.0.0.1:7420
    palisade fence-store &                 # the fenced object store on :7430
    python examples/fenced_write.py --endpoints 127.0.0.1:7420 --store http://127.0.0.1:7430

Two holders take the lock one after the other, as two workers would. The
first is then "late" — think of a process that paused past its lease and
woke up unaware — and writes again with its old token: the store answers 409,
so the newer holder's data survives. That check, not the lease, is what makes
a late writer harmless.

Exit status 0 when the stale write was refused, 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
from typing import Tuple
from urllib.parse import urlsplit

import palisade


def put(store: str, key: str, body: bytes, token: int) -> Tuple[int, str]:
    """``PUT /v1/objects/KEY`` with the token in the ``Fencing-Token`` header."""
    url = urlsplit(store)
    conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(url.netloc, timeout=10)
    try:
        conn.request("PUT", f"/v1/objects/{key}", body=body, headers={palisade.FENCING_TOKEN_HEADER: str(token)})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def get(store: str, key: str) -> Tuple[int, str]:
    """``GET /v1/objects/KEY``: the body and the token of the write that made it."""
    url = urlsplit(store)
    conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(url.netloc, timeout=10)
    try:
        conn.request("GET", f"/v1/objects/{key}")
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default="127.0.0.1:7420", help="Palisade nodes, comma-separated")
    p.add_argument("--store", default="http://127.0.0.1:7430", help="the fence-store's URL")
    p.add_argument("--lock", default="examples/fenced-write", help="the lock name")
    p.add_argument("--key", default="examples/fenced-write.txt", help="the object written")
    p.add_argument("--ca", help="the cluster's CA (PEM), for TLS")
    p.add_argument("--token-file", help="a file holding a bearer token (needs --ca)")
    args = p.parse_args()

    token = open(args.token_file).read().strip() if args.token_file else None
    with palisade.Client(args.endpoints, ca=args.ca, token=token) as client:
        # The first holder writes under the lock, then lets go.
        with client.lock(args.lock, wait=30) as first:
            status, answer = put(args.store, args.key, b"written by holder 1\n", first.token)
            print(f"holder 1 (token {first.token}) wrote: {status} {answer}")
            if status != 200:
                return 1
        # The next holder's token is higher; its write raises the store's fence.
        with client.lock(args.lock, wait=30) as second:
            status, answer = put(args.store, args.key, b"written by holder 2\n", second.token)
            print(f"holder 2 (token {second.token}) wrote: {status} {answer}")
            if status != 200:
                return 1
        # Holder 1 comes back late with its old token.
        status, answer = put(args.store, args.key, b"late write by holder 1\n", first.token)
        print(f"holder 1 (token {first.token}) wrote late: {status} {answer}")
        _, stored = get(args.store, args.key)
        print(f"the store holds: {stored.strip()!r}")
        if status == 409:
            stale = json.loads(answer)
            print(f"refused: token {stale.get('presented')} is below {stale.get('highest')}, as it must be")
            return 0
        print("the stale write was NOT refused: is the store running with --fencing off?")
        return 1


if __name__ == "__main__":
    sys.exit(main())
