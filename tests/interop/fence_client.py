#!/usr/bin/env python3
"""A minimal NBD client that declares a cairn owner token (OPT_CAIRN_FENCE, docs/fencing.md)
before NBD_OPT_GO, for tests/interop/fence.sh. libnbd cannot send a private option.

Usage: fence_client.py SOCKET EXPORT STEP...
  NAME=conn:NODE:INSTANCE:GEN   connect NAME with a token (GEN 0: no token)
  NAME.write:OFFSET:BYTE        write 4096 bytes of BYTE at OFFSET
  NAME.read:OFFSET              read 4096 bytes at OFFSET
Prints one line per step: "STEP ok", "STEP errno N" or "STEP refused: MESSAGE".
"""
import socket
import struct
import sys

OPT_CAIRN_FENCE = 0x43524E46
OPT_GO = 7
IHAVEOPT = 0x49484156454F5054
ARRAY = b"interop-array-01"


def recvall(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("server closed the connection")
        b += c
    return b


def option(s, opt, data):
    s.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)
    while True:
        _magic, _opt, kind, length = struct.unpack(">QIII", recvall(s, 20))
        payload = recvall(s, length)
        if kind == 1 or kind >= 0x80000000:
            return kind, payload


def connect(path, export, node, instance, gen):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
    recvall(s, 18)
    s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
    name = export.encode()
    if gen:
        payload = struct.pack(">HH16sQQ32sI", 1, 0, ARRAY, gen, instance,
                              node.encode().ljust(32, b"\0"), len(name)) + name
        kind, msg = option(s, OPT_CAIRN_FENCE, payload)
        if kind != 1:
            return None, msg.decode(errors="replace")
    kind, msg = option(s, OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    if kind != 1:
        return None, msg.decode(errors="replace")
    return s, None


def request(s, kind, offset, data=b"", length=4096):
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, kind, 1, offset, length) + data)
    _magic, err, _cookie = struct.unpack(">IIQ", recvall(s, 16))
    if err == 0 and kind == 0:
        recvall(s, length)
    return err


def main():
    path, export = sys.argv[1], sys.argv[2]
    conns = {}
    for step in sys.argv[3:]:
        if "=conn:" in step:
            name, rest = step.split("=conn:")
            node, instance, gen = rest.split(":")
            s, msg = connect(path, export, node, int(instance), int(gen))
            if s is None:
                print(f"{step} refused: {msg}", flush=True)
            else:
                conns[name] = s
                print(f"{step} ok", flush=True)
            continue
        name, rest = step.split(".", 1)
        verb, args = rest.split(":", 1)
        if verb == "write":
            off, byte = args.split(":")
            err = request(conns[name], 1, int(off), bytes([int(byte)]) * 4096)
        else:
            err = request(conns[name], 0, int(args))
        print(f"{step} ok" if err == 0 else f"{step} errno {err}", flush=True)


main()
