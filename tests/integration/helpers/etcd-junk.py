#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes junk donor registrations into etcd fast (issue 26, S4-S6 tests): through etcd's JSON
# gateway, 128 puts per transaction (etcd's default --max-txn-ops), no lease (they stay).
#
#   etcd-junk.py ENDPOINT PREFIX dead N [SIZE]  N well-formed registrations of dead addresses
#                                             (127.1.X.Y:9: loopback, nothing listens), with
#                                             the most attractive hints (all free, no session),
#                                             of SIZE bytes each (padded with an unknown field)
#   etcd-junk.py ENDPOINT PREFIX invalid N    N entries whose value is not a registration
#   etcd-junk.py ENDPOINT PREFIX big N SIZE   N well-formed registrations of SIZE bytes each
#                                             (padded with an unknown field)
#   etcd-junk.py ENDPOINT PREFIX huge SIZE    one well-formed registration of SIZE bytes
#   etcd-junk.py ENDPOINT PREFIX addrs A...   well-formed registrations of the addresses A...
#   etcd-junk.py ENDPOINT PREFIX touch N      N puts, one at a time, of one dead registration
#                                             with a new value each time (N watch events)
import base64
import json
import sys
import urllib.request


def b64(s):
    return base64.b64encode(s.encode()).decode()


def txn(endpoint, kvs):
    # At most 128 operations and about 1 MB a transaction (etcd's defaults: --max-txn-ops 128,
    # --max-request-bytes 1.5 MiB).
    batch, size = [], 0
    for k, v in kvs + [(None, None)]:
        if k is None or len(batch) == 128 or (batch and size + len(k) + len(v) > 1000000):
            ops = [{"request_put": {"key": b64(bk), "value": b64(bv)}} for bk, bv in batch]
            req = urllib.request.Request(endpoint + "/v3/kv/txn",
                                         data=json.dumps({"success": ops}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                body = json.load(r)
                if "error" in body:
                    raise SystemExit("etcd: %s" % body)
            batch, size = [], 0
        if k is not None:
            batch.append((k, v))
            size += len(k) + len(v)


def registration(addr, pad=0, free=1 << 20):
    r = {"addr": addr, "boot_id": "%016x" % (0x1000 + hash(addr) % (1 << 40)), "transport": "tcp",
         "slab_size": 1 << 20, "slabs_total": 1 << 20, "slabs_free": free, "sessions": 0,
         "auth": True}
    if pad:
        r["pad"] = ""
        r["pad"] = "x" * max(0, pad - len(json.dumps(r)))
    return json.dumps(r)


def dead_addr(i):
    return "127.1.%d.%d:9" % (i // 250, i % 250 + 1)


def main():
    endpoint, prefix, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    d = prefix + "donors/"
    if kind == "dead":
        pad = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        txn(endpoint, [(d + dead_addr(i), registration(dead_addr(i), pad)) for i in range(int(sys.argv[4]))])
    elif kind == "invalid":
        txn(endpoint, [(d + "junk-%d" % i, "not a registration %d" % i) for i in range(int(sys.argv[4]))])
    elif kind == "big":
        size = int(sys.argv[5])
        addrs = ["127.2.%d.%d:9" % (i // 250, i % 250 + 1) for i in range(int(sys.argv[4]))]
        txn(endpoint, [(d + a, registration(a, size)) for a in addrs])
    elif kind == "huge":
        a = "127.3.0.1:9"
        txn(endpoint, [(d + a, registration(a, int(sys.argv[4])))])
    elif kind == "addrs":
        txn(endpoint, [(d + a, registration(a)) for a in sys.argv[4:]])
    elif kind == "touch":
        a = dead_addr(0)
        for i in range(int(sys.argv[4])):
            txn(endpoint, [(d + a, registration(a, free=(1 << 20) - 1 - i))])
    else:
        raise SystemExit("unknown kind " + kind)


main()
