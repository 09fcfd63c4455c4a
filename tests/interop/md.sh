#!/usr/bin/env bash
# md RAID arrays through the cairn command: `cairn md create` checked by mdadm --examine
# over a table of shapes, arrays served over NBD (healthy and degraded) read back byte for
# byte, a kernel filesystem on RAID5 and RAID6 that loses a member half-way, and bad input
# refused with nothing written.
. "$(dirname "$0")/lib.sh"

MiB=$((1024 * 1024))

# examine_fields FILE: mdadm --examine's "Key : value" lines as KEY=value (Python dict).
examine_check() { # MEMBER ROLE LEVEL DEVICES LAYOUT CHUNK UUID CAIRN-JSON
  mdadm --examine "$1" >"$WORK/ex.txt" 2>&1 || fail "mdadm --examine $1: $(cat "$WORK/ex.txt")"
  py - "$@" "$WORK/ex.txt" <<'EOF'
import json, sys
member, role, level, devices, layout, chunk, uuid, cj, text = sys.argv[1:]
f = {}
for line in open(text):
    if " : " in line:
        k, v = line.split(" : ", 1)
        f[k.strip()] = v.strip()
def want(k, v):
    assert f.get(k) == v, f"{member}: mdadm says {k} = {f.get(k)!r}, expected {v!r}"
assert f.get("Checksum", "").endswith("- correct"), f"{member}: Checksum {f.get('Checksum')!r}"
want("Raid Level", level)
want("Raid Devices", devices)
want("Array UUID", uuid)
want("Device Role", f"Active device {role}")
if layout != "-":
    want("Layout", layout)
if chunk != "-":
    want("Chunk Size", chunk)
# cairn md examine --json agrees with mdadm.
(e,) = [x for x in json.load(open(cj)) if x["member"] == member]
e = e["examine"]
assert e["array_uuid"] == uuid, (e["array_uuid"], uuid)
assert e["raid_level"] == level, e["raid_level"]
assert e["raid_devices"] == int(devices), e["raid_devices"]
assert e["device_role"] == f"Active device {role}", e["device_role"]
if layout != "-":
    assert e["layout"].strip() == layout, e["layout"]
if chunk != "-":
    assert f"{e['chunk_kib']}K" == chunk, e["chunk_kib"]
EOF
}

# One row per shape: LEVEL MEMBERS CHUNK LAYOUT-ARG  EXPECTED-LEVEL EXPECTED-LAYOUT EXPECTED-CHUNK
SHAPES=(
  "5 3 64K ls raid5 left-symmetric 64K"
  "5 4 512K la raid5 left-asymmetric 512K"
  "raid5 4 64K rs raid5 right-symmetric 64K"
  "5 5 4K ra raid5 right-asymmetric 4K"
  "6 4 64K - raid6 left-symmetric 64K"
  "6 5 128K la raid6 left-asymmetric 128K"
  "6 6 1M parity-first raid6 parity-first 1024K"
  "6 4 64K ddf-N-restart raid6 ddf-N-restart 64K"
  "6 5 64K ddf-n-continue raid6 ddf-N-continue 64K"
  "6 4 64K ddf-zero-restart raid6 ddf-zero-restart 64K"
  "5 3 64K ddf-N-continue raid5 left-symmetric 64K"
  "4 3 64K - raid4 - 64K"
  "0 3 64K - raid0 - 64K"
  "1 2 - - raid1 - -"
  "10 4 64K n2 raid10 near=2 64K"
  "10 4 64K f2 raid10 far=2 64K"
  "10 3 512K o2 raid10 offset=2 512K"
  "linear 2 - - linear - -"
)

