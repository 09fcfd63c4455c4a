#!/usr/bin/env bash
# nbdinfo against cairn serve: names, size, flags, block sizes, base:allocation, listing,
# the default export, read-only, O_DIRECT block size. Over the Unix socket and TCP.
. "$(dirname "$0")/lib.sh"

MiB=$((1 << 20))

# A 64 MiB sparse file with data at [0, 1M) and [32M, 33M): everything else is a hole.
make_sparse_disk() {
  truncate -s 64M "$1"
  head -c 1M /dev/urandom | dd of="$1" conv=notrunc status=none
  head -c 1M /dev/urandom | dd of="$1" bs=1M seek=32 conv=notrunc status=none
}

# check_info_json JSON-FILE NAME SIZE READ_ONLY MIN_BLOCK: the fields nbdinfo --json gives.
check_info_json() {
  py - "$@" <<'EOF'
import json, sys
path, name, size, ro, minb = sys.argv[1:]
j = json.load(open(path))
exports = j["exports"]
assert len(exports) == 1, exports
e = exports[0]
def want(key, value):
    assert e.get(key) == value, f"{key}: got {e.get(key)!r}, expected {value!r}"
want("export-name", name)
want("export-size", int(size))
want("is_read_only", ro == "true")
want("can_flush", True)
want("can_multi_conn", True)
want("block_size_minimum", int(minb))
pref, maxb = e["block_size_preferred"], e["block_size_maximum"]
assert pref >= int(minb) and pref & (pref - 1) == 0, f"preferred {pref}"
assert maxb >= pref and maxb % int(minb) == 0, f"maximum {maxb}"
if ro == "true":
    for k in ("can_trim", "can_zero"):
        assert not e.get(k), f"{k} advertised on a read-only export"
else:
    want("can_fua", True)
    want("can_trim", True)
    want("can_zero", True)
assert "base:allocation" in e.get("contexts", []), e.get("contexts")
print(f"ok: {name} size={e['export-size']} blocks={e['block_size_minimum']}/{pref}/{maxb}")
EOF
}

t_basics() {
  need_tool nbdinfo
  make_sparse_disk "$WORK/vol.img"
  start_cairn "$WORK/vol.img"
  for uri in "$(unix_uri vol)" "$(tcp_uri vol)"; do
    nbdinfo --json "$uri" >"$WORK/info.json"
    check_info_json "$WORK/info.json" vol $((64 * MiB)) false 512
    expect_eq "$(nbdinfo --size "$uri")" $((64 * MiB)) "nbdinfo --size $uri"
    expect_status 0 nbdinfo --can flush "$uri"
    expect_status 0 nbdinfo --can fua "$uri"
    expect_status 0 nbdinfo --can multi-conn "$uri"
    expect_status 2 nbdinfo --is read-only "$uri"
  done
  nbdinfo "$(unix_uri vol)"
}

# base:allocation: the data and holes of the sparse file, via nbdinfo --map.
t_map() {
  need_tool nbdinfo
  make_sparse_disk "$WORK/map.img"
  start_cairn "$WORK/map.img"
  nbdinfo --map "$(unix_uri map)" | tee "$WORK/map.txt"
  nbdinfo --map --json "$(tcp_uri map)" >"$WORK/map.json"
  py - "$WORK/map.json" <<'EOF'
import json, sys
MiB = 1 << 20
extents = json.load(open(sys.argv[1]))
end = 0
for x in extents:
    assert x["offset"] == end, f"extents not contiguous at {x}"
    end += x["length"]
assert end == 64 * MiB, f"map covers {end} bytes"
def kind_at(off):
    for x in extents:
        if x["offset"] <= off < x["offset"] + x["length"]:
            return x["type"]
# Data must never be reported as a hole (that would lose it in nbdcopy and qemu-img).
for off in list(range(0, MiB, 4096)) + list(range(32 * MiB, 33 * MiB, 4096)):
    assert kind_at(off) & 1 == 0, f"data at {off} reported as hole"
# Holes well away from the data must be reported as holes (type 3 = hole,zero).
for off in (4 * MiB, 16 * MiB, 28 * MiB, 40 * MiB, 63 * MiB):
    assert kind_at(off) == 3, f"hole at {off} reported as type {kind_at(off)}"
print(f"ok: {len(extents)} extents")
EOF
  # And the file as cairn writes it: zeroing a range turns it back into a hole.
  # (qemu-io is the simplest client that sends WRITE_ZEROES with the may-trim flag.)
  if command -v qemu-io >/dev/null; then
    qemu-io -f raw -c 'write -z -u 0 1M' "$(unix_uri map)" >/dev/null
    nbdinfo --map --json "$(unix_uri map)" >"$WORK/map2.json"
    py - "$WORK/map2.json" <<'EOF'
import json, sys
x = json.load(open(sys.argv[1]))[0]
assert x["offset"] == 0 and x["type"] & 2, f"zeroed range not reported as zero: {x}"
print("ok: zeroed range reads as zero in the map")
EOF
  fi
}

# Several exports: --list shows them all with their descriptions; --default-export answers
# the empty name.
t_list_and_default() {
  need_tool nbdinfo
  truncate -s 8M "$WORK/a.img"
  truncate -s 16M "$WORK/b.img"
  start_cairn --default-export big "$WORK/a.img" "$WORK/b.img:big"
  nbdinfo --list --json "$(unix_uri '')" >"$WORK/list.json"
  py - "$WORK/list.json" "$WORK" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
got = {e["export-name"]: e for e in j["exports"]}
assert set(got) == {"a", "big"}, got.keys()
assert got["a"]["export-size"] == 8 << 20
assert got["big"]["export-size"] == 16 << 20
assert got["big"]["description"] == sys.argv[2] + "/b.img", got["big"]
print("ok:", sorted(got))
EOF
  # nbd://host:port/ with no name gets the default export.
  expect_eq "$(nbdinfo --size "nbd://127.0.0.1:$CAIRN_PORT")" $((16 << 20)) "size of the default export"
  # An unknown name is refused, and the server goes on serving.
  expect_status 1 nbdinfo "$(tcp_uri nosuch)"
  expect_eq "$(nbdinfo --size "$(tcp_uri a)")" $((8 << 20)) "size after a refused name"
}

t_read_only() {
  need_tool nbdinfo
  truncate -s 8M "$WORK/ro.img"
  start_cairn --read-only "$WORK/ro.img"
  nbdinfo --json "$(unix_uri ro)" >"$WORK/ro.json"
  check_info_json "$WORK/ro.json" ro $((8 * MiB)) true 512
  expect_status 0 nbdinfo --is read-only "$(tcp_uri ro)"
}

# --direct opens the file O_DIRECT, which needs 4096-byte I/O: the advertised minimum
# block size says so.
t_direct() {
  need_tool nbdinfo
  truncate -s 8M "$WORK/direct.img"
  if ! dd if=/dev/zero of="$WORK/direct.img" bs=4096 count=1 oflag=direct conv=notrunc status=none 2>/dev/null; then
    say "NOTE: $WORK does not support O_DIRECT; checking --direct's clear refusal instead"
    expect_status 1 "$CAIRN" serve --direct --listen "unix:$WORK/d.sock" "$WORK/direct.img"
    return 0
  fi
  start_cairn --direct "$WORK/direct.img"
  nbdinfo --json "$(unix_uri direct)" >"$WORK/direct.json"
  check_info_json "$WORK/direct.json" direct $((8 * MiB)) false 4096
}

run_test basics t_basics
run_test map t_map
run_test list-and-default t_list_and_default
run_test read-only t_read_only
run_test direct t_direct
finish
