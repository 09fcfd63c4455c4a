#!/usr/bin/env bash
# `cairn bench`: a small matrix (RAID5/6 x 64K/128K chunks x 256/512-bit keys) on scratch
# files gives a JSON row per cell with every promised figure positive, a CSV, PNG and SVG
# plots that real decoders open, and a recommendation naming one of its cells; the
# request-size sweep of a RAID6 4 x 64K shows the full-stripe knee; given members are
# refused without --destructive; --nbd measures through cairn serve and fio.
. "$(dirname "$0")/lib.sh"

# json FILE EXPR: a Python expression over the JSON in FILE (as j).
json() { py -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

FIELDS="seq_write_mbps seq_read_mbps randread_qd1_iops randwrite_qd1_iops randread_qd32_iops \
randwrite_qd32_iops sync_write_iops cpu_s_per_gb_write cpu_s_per_gb_read full_stripe"

# check_results FILE CELLS MODE: CELLS rows, each with every figure positive, a sweep,
# latency percentiles in order, the mode stated, and a recommendation that names a cell.
check_results() {
  py - "$1" "$2" "$3" "$FIELDS" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); want = int(sys.argv[2]); mode = sys.argv[3]
fields = sys.argv[4].split()
cells = j["cells"]
assert len(cells) == want, f"{len(cells)} cells, expected {want}"
assert j["mode"] == mode, j["mode"]
labels = [c["cell"] for c in cells]
assert len(set(labels)) == len(labels), labels
for c in cells:
    assert c["mode"] == mode, c
    for f in fields:
        assert isinstance(c[f], (int, float)) and c[f] > 0, f"{c['cell']}: {f} = {c[f]}"
    lat = c["sync_write_lat_us"]
    ps = [lat[k] for k in ("p50", "p90", "p99", "p999", "max")]
    assert all(p > 0 for p in ps) and ps == sorted(ps), f"{c['cell']}: latency {lat}"
    assert len(c["sweep"]) >= 3, c["sweep"]
    assert all(p["request"] > 0 and p["write_mbps"] > 0 for p in c["sweep"]), c["sweep"]
    if mode == "in-process":
        assert all(p["member_ops_per_mib"] > 0 for p in c["sweep"]), c["sweep"]
    assert c["full_stripe"] in [p["request"] for p in c["sweep"]], "full stripe not swept"
    assert max(p["request"] for p in c["sweep"]) == 4 * c["full_stripe"], "sweep end"
    for k in ("level", "members", "chunk", "cipher", "key_size", "sector_size", "stripe_cache"):
        assert k in c, k
r = j["recommendation"]
assert r["cell"] in labels, f"recommended {r['cell']} is not in {labels}"
assert r["mkfs_ext4"].startswith("mkfs.ext4 -E stride="), r
assert r["mkfs_xfs"].startswith("mkfs.xfs -d su="), r
print("ok:", len(cells), "cells; recommended", r["cell"])
PY
}

