#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Write the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): a valid request and
# reply of every protocol op, an error reply, a LIST reply, donor certificates and revocation
# lists (valid, expired, forged), and the sizes, endpoints and transport names the docs show. The files are committed; rerun this only to change the seeds:
#   python3 tests/fuzz/make-corpus.py
# (Regression inputs for fixed findings are committed next to them by hand, named after the bug.)
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
import rdmaswap_wire as w  # noqa: E402


BIND, ALLOC_TAGGED, SET_TAG, VOLUME_LIST = 8, 9, 10, 11
GIVEBACK, WANTED, GIVEBACK_STATUS = 12, 13, 14


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def msg(op, body=b"", flags=0, status=0, request_id=7):
    return w.header(op, len(body), request_id, flags=flags, status=status) + body


def reply(op, body=b"", status=0):
    return msg(op, body, flags=w.RESPONSE, status=status)


nonce = bytes(range(32))
mac = bytes(range(32, 64))
requests = {
    "auth": msg(w.AUTH, nonce + struct.pack("<QQ", 0x0123456789ABCDEF, 0)),
    "auth-proof": msg(w.AUTH_PROOF, mac),
    "hello-new": msg(w.HELLO, struct.pack("<IIQQQ", w.VERSION, 1, 0, 0, 0)),
    "hello-join": msg(w.HELLO, struct.pack("<IIQQQ", w.VERSION, 0, 0x1111, 0x2222, 3)),
    "alloc": msg(w.ALLOC),
    "free": msg(w.FREE, struct.pack("<II", 1, 0)),
    "read": msg(w.READ, struct.pack("<IIQ", 0, 4096, 8192)),
    # WRITE: body, then the payload (what the server reads into the slab).
    "write": msg(w.WRITE, struct.pack("<IIQ", 1, 16, 65536 - 16) + b"0123456789abcdef"),
    "stats": msg(w.STATS),
    "list": msg(w.LIST),
    # Reattach (ops 8-11) and give-back (12-14).
    "bind": msg(BIND, b"host-1073741824-0a1b2c3d".ljust(64, b"\0") + struct.pack("<II", 60, 0) +
                bytes(range(64, 96)) + bytes(range(96, 160))),  # public key, proof
    "alloc-tagged": msg(ALLOC_TAGGED, struct.pack("<QQ", 5, 2)),
    "set-tag": msg(SET_TAG, struct.pack("<IIQQ", 3, 0, 5, 3)),
    "set-floor": msg(SET_TAG, struct.pack("<IIQQ", 0xFFFFFFFF, 0, 5, 3)),
    "volume-list": msg(VOLUME_LIST, struct.pack("<IIQ", 0, 0, 0)),
    "volume-list-sessions": msg(VOLUME_LIST, struct.pack("<IIQ", 2, 0, 0)),
    "giveback": msg(GIVEBACK, struct.pack("<Q", 64 << 20)),
    "wanted": msg(WANTED),
    "giveback-status": msg(GIVEBACK_STATUS),
}
replies = {
    "auth": reply(w.AUTH, nonce + mac),
    "auth-proof": reply(w.AUTH_PROOF),
    "hello": reply(w.HELLO, struct.pack("<QQQIIIIQ", 0x1111, 0x2222, 1 << 28, 16, 15,
                                        1 << 20, 1, 5) + bytes(range(160, 192))),  # challenge
    "alloc": reply(w.ALLOC, struct.pack("<IIQQII", 3, 0x1234, 0x7F0000000000, 1 << 28, 12, 0)),
    "free": reply(w.FREE),
    "read": reply(w.READ, b"x" * 64),
    "write": reply(w.WRITE),
    "stats": reply(w.STATS, struct.pack("<QQIIIIQQQQIIQ", 4 << 30, 1 << 28, 16, 12, 2, 1,
                                        10, 40960, 20, 81920, 1, 3, 0)),
    "list": reply(w.LIST, struct.pack("<IIII", 3, 0, 5, 9)),
    "list-empty": reply(w.LIST, struct.pack("<I", 0)),
    "error": reply(w.ALLOC, status=28),  # ENOSPC
    "bind": reply(BIND, struct.pack("<IIQ", 1, 4, 2500)),
    "alloc-tagged": reply(ALLOC_TAGGED, struct.pack("<IIQQII", 3, 0x1234, 0x7F0000000000,
                                                    1 << 28, 12, 0)),
    "set-tag": reply(SET_TAG),
    "volume-list": reply(VOLUME_LIST, struct.pack("<I", 2) +
                         struct.pack("<IIQQQ", 3, 0x1234, 0x7F0000000000, 5, 2) +
                         struct.pack("<IIQQQ", 0xFFFFFFFF, 0, 0, 6, 3)),
    "volume-list-sessions": reply(VOLUME_LIST, struct.pack("<I", 1) +
                                  struct.pack("<QIIQII", 0xABCD, 4, 3, 1500, 60, 0) +
                                  b"vol".ljust(64, b"\0") + b"127.0.0.1:5000".ljust(64, b"\0")),
    "giveback": reply(GIVEBACK, struct.pack("<IIIIII", 4, 2, 4, 2, 64, 0)),
    "wanted": reply(WANTED, struct.pack("<III", 2, 3, 7)),
    "giveback-status": reply(GIVEBACK_STATUS, struct.pack("<IIIIII", 0, 0, 4, 2, 64, 0)),
}
# A BIND whose proof is valid (for its own public key) over the challenge and session id that
# follow it: the fuzzer's check_bind reads them from the bytes after the body.
vk = w.VolumeKey(b"seed volume secret, 32 bytes!!!", "seed-volume")
challenge, session = bytes(range(200, 232)), 0x1111
requests["bind-signed"] = msg(BIND, b"seed-volume".ljust(64, b"\0") + struct.pack("<II", 60, 0) +
                              vk.public +
                              vk.sign(w.bind_message(challenge, session, "seed-volume", 60,
                                                     vk.public))) + \
    challenge + struct.pack("<Q", session)