t_create_examine() {
  need_tool mdadm
  local row level n chunk layout elevel elayout echunk i args members uuid
  for row in "${SHAPES[@]}"; do
    read -r level n chunk layout elevel elayout echunk <<<"$row"
    rm -f "$SHM"/m*.img
    members=()
    for i in $(seq 0 $((n - 1))); do members+=("$SHM/m$i.img"); done
    args=(--level "$level" --raid-devices "$n" --size 64M --name "shape")
    [ "$chunk" = - ] || args+=(--chunk "$chunk")
    [ "$layout" = - ] || args+=(--layout "$layout")
    "$CAIRN" md create --json "${args[@]}" "${members[@]}" >"$WORK/create.json" ||
      fail "cairn md create ${args[*]} failed"
    uuid=$(py -c 'import json,sys; print(json.load(open(sys.argv[1]))["uuid"])' "$WORK/create.json")
    "$CAIRN" md examine --json "${members[@]}" >"$WORK/examine.json" || fail "cairn md examine failed"
    for i in $(seq 0 $((n - 1))); do
      examine_check "${members[$i]}" "$i" "$elevel" "$n" "$elayout" "$echunk" "$uuid" "$WORK/examine.json"
    done
    say "ok: $row (uuid $uuid)"
  done
  rm -f "$SHM"/m*.img
}

# --- served over NBD, healthy then degraded ---------------------------------------------

# make_array LEVEL N CHUNK SIZE: members $SHM/d0.img ... in MEMBERS, joined in MD_LIST.
make_array() {
  local level=$1 n=$2 chunk=$3 size=$4 i
  rm -f "$SHM"/d*.img
  MEMBERS=()
  for i in $(seq 0 $((n - 1))); do MEMBERS+=("$SHM/d$i.img"); done
  MD_LIST=$(IFS=,; echo "${MEMBERS[*]}")
  "$CAIRN" md create --level "$level" --chunk "$chunk" --raid-devices "$n" --size "$size" \
    --name "t$level" "${MEMBERS[@]}" >"$WORK/create.txt" || fail "md create: $(cat "$WORK/create.txt")"
}

# read_back URI N: the first N bytes of the export must equal $SHM/data.bin.
read_back() {
  rm -f "$SHM/back.bin"
  nbdcopy "$1" "$SHM/back.bin"
  cmp -n "$2" "$SHM/data.bin" "$SHM/back.bin" || fail "read back through $1 differs"
}

