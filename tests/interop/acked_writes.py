#!/usr/bin/python3
"""Acknowledged writes against a server that may be killed at any moment.

  acked_writes.py write URI SEED BLOCKS BS DEPTH LOG [stamp]
      Writes every block 0..BLOCKS-1 once, in an order and with contents that are a
      function of SEED, keeping DEPTH writes in flight on one connection (replies may
      come back in any order). Each write the server acknowledges is appended to LOG
      (one block number a line) the moment its reply is read; with `stamp`, each line
      also holds the wall-clock time the reply was read ("BLOCK SECONDS", time.time()),
      so a test can tell when a write was acknowledged. A write that fails is not
      logged and the writer goes on; when the connection dies (the server was killed)
      it stops and exits 0.
  acked_writes.py check URI SEED BS LOG
      Reads back every block LOG lists and compares it with what was written; exits 1
      and names the first blocks that differ.

The oracle fio's saved verify state cannot be with out-of-order replies: LOG holds
exactly the acknowledged writes, whatever their order. Each block is written once per
SEED, so an acknowledged block has one right content.
"""
import os
import random
import sys
import time

import nbd


def content(seed, block, bs):
    head = b"ACKD" + seed.to_bytes(8, "little") + block.to_bytes(8, "little")
    return head + random.Random(seed * 1_000_003 + block).randbytes(bs - len(head))


def write(uri, seed, blocks, bs, depth, log, stamp=False):
    order = list(range(blocks))
    random.Random(seed).shuffle(order)
    h = nbd.NBD()
    h.connect_uri(uri)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pending = {}
    nxt = 0
    acked = 0
    try:
        while nxt < len(order) or pending:
            while nxt < len(order) and len(pending) < depth:
                b = order[nxt]
                nxt += 1
                pending[h.aio_pwrite(content(seed, b, bs), b * bs)] = b
            h.poll(-1)
            for cookie in list(pending):
                try:
                    done = h.aio_command_completed(cookie)
                except nbd.Error:
                    del pending[cookie]  # failed: not acknowledged
                    continue
                if done:
                    b = pending.pop(cookie)
                    if stamp:
                        os.write(fd, b"%d %.6f\n" % (b, time.time()))
                    else:
                        os.write(fd, b"%d\n" % b)
                    acked += 1
    except nbd.Error as e:
        print(f"connection ended after {acked} acknowledged writes: {e}")
    else:
        print(f"all {acked} writes acknowledged")
    os.close(fd)


def check(uri, seed, bs, log):
    with open(log) as f:
        blocks = [int(line.split()[0]) for line in f if line.strip()]
    h = nbd.NBD()
    h.connect_uri(uri)
    bad = []
    for b in blocks:
        if h.pread(bs, b * bs) != content(seed, b, bs):
            bad.append(b)
    h.shutdown()
    print(f"checked {len(blocks)} acknowledged writes, {len(bad)} wrong")
    if bad:
        print("wrong blocks: " + " ".join(map(str, bad[:20])))
        sys.exit(1)


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["write"] and len(a) in (7, 8) and a[7:] in ([], ["stamp"]):
        write(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6], a[7:] == ["stamp"])
    elif a[:1] == ["check"] and len(a) == 5:
        check(a[1], int(a[2]), int(a[3]), a[4])
    else:
        sys.exit(__doc__)