for name, data in requests.items():
    write("fuzz-protocol", "req-" + name, data)
for name, data in replies.items():
    write("fuzz-protocol", "reply-" + name, data)

# Donor certificates and revocation lists (common/wire/donor_cert.h), signed by a seed CA so that
# the fuzzer's signature, validity and bit-flip checks run; and addresses as certificates write
# them.
ca = w.VolumeKey(b"seed donor CA secret, 32 bytes!", "seed-ca")
donor = w.VolumeKey(b"seed donor secret, 32 bytes!!!!", "seed-donor")


def cert(serial, not_before, not_after, name, addresses, signer=ca):
    body = (b"RSDC" + bytes([1, 0]) + struct.pack("<Qqq", serial, not_before, not_after) +
            ca.public + donor.public + bytes([len(name)]) + name.encode() +
            bytes([len(addresses)]) +
            b"".join(bytes([len(a)]) + a.encode() for a in addresses))
    return body + signer.sign(b"rdmaswap-donor-cert-v1" + body)


def crl(issued, serials, signer=ca):
    body = (b"RSDR" + bytes([1, 0]) + ca.public + struct.pack("<qI", issued, len(serials)) +
            b"".join(struct.pack("<Q", s) for s in serials))
    return body + signer.sign(b"rdmaswap-donor-crl-v1" + body)


donor_seeds = {
    "cert-one": cert(1, 1700000000, 4102444800, "donor1", ["10.0.0.2:7471"]),
    "cert-v6": cert(0x7FFFFFFFFFFFFFFF, 0, 1, "d", ["[fe80::1]:1", "127.0.0.1:65535"]),
    "cert-many": cert(42, -(1 << 63), (1 << 63) - 1, "x" * 64,
                      ["10.0.0.%d:%d" % (i, 7000 + i) for i in range(16)]),
    "cert-expired": cert(7, 1000, 2000, "old", ["192.168.1.1:7471"]),
    "cert-forged": cert(9, 0, 4102444800, "forged", ["10.0.0.9:7471"], signer=donor),
    "crl-empty": crl(1700000000, []),
    "crl-some": crl(1700000001, [1, 2, 3, 10, 0xFFFFFFFFFFFFFFFE]),
    "crl-edges": crl(-1, [0, 1, 0xFFFFFFFFFFFFFFFF]),
    "crl-forged": crl(1700000002, [5], signer=donor),
    "addr-v4": b"10.0.0.2:7471",
    "addr-v6": b"[2001:db8::1]:7471",
    "addr-v4-noport": b"127.0.0.1",
}
for name, data in donor_seeds.items():
    write("fuzz-donor-cert", name, data)

config = {
    "size-plain": "4096", "size-k": "64K", "size-m": "256M", "size-gib": "4GiB",
    "size-tb": "1tb", "size-max": "18446744073709551615", "size-b": "512B",
    "ep-host": "donor1", "ep-host-port": "donor1:7471", "ep-ipv4": "10.0.0.2:7500",
    "ep-v6": "[::1]", "ep-v6-port": "[fe80::1%eth0]:65535",
    "tr-tcp": "tcp", "tr-rdma": "rdma", "tr-auto": "auto",
}
for name, text in config.items():
    write("fuzz-config", name, text.encode())