# check_png FILE: a PNG that decodes: signature, IHDR, IDAT inflates to the right size.
check_png() {
  file "$1" | grep -q 'PNG image data' || fail "$1: file(1) says $(file -b "$1")"
  py - "$1" <<'PY'
import struct, sys, zlib
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"\x89PNG\r\n\x1a\n", "signature"
pos, idat, w = 8, b"", None
while pos < len(d):
    n, kind = struct.unpack(">I4s", d[pos:pos + 8])
    body = d[pos + 8:pos + 8 + n]
    crc, = struct.unpack(">I", d[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind}"
    if kind == b"IHDR":
        w, h, depth, color = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
channels = {2: 3, 6: 4, 0: 1}[color]
raw = zlib.decompress(idat)
assert len(raw) == h * (1 + w * channels * depth // 8), "pixel data size"
# Not a blank image: more than one distinct row.
rows = {raw[i * (1 + w * channels):(i + 1) * (1 + w * channels)] for i in range(h)}
assert len(rows) > 10, "blank image"
print("png ok", w, h)
PY
}

# check_svg FILE: an SVG document an XML parser reads, with text in it.
check_svg() {
  file "$1" | grep -q 'SVG' || fail "$1: file(1) says $(file -b "$1")"
  py - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag.endswith("svg"), root.tag
texts = [t.text for t in root.iter() if t.tag.endswith("text") and t.text]
assert len(texts) > 5, texts
print("svg ok", len(texts), "texts")
PY
}

t_matrix() {
  need_tool file
  local out=$WORK/matrix
  timeout -k 5 120 "$CAIRN" bench --level 5,6 --chunk 64K,128K --key-size 256,512 \
    --size 32M --runtime 0.05 --dir "$SHM" --out "$out" --csv "$WORK/matrix.csv" \
    >"$WORK/matrix.txt" 2>"$WORK/matrix.err" || { cat "$WORK/matrix.err"; fail "cairn bench failed"; }
  cat "$WORK/matrix.txt"
  check_results "$out/results.json" 8 in-process
  expect_eq "$(wc -l <"$WORK/matrix.csv")" 9 "CSV lines (header + 8 cells)"
  local f
  for f in throughput iops knee latency; do
    check_png "$out/$f.png"
    check_svg "$out/$f.svg"
  done
  expect_contains "$(cat "$WORK/matrix.txt")" "recommended for a seq workload" "the recommendation"
  # stderr is not a terminal here: progress as plain lines, no escape codes.
  grep -q 'bench: .* done' "$WORK/matrix.err" || fail "no progress lines on stderr"
  if grep -q $'\e' "$WORK/matrix.err"; then fail "escape codes on a stderr that is no terminal"; fi
  # Scratch members are gone.
  [ -z "$(ls -A "$SHM")" ] || fail "scratch files left: $(ls "$SHM")"
  # --compare of a run with itself: every ratio 1.00.
  "$CAIRN" bench --compare "$out/results.json" "$out/results.json" >"$WORK/cmp.txt"
  grep -c '1.00x' "$WORK/cmp.txt" | grep -qx 80 || { cat "$WORK/cmp.txt"; fail "compare"; }
}

# The full-stripe knee: RAID6 over 4 members with 64K chunks, members that take 1 ms per
# operation (so that the figure counts the stack's member operations, not the speed of a
# busy machine): 128K requests (full stripes) write at least twice as fast as 64K ones
# (read-modify-write), and cost at most half the member operations per MiB.
t_knee() {
  timeout -k 5 120 "$CAIRN" bench --level 6 --members 4 --chunk 64K --cipher none \
    --member-latency 1ms --size 32M --runtime 0.3 --dir "$SHM" --out "$WORK/knee" \
    --no-plots --json >"$WORK/knee.json" 2>/dev/null || fail "cairn bench failed"
  py - "$WORK/knee.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["cells"][0]
s = {p["request"]: p["write_mbps"] for p in c["sweep"]}
assert c["full_stripe"] == 128 << 10, c["full_stripe"]
ops = {p["request"]: p["member_ops_per_mib"] for p in c["sweep"]}
print("64K:", s[64 << 10], "MB/s", ops[64 << 10], "member ops/MiB;",
      "128K:", s[128 << 10], "MB/s", ops[128 << 10], "member ops/MiB")
assert s[128 << 10] >= 2 * s[64 << 10], "no knee at the full stripe"
# The same knee counted: a partial-stripe write costs its reads too.
assert ops[64 << 10] >= 2 * ops[128 << 10], "no knee in member operations"
PY
}

t_destructive() {
  local i m=()
  for i in 0 1 2 3; do
    m+=("$SHM/d$i.img")
    printf 'precious %s' "$i" >"$SHM/d$i.img"
    truncate -s 48M "$SHM/d$i.img"
  done
  local before
  before=$(cat "${m[@]}" | md5sum)
  expect_status 1 "$CAIRN" bench --out "$WORK/d" "${m[@]}" 2>"$WORK/d.err"
  expect_contains "$(cat "$WORK/d.err")" "--destructive" "the refusal"
  expect_eq "$(cat "${m[@]}" | md5sum)" "$before" "members untouched"
  timeout -k 5 120 "$CAIRN" bench --destructive --level 6 --chunk 64K --cipher none \
    --runtime 0.05 --out "$WORK/d" --no-plots "${m[@]}" >/dev/null 2>&1 || fail "bench --destructive"
  check_results "$WORK/d/results.json" 1 in-process
}

t_nbd() {
  need_tool fio
  timeout -k 5 120 "$CAIRN" bench --nbd --level 6 --chunk 64K --cipher none,aes-xts-plain64 \
    --sweep 4K..2x-full-stripe --size 32M --runtime 0.2 --dir "$SHM" --out "$WORK/nbd" \
    --no-plots >"$WORK/nbd.txt" 2>"$WORK/nbd.err" || { cat "$WORK/nbd.err"; fail "bench --nbd"; }
  cat "$WORK/nbd.txt"
  py - "$WORK/nbd/results.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["mode"] == "nbd+fio", j["mode"]
for c in j["cells"]:
    for f in ("seq_write_mbps", "seq_read_mbps", "randread_qd32_iops", "randwrite_qd32_iops", "sync_write_iops"):
        assert c[f] > 0, (c["cell"], f, c[f])
    assert c["sync_write_lat_us"]["p50"] > 0
print("ok")
PY
  expect_contains "$(cat "$WORK/nbd.txt")" "nbd+fio" "the mode stated"
  # No fio: a clear error, nothing measured.
  mkdir -p "$WORK/nofio"
  expect_status 1 env PATH="$WORK/nofio" "$CAIRN" bench --nbd --out "$WORK/nbd2" 2>"$WORK/nofio.err"
  expect_contains "$(cat "$WORK/nofio.err")" "fio is not installed" "the missing fio"
}

run_test matrix t_matrix
run_test knee t_knee
run_test destructive t_destructive
run_test nbd t_nbd
finish