md_roundtrip() { # LEVEL N EXPECTED-PREFERRED
  local level=$1 n=$2 pref=$3 size
  need_tool nbdcopy nbdinfo mdadm cmp
  make_array "$level" "$n" 64K 48M
  start_cairn --md "$MD_LIST:r"
  size=$(nbdinfo --size "$(unix_uri r)")
  expect_eq "$(nbdinfo --json "$(unix_uri r)" | py -c 'import json,sys; print(json.load(sys.stdin)["exports"][0]["block_size_preferred"])')" \
    "$pref" "preferred block size (full stripe, or the chunk when the stripe is not a power of two)"
  random_file "$SHM/data.bin" "$((size / MiB))M"
  nbdcopy "$SHM/data.bin" "$(unix_uri r)"
  read_back "$(tcp_uri r)" "$size"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
  mdadm --examine "${MEMBERS[0]}" | grep -q 'State : clean' || fail "array not marked clean on shutdown"

  # One member missing: renamed away, so the array starts degraded and says so.
  mv "${MEMBERS[1]}" "$SHM/away1.img"
  start_cairn --md "$MD_LIST:r"
  grep -q "DEGRADED" "$CAIRN_LOG" || fail "no degraded warning: $(cat "$CAIRN_LOG")"
  expect_eq "$(grep -c "DEGRADED" "$CAIRN_LOG")" 1 "the degraded warning, printed once"
  expect_contains "$(grep "DEGRADED" "$CAIRN_LOG")" "1 of $n members missing" "the count of missing members"
  grep -q "${MEMBERS[1]}" "$CAIRN_LOG" || fail "the warning does not name the missing file"
  read_back "$(unix_uri r)" "$size"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status (degraded)"

  if [ "$level" = 6 ]; then
    mv "${MEMBERS[3]}" "$SHM/away3.img"
    start_cairn --md "$MD_LIST:r"
    read_back "$(unix_uri r)" "$size"
    stop_cairn
    expect_eq "$CAIRN_STATUS" 0 "cairn exit status (two missing)"
    mv "$SHM/away3.img" "${MEMBERS[3]}"
  fi
  mv "$SHM/away1.img" "${MEMBERS[1]}"
  rm -f "$SHM"/*.bin
}

t_raid6_nbd() { md_roundtrip 6 4 131072; }  # full stripe 2 x 64K
t_raid5_nbd() { md_roundtrip 5 4 65536; }   # full stripe 3 x 64K: not a power of two

# --- a filesystem that loses a member half-way ------------------------------------------


# The "member missing part of the way through" is done between two runs of cairn (stop,
# hide a member, serve degraded): there is no runtime `md fail` yet. A member failing
# under a live filesystem comes with the failure-handling issue.
md_fs() { # LEVEL N
  local level=$1 n=$2 mnt=$WORK/mnt d=$SHM/testdata i
  need_root
  need_fuse
  need_tool losetup mount umount mkfs.ext4 e2fsck sha256sum
  mkdir -p "$d/one/deep/a" "$d/two/small"
  random_file "$d/one/big1.bin" 24M
  for i in $(seq 40); do head -c $((RANDOM * 4 + i)) /dev/urandom >"$d/one/deep/a/f$i"; done
  random_file "$d/two/big2.bin" 16M
  for i in $(seq 60); do head -c $((RANDOM * 2 + i)) /dev/urandom >"$d/two/small/s$i"; done
  (cd "$SHM" && find testdata -type f -print0 | sort -z | xargs -0 sha256sum) >"$WORK/sums"
  grep ' testdata/one/' "$WORK/sums" >"$WORK/sums1"

  make_array "$level" "$n" 64K 96M
  start_cairn --md "$MD_LIST:fs"
  attach_export "$(unix_uri fs)"
  # stride/stripe-width from the array's shape, as the create summary advises.
  mkfs.ext4 -q -F -E "stride=16,stripe-width=$((16 * (n - (level == 6 ? 2 : 1))))" "$LOOP"
  mkdir -p "$mnt"
  mount "$LOOP" "$mnt"
  register mount "$mnt"
  mkdir -p "$mnt/testdata"
  cp -a "$d/one" "$mnt/testdata/"
  umount "$mnt"
  detach_export
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"

  # A member goes missing; the second half goes onto the degraded array.
  mv "${MEMBERS[2]}" "$SHM/away.img"
  start_cairn --md "$MD_LIST:fs"
  grep -q DEGRADED "$CAIRN_LOG" || fail "no degraded warning"
  attach_export "$(unix_uri fs)"
  mount "$LOOP" "$mnt"
  (cd "$mnt" && sha256sum --quiet -c "$WORK/sums1") || fail "first half differs when degraded"
  cp -a "$d/two" "$mnt/testdata/"
  umount "$mnt"
  e2fsck -fn "$LOOP" || fail "e2fsck -fn found errors on the degraded array"
  mount -o ro "$LOOP" "$mnt"
  (cd "$mnt" && sha256sum --quiet -c "$WORK/sums") || fail "files differ after the final remount"
  umount "$mnt"
  detach_export
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status (degraded)"
  mv "$SHM/away.img" "${MEMBERS[2]}"
  rm -rf "$d"
}

t_raid5_ext4() { md_fs 5 3; }
t_raid6_ext4() { md_fs 6 4; }

# --- bad input: a clear error, a non-zero exit, nothing written -------------------------

hash_members() { sha256sum "$SHM"/*.img; }

# refused WHAT-TO-GREP CMD...: CMD must fail, say WHAT, and leave every member unchanged.
refused() {
  local want=$1 before
  shift
  before=$(hash_members)
  if "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; then
    fail "$* succeeded; expected a refusal"
  fi
  grep -qi -- "$want" "$WORK/err.txt" || fail "$*: expected '$want' in: $(cat "$WORK/err.txt")"
  expect_eq "$(hash_members)" "$before" "member files after: $*"
  say "ok: refused ($want): $(head -c 300 "$WORK/err.txt")"
}

t_bad_input() {
  need_tool sha256sum
  make_array 5 3 64K 16M
  local a=("${MEMBERS[@]}") i
  for i in 0 1 2; do mv "${a[$i]}" "$SHM/a$i.img"; a[$i]=$SHM/a$i.img; done
  make_array 5 3 64K 16M
  local b=("${MEMBERS[@]}")
  truncate -s 16M "$SHM/blank.img"

  refused "--raid-devices 4 but 3 members" \
    "$CAIRN" md create -l 5 -n 4 --size 16M "$SHM/blank.img" "$SHM/new1.img" "$SHM/new2.img"
  refused "unknown RAID level" "$CAIRN" md create -l 7 -n 2 "$SHM/blank.img" "$SHM/new1.img"
  refused "power of two" "$CAIRN" md create -l 5 -c 48K -n 3 --size 16M \
    "$SHM/blank.img" "$SHM/new1.img" "$SHM/new2.img"
  refused "unknown raid5 layout" "$CAIRN" md create -l 5 -p f2 -n 3 --size 16M \
    "$SHM/blank.img" "$SHM/new1.img" "$SHM/new2.img"
  refused "raid4 has no layout choice" "$CAIRN" md create -l 4 -p parity-first -n 3 --size 16M \
    "$SHM/blank.img" "$SHM/new1.img" "$SHM/new2.img"
  [ ! -e "$SHM/new1.img" ] || fail "a refused create left $SHM/new1.img behind"
  # A member of another array mixed into a new one: refused, naming it and the array.
  refused "${a[1]} has a signature" "$CAIRN" md create -l 5 -n 3 --size 16M \
    "$SHM/blank.img" "${a[1]}" "$SHM/new2.img"
  [ ! -e "$SHM/new2.img" ] || fail "a refused create left $SHM/new2.img behind"
  # ... and mixed into an assembly.
  refused "different arrays" "$CAIRN" serve --listen "unix:$WORK/x.sock" --md "${a[0]},${b[1]},${a[2]}"
  refused "different arrays" "$CAIRN" md detail "${a[0]}" "${b[1]}" "${a[2]}"
  # Too many missing for RAID5.
  refused "cannot start" "$CAIRN" serve --listen "unix:$WORK/x.sock" \
    --md "${a[0]},$SHM/gone1.img,$SHM/gone2.img"
  # examine: a member without a superblock and one with a bad checksum are named; the
  # good one is still examined.
  cp "${b[0]}" "$SHM/badsum.img"
  printf '\xff' | dd of="$SHM/badsum.img" bs=1 seek=$((4096 + 100)) conv=notrunc status=none
  refused "blank.img" "$CAIRN" md examine "${b[2]}" "$SHM/blank.img" "$SHM/badsum.img"
  grep -q "badsum.img" "$WORK/err.txt" || fail "bad checksum not reported: $(cat "$WORK/err.txt")"
  grep -q "${b[2]}:" "$WORK/out.txt" || fail "the good member was not examined"
  "$CAIRN" md examine --json "${b[2]}" "$SHM/blank.img" >"$WORK/ex.json" 2>/dev/null && fail "examine --json exit 0"
  py -c 'import json,sys; j=json.load(open(sys.argv[1])); assert "examine" in j[0] and "error" in j[1], j' "$WORK/ex.json"
  # Crafted superblocks behind a valid checksum (mdadm says "correct"): a bad-block log
  # over the data (data_offset 24 sectors, the log where mdadm puts it) is refused by
  # examine and serve; an event count at its maximum is shown by examine, and refused
  # by serve rather than wrapped.
  local c=("$SHM/c0.img" "$SHM/c1.img" "$SHM/c2.img")
  for i in 0 1 2; do cp "${b[$i]}" "${c[$i]}"; done
  for i in 0 1 2; do sb_patch "${c[$i]}" 128 '<Q' 24; done
  mdadm --examine "${c[0]}" | grep -q 'Checksum : .* - correct' || fail "crafted checksum: $(mdadm --examine "${c[0]}")"
  refused "bblog_offset: the bad-block log (8 sectors at sector 24) overlaps the data area" \
    "$CAIRN" md examine "${c[0]}"
  refused "overlaps the data area" timeout 20 "$CAIRN" serve --listen "unix:$WORK/x.sock" --md "$(IFS=,; echo "${c[*]}")"
  for i in 0 1 2; do cp "${b[$i]}" "${c[$i]}"; sb_patch "${c[$i]}" 200 '<Q' 18446744073709551615; done
  mdadm --examine "${c[0]}" | grep -q 'Checksum : .* - correct' || fail "crafted checksum: $(mdadm --examine "${c[0]}")"
  "$CAIRN" md examine "${c[0]}" | grep -Eq 'Events : 18446744073709551615$' ||
    fail "examine does not show the events: $("$CAIRN" md examine "${c[0]}" 2>&1)"
  refused "the superblocks' event counter is at its maximum (18446744073709551615)" \
    timeout 20 "$CAIRN" serve --listen "unix:$WORK/x.sock" --md "$(IFS=,; echo "${c[*]}")"
}

# sb_patch MEMBER OFFSET FORMAT VALUE: packs VALUE (Python struct FORMAT) at OFFSET of
# the v1.2 superblock (byte 4096) and recomputes its checksum as md does
# (calc_sb_1_csum: le32 words over 256 + 2 x max_dev bytes, carries folded).
sb_patch() {
  py - "$@" <<'PY'
import struct, sys
path, off, fmt, val = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with open(path, "r+b") as f:
    f.seek(4096)
    b = bytearray(f.read(4096))
    struct.pack_into(fmt, b, off, val)
    n = 256 + 2 * struct.unpack_from("<I", b, 220)[0]
    b[216:220] = bytes(4)
    s = sum(struct.unpack_from("<%dI" % (n // 4), b, 0))
    if n % 4:
        s += struct.unpack_from("<H", b, n - 2)[0]
    s = (s & 0xFFFFFFFF) + (s >> 32)
    struct.pack_into("<I", b, 216, s & 0xFFFFFFFF)
    f.seek(4096)
    f.write(b)
PY
}

# --- the internal write-intent bitmap ---------------------------------------------------

examine_field() { # MEMBER KEY
  mdadm --examine "$1" | sed -n "s/^ *$2 : //p"
}

# bitmap_case LEVEL N DIRTY: a cairn array with 64K bitmap chunks; three writes through
# NBD dirty DIRTY chunks; a crash (SIGKILL) leaves exactly those bits for mdadm -X;
# the next start resyncs them and a clean stop leaves 0 dirty, events in step.
bitmap_case() {
  local level=$1 n=$2 want=$3 m uuid size chunk=()
  [ "$level" = 1 ] || chunk=(--chunk 64K)
  rm -f "$SHM"/d*.img
  MEMBERS=()
  for i in $(seq 0 $((n - 1))); do MEMBERS+=("$SHM/d$i.img"); done
  MD_LIST=$(IFS=,; echo "${MEMBERS[*]}")
  "$CAIRN" md create --json --level "$level" --raid-devices "$n" --size 32M --name "bm$level" \
    "${chunk[@]}" --bitmap-chunk 64K "${MEMBERS[@]}" >"$WORK/create.json" || fail "md create with a bitmap"
  uuid=$(py -c 'import json,sys; print(json.load(open(sys.argv[1]))["uuid"])' "$WORK/create.json")
  size=$(examine_field "${MEMBERS[0]}" "Used Dev Size" | cut -d' ' -f1)
  [ -n "$size" ] || size=$(examine_field "${MEMBERS[0]}" "Avail Dev Size" | cut -d' ' -f1)
  for m in "${MEMBERS[@]}"; do
    mdadm --examine "$m" >"$WORK/ex.txt"
    grep -q 'Feature Map : 0x1$' "$WORK/ex.txt" || fail "$m: feature map: $(cat "$WORK/ex.txt")"
    grep -q 'Internal Bitmap : 8 sectors from superblock' "$WORK/ex.txt" || fail "$m: no bitmap line"
    grep -q 'Checksum : .* - correct' "$WORK/ex.txt" || fail "$m: checksum"
    bitmap_x "$m"
    expect_eq "$X_MAGIC $X_UUID $X_CHUNK $X_DIRTY $X_STATE" "6d746962 $uuid 64 KB 0 OK" "$m: new bitmap"
    expect_eq "$X_SYNC" "$((size / 2))" "$m: sync size (KiB)"
    expect_eq "$X_BITS" "$(((size * 512 + 65535) / 65536))" "$m: bits"
  done

  # Safe mode off for the crash: the superblocks stay "active" from the first write, as
  # a crash in the middle of writing leaves them (with it on, 200 ms of idleness before
  # the kill would mark them clean, and no resync would be due).
  start_cairn --safe-mode-delay 0 --md "$MD_LIST:bm"
  nbdsh -u "$(unix_uri bm)" -c '
h.pwrite(b"\x5a" * 4096, 0)
h.pwrite(b"\xa5" * 4096, 1 << 20)
h.pwrite(b"\x3c" * 65536, 3 << 20)
h.flush()'
  stop_cairn KILL
  for m in "${MEMBERS[@]}"; do
    bitmap_x "$m"
    expect_eq "$X_DIRTY" "$want" "$m: dirty chunks after a crash"
    expect_eq "$X_EVENTS" "$(examine_field "$m" Events)" "$m: bitmap events = superblock events"
    expect_eq "$(examine_field "$m" State)" "active" "$m: superblock state after a crash"
  done

  # Restart: the resync covers the dirty chunks (its end is recorded in the
  # superblocks: clean); a clean stop then clears the bits.
  start_cairn --md "$MD_LIST:bm"
  for _ in $(seq 100); do
    [ "$(examine_field "${MEMBERS[0]}" State)" = clean ] && break
    sleep 0.1
  done
  expect_eq "$(examine_field "${MEMBERS[0]}" State)" clean "state once the resync is done"
  nbdsh -u "$(unix_uri bm)" -c '
assert h.pread(4096, 1 << 20) == b"\xa5" * 4096
assert h.pread(65536, 3 << 20) == b"\x3c" * 65536'
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
  for m in "${MEMBERS[@]}"; do
    bitmap_x "$m"
    expect_eq "$X_DIRTY" 0 "$m: dirty chunks after a clean stop"
    expect_eq "$X_EVENTS" "$(examine_field "$m" Events)" "$m: events after a clean stop"
    expect_eq "$(examine_field "$m" State)" "clean" "$m: superblock state after a clean stop"
    mdadm --examine "$m" | grep -q 'Checksum : .* - correct' || fail "$m: checksum after stop"
  done
  say "ok: raid$level x$n: $want dirty after a crash, 0 after a clean stop (uuid $uuid)"
}

# RAID5 x3, 64K chunk: a bit covers one 128K stripe row; writes at 0, 1M, 3M: rows 0, 8, 24.
# RAID1 x2: a bit covers 64K of the array: chunks 0, 16, 48.
t_bitmap() {
  need_root
  need_tool mdadm losetup
  command -v nbdsh >/dev/null || skip "nbdsh is not installed (python3-libnbd)"
  bitmap_case 5 3 3
  bitmap_case 1 2 3
  # No bitmap when asked for none; and none on RAID0 by default.
  rm -f "$SHM"/n*.img
  "$CAIRN" md create -l 5 -n 3 --size 16M --bitmap none "$SHM"/n{0,1,2}.img >/dev/null
  expect_eq "$(examine_field "$SHM/n0.img" "Feature Map")" "0x0" "--bitmap none"
  rm -f "$SHM"/n*.img
  "$CAIRN" md create -l 0 -n 2 --size 16M "$SHM"/n{0,1}.img >/dev/null
  expect_eq "$(examine_field "$SHM/n0.img" "Feature Map")" "0x1000" "raid0 has no bitmap"
  rm -f "$SHM"/n*.img
}

run_test create_examine_shapes t_create_examine
run_test raid6_nbd_degraded t_raid6_nbd
run_test raid5_nbd_degraded t_raid5_nbd
run_test bad_input t_bad_input
run_test bitmap_crash_and_clean_stop t_bitmap
run_test raid5_ext4_member_lost t_raid5_ext4
run_test raid6_ext4_member_lost t_raid6_ext4
finish
