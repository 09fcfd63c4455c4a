#!/usr/bin/env bash
# LVM2 through the cairn command against lvm 2.03 itself (verification.md §4): VGs cairn
# makes are read by pvck/pvs/vgs/lvs/vgcfgbackup on read-only loop devices; VGs lvm makes
# (activation off: no device-mapper here) are read by cairn with the same extents, and
# data cairn writes through an LV lands at the bytes lvm's metadata says (and the reverse);
# a VG lvm made and cairn changed is still read by lvm; damaged metadata gives a sentence
# naming the PV, and the other copy is used while one is valid; refusals change nothing;
# an LV on md RAID5 starts on a full stripe.
. "$(dirname "$0")/lib.sh"

export LVM_SUPPRESS_FD_WARNINGS=1
NOACT=(--config 'global{activation=0}')

# ro_loop FILE: a read-only loop device, released after the test.
ro_loop() {
  local l
  l=$(losetup -r -f --show "$1") || fail "losetup -r $1"
  register loop "$l"
  echo "$l"
}

rw_loop() {
  local l
  l=$(losetup -f --show "$1") || fail "losetup $1"
  register loop "$l"
  echo "$l"
}

# pvck_clean LOOP: pvck --dump headers exits 0 and reports no CHECK: line.
pvck_clean() {
  local outp rc=0
  outp=$(pvck --dump headers "$1" 2>&1) || rc=$?
  [ "$rc" = 0 ] || fail "pvck --dump headers $1 exited $rc: $outp"
  case $outp in *CHECK:*) fail "pvck --dump headers $1 complains: $outp" ;; esac
}

# lvm_reports VG DEVLIST OUTDIR: pvs/vgs/lvs of VG as JSON (bytes, no suffixes).
lvm_reports() {
  local vg=$1 devs=$2 o=$3
  pvs "${NOACT[@]}" --devices "$devs" --reportformat json --units b --nosuffix \
    -o pv_name,vg_name,pv_uuid,pe_start,pv_pe_count,pv_pe_alloc_count >"$o/pvs.json"
  vgs "${NOACT[@]}" --devices "$devs" --reportformat json --units b --nosuffix \
    -o vg_name,vg_uuid,vg_extent_size,vg_seqno,pv_count,lv_count,vg_free_count "$vg" >"$o/vgs.json"
  lvs "${NOACT[@]}" --devices "$devs" --reportformat json --units b --nosuffix -a \
    -o lv_name,segtype,seg_start_pe,seg_size_pe,stripes,stripe_size,seg_pe_ranges "$vg" >"$o/lvs.json"
}

# compare.py DIR LOOP=FILE,...: cairn's `vgs --json` against lvm's reports, loop devices
# mapped to the files behind them.
cat >"$WORK/compare.py" <<'PY'
import json, sys
d, mapping = sys.argv[1], dict(kv.split("=", 1) for kv in sys.argv[2].split(","))
lvm_pvs = json.load(open(f"{d}/pvs.json"))["report"][0]["pv"]
lvm_vg = json.load(open(f"{d}/vgs.json"))["report"][0]["vg"][0]
lvm_lvs = json.load(open(f"{d}/lvs.json"))["report"][0]["lv"]
cvg = json.load(open(f"{d}/cairn-vgs.json"))
def file_of(ranges):
    out = []
    for r in ranges.split():
        dev, rng = r.rsplit(":", 1)
        out.append(f"{mapping.get(dev, dev)}:{rng}")
    return " ".join(out)
assert lvm_vg["vg_name"] == cvg["name"], (lvm_vg, cvg["name"])
assert lvm_vg["vg_uuid"] == cvg["uuid"], (lvm_vg["vg_uuid"], cvg["uuid"])
assert int(lvm_vg["vg_extent_size"]) == cvg["extent_size"], lvm_vg
assert int(lvm_vg["vg_seqno"]) == cvg["seqno"], (lvm_vg["vg_seqno"], cvg["seqno"])
assert int(lvm_vg["pv_count"]) == cvg["pv_count"], lvm_vg
assert int(lvm_vg["lv_count"]) == cvg["lv_count"], lvm_vg
assert int(lvm_vg["vg_free_count"]) == cvg["free_count"], (lvm_vg, cvg["free_count"])
cpv = {p["name"]: p for p in cvg["pvs"]}
assert len(lvm_pvs) == len(cpv), (lvm_pvs, list(cpv))
for p in lvm_pvs:
    c = cpv[mapping[p["pv_name"]]]
    assert p["vg_name"] == cvg["name"], p
    assert p["pv_uuid"] == c["uuid"], (p, c["uuid"])
    assert int(p["pe_start"]) == c["pe_start"], (p, c["pe_start"])
    assert int(p["pv_pe_count"]) == c["pe_count"], (p, c["pe_count"])
    assert int(p["pv_pe_alloc_count"]) == c["pe_alloc"], (p, c["pe_alloc"])
lvm_segs = sorted(
    (l["lv_name"], int(l["seg_start_pe"]), int(l["seg_size_pe"]), int(l["stripes"]),
     int(l["stripe_size"]), file_of(l["seg_pe_ranges"]),
     "striped" if l["segtype"] == "linear" else l["segtype"])
    for l in lvm_lvs)
c_segs = sorted(
    (l["name"], s["start_extent"], s["extent_count"], s["stripes"], s["stripe_size"],
     s["seg_pe_ranges"], s["segtype"])
    for l in cvg["lvs"] for s in l["segments"])
assert lvm_segs == c_segs, f"\nlvm:   {lvm_segs}\ncairn: {c_segs}"
print(f"{len(c_segs)} segments agree")
PY

# place.py DIR LV DATA check|put LOOP=FILE,...: walks LV's bytes one stripe chunk at a time
# with dm-stripe's maths (ondisk-formats.md §4.5) from lvm's own reports, and checks that
# DATA is at those PV file offsets, or puts it there.
cat >"$WORK/place.py" <<'PY'
import json, sys
d, lv, data_path, mode = sys.argv[1:5]
m = dict(kv.split("=", 1) for kv in sys.argv[5].split(","))
pvs = {p["pv_name"]: int(p["pe_start"]) for p in json.load(open(f"{d}/pvs.json"))["report"][0]["pv"]}
es = int(json.load(open(f"{d}/vgs.json"))["report"][0]["vg"][0]["vg_extent_size"])
segs = [s for s in json.load(open(f"{d}/lvs.json"))["report"][0]["lv"] if s["lv_name"] == lv]
assert segs, f"no segments of {lv} in lvm's report"
data = open(data_path, "rb").read()
files = {}
def f(dev):
    if dev not in files:
        files[dev] = open(m[dev], "r+b")
    return files[dev]
done = 0
for s in segs:
    start = int(s["seg_start_pe"]) * es
    length = int(s["seg_size_pe"]) * es
    stripes = [(r.rsplit(":", 1)[0], int(r.rsplit(":", 1)[1].split("-")[0]))
               for r in s["seg_pe_ranges"].split()]
    k = len(stripes)
    z = int(s["stripe_size"]) if k > 1 else length
    for o in range(0, length, z):
        chunk = o // z
        dev, pe = stripes[chunk % k]
        at = pvs[dev] + pe * es + (chunk // k) * z
        fh = f(dev)
        fh.seek(at)
        want = data[start + o:start + o + z]
        if mode == "check":
            assert fh.read(z) == want, f"{lv}: LV bytes {start + o}.. are not at {m[dev]} byte {at}"
        else:
            fh.write(want)
        done += z
assert done == len(data), (done, len(data))
print(f"{lv}: {done} bytes at lvm's offsets")
PY

# cairn -> lvm: pvcreate/vgcreate/lvcreate (linear, striped, multi-segment) by cairn,
# checked by pvck, pvs, vgs, lvs and vgcfgbackup.
t_cairn_to_lvm() {
  need_root
  need_tool pvck pvs vgs lvs vgcfgbackup losetup
  local p0=$SHM/c0.img p1=$SHM/c1.img p2=$SHM/c2.img devs l0 l1 l2 l
  truncate -s 64M "$p0" "$p1" "$p2"
  devs="$p0,$p1,$p2"
  "$CAIRN" lvm pvcreate "$p0" "$p1" "$p2"
  "$CAIRN" lvm vgcreate -s 4M vgc "$p0" "$p1" "$p2"
  "$CAIRN" lvm lvcreate -n lin -L 20M --devices "$devs" vgc
  "$CAIRN" lvm lvcreate -n str -i 2 -I 64k -L 16M --devices "$devs" vgc
  # The PVs as arguments, as vgcreate takes them (lvm's --devices form above).
  "$CAIRN" lvm lvcreate -n other -L 8M vgc "$p0" "$p1" "$p2"
  "$CAIRN" lvm lvextend -L +8M vgc/lin "$p0" "$p1" "$p2"
  "$CAIRN" lvm lvcreate -n wide -i 3 -I 128k -l 6 --devices "$devs" vgc
  "$CAIRN" --json lvm vgs --devices "$devs" >"$WORK/cairn-vgs.json"
  l0=$(ro_loop "$p0"); l1=$(ro_loop "$p1"); l2=$(ro_loop "$p2")
  for l in "$l0" "$l1" "$l2"; do pvck_clean "$l"; done
  lvm_reports vgc "$l0,$l1,$l2" "$WORK"
  py "$WORK/compare.py" "$WORK" "$l0=$p0,$l1=$p1,$l2=$p2"
  # The multi-segment LV really has two segments.
  [ "$(lvs "${NOACT[@]}" --devices "$l0,$l1,$l2" --noheadings -o seg_start_pe vgc/lin | wc -l)" = 2 ] ||
    fail "vgc/lin should have 2 segments"
  # vgcfgbackup's text (indented, commented, trailer first) parses back to the same VG.
  vgcfgbackup "${NOACT[@]}" --devices "$l0,$l1,$l2" -f "$WORK/vgc.vg" vgc
  "$CAIRN" --json lvm vgcfg-parse "$WORK/vgc.vg" >"$WORK/parsed.json"
  py - "$WORK/parsed.json" "$WORK/cairn-vgs.json" "$l0=$p0,$l1=$p1,$l2=$p2" <<'PY'
import json, sys
p, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
m = dict(kv.split("=", 1) for kv in sys.argv[3].split(","))
assert (p["name"], p["uuid"], p["seqno"], p["extent_size"]) == \
    (c["name"], c["uuid"], c["seqno"], c["extent_size"]), (p, c)
def fix(r):
    return " ".join(f"{m.get(x.rsplit(':', 1)[0], x.rsplit(':', 1)[0])}:{x.rsplit(':', 1)[1]}"
                    for x in r.split())
ps = sorted((l["name"], s["start_extent"], s["extent_count"], s["stripes"], s["stripe_size"],
             fix(s["seg_pe_ranges"])) for l in p["lvs"] for s in l["segments"])
cs = sorted((l["name"], s["start_extent"], s["extent_count"], s["stripes"], s["stripe_size"],
             s["seg_pe_ranges"]) for l in c["lvs"] for s in l["segments"])
assert ps == cs, f"\nvgcfgbackup: {ps}\ncairn:       {cs}"
assert sorted(x["uuid"] for x in p["pvs"]) == sorted(x["uuid"] for x in c["pvs"])
print("vgcfgbackup parses back to the same VG")
PY
}

# lvm -> cairn: lvm makes the VG on loop devices; cairn reads the same extents, data it
# writes lands where lvm's metadata says and data put there is what cairn reads; a change
# cairn makes is read back by lvm.
t_lvm_to_cairn() {
  need_root
  need_tool pvcreate vgcreate lvcreate lvextend pvck lvs losetup
  local p0=$SHM/l0.img p1=$SHM/l1.img devs l0 l1 l
  truncate -s 64M "$p0" "$p1"
  devs="$p0,$p1"
  l0=$(rw_loop "$p0"); l1=$(rw_loop "$p1")
  pvcreate -q --devices "$l0,$l1" "$l0" "$l1"
  vgcreate -q --devices "$l0,$l1" vgl "$l0" "$l1"
  lvcreate -q "${NOACT[@]}" --devices "$l0,$l1" --zero n -n lin -L 20M vgl
  lvcreate -q "${NOACT[@]}" --devices "$l0,$l1" --zero n -n str -i 2 -I 64k -L 16M vgl
  lvextend -q "${NOACT[@]}" --devices "$l0,$l1" -L +8M vgl/lin
  lvm_reports vgl "$l0,$l1" "$WORK"
  losetup -d "$l0" "$l1"
  "$CAIRN" --json lvm vgs --devices "$devs" >"$WORK/cairn-vgs.json"
  py "$WORK/compare.py" "$WORK" "$l0=$p0,$l1=$p1"

  # Data written through cairn's exports of the LVs (serve --lvm) lands at lvm's
  # offsets; data put at lvm's offsets reads through them.
  random_file "$WORK/lin.data" 28M
  random_file "$WORK/str.data" 16M
  start_cairn --lvm "$devs"
  nbdcopy "$WORK/lin.data" "$(unix_uri vgl/lin)"
  nbdcopy "$WORK/str.data" "$(unix_uri vgl/str)"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn's exit status"
  py "$WORK/place.py" "$WORK" lin "$WORK/lin.data" check "$l0=$p0,$l1=$p1"
  py "$WORK/place.py" "$WORK" str "$WORK/str.data" check "$l0=$p0,$l1=$p1"
  random_file "$WORK/str2.data" 16M
  py "$WORK/place.py" "$WORK" str "$WORK/str2.data" put "$l0=$p0,$l1=$p1"
  start_cairn --read-only --lvm "$devs"
  nbdcopy "$(unix_uri vgl/str)" "$WORK/str2.back"
  stop_cairn
  cmp "$WORK/str2.data" "$WORK/str2.back" ||
    fail "cairn's read of vgl/str differs from what was put at lvm's offsets"

  # cairn changes lvm's VG; lvm reads the result.
  "$CAIRN" lvm lvcreate -n added -l 3 --devices "$devs" vgl
  "$CAIRN" lvm lvrename --devices "$devs" vgl str str2
  "$CAIRN" --json lvm vgs --devices "$devs" >"$WORK/cairn-vgs.json"
  l0=$(ro_loop "$p0"); l1=$(ro_loop "$p1")
  for l in "$l0" "$l1"; do pvck_clean "$l"; done
  lvm_reports vgl "$l0,$l1" "$WORK"
  py "$WORK/compare.py" "$WORK" "$l0=$p0,$l1=$p1"
  py "$WORK/place.py" "$WORK" str2 "$WORK/str2.data" check "$l0=$p0,$l1=$p1"
}

# flip_text FILE: flips a byte inside the committed metadata text of a PV file.
flip_text() {
  py - "$1" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4096); h = f.read(512)
    off, size = struct.unpack_from("<QQ", h, 40)
    f.seek(4096 + off + 40); b = f.read(1)
    f.seek(4096 + off + 40); f.write(bytes([b[0] ^ 0x20]))
PY
}

# Damaged metadata: one bad copy is named and the other used; all bad is a sentence naming
# each PV; a syntax error (with valid checksums) names the PV and the line.
t_corrupt_metadata() {
  local p0=$SHM/x0.img p1=$SHM/x1.img p2=$SHM/y0.img devs err rc
  truncate -s 32M "$p0" "$p1" "$p2"
  devs="$p0,$p1"
  "$CAIRN" lvm vgcreate vgx "$p0" "$p1" >/dev/null
  "$CAIRN" lvm lvcreate -n a -L 8M --devices "$devs" vgx >/dev/null
  flip_text "$p0"
  err=$("$CAIRN" lvm lvs --devices "$devs" 2>&1 >"$WORK/lvs.txt") || fail "one bad copy: $err"
  expect_contains "$err" "$p0" "warning about the bad copy"
  expect_contains "$err" "checksum" "warning about the bad copy"
  expect_contains "$(cat "$WORK/lvs.txt")" "a " "lvs from the good copy"
  # A change rewrites both copies; then both are good again.
  "$CAIRN" lvm lvcreate -n b -L 4M --devices "$devs" vgx >/dev/null
  err=$("$CAIRN" lvm lvs --devices "$devs" 2>&1 >/dev/null)
  [ -z "$err" ] || fail "after a rewrite there should be no warning: $err"
  flip_text "$p0"
  flip_text "$p1"
  rc=0; err=$("$CAIRN" lvm lvs --devices "$devs" 2>&1) || rc=$?
  [ "$rc" != 0 ] || fail "all copies bad but lvs succeeded"
  expect_contains "$err" "cairn: no valid VG metadata" "error"
  expect_contains "$err" "$p0" "error naming the first PV"
  expect_contains "$err" "$p1" "error naming the second PV"
  [ "$(echo "$err" | wc -l)" = 1 ] || fail "the error should be one line: $err"
  # A syntax error behind valid checksums names the PV and the line.
  "$CAIRN" lvm vgcreate vgy "$p2" >/dev/null
  py - "$p2" <<'PY'
import struct, sys, zlib
def crc(b):  # lvm's calc_crc via zlib (ondisk-formats.md §4.4)
    return zlib.crc32(b, 0xf597a6cf ^ 0xffffffff) ^ 0xffffffff
with open(sys.argv[1], "r+b") as f:
    f.seek(4096); h = bytearray(f.read(512))
    off, size = struct.unpack_from("<QQ", h, 40)
    f.seek(4096 + off); t = bytearray(f.read(size))
    i = t.index(b"seqno = ")
    t[i:i + 8] = b"seqno   "
    f.seek(4096 + off); f.write(t)
    struct.pack_into("<I", h, 56, crc(bytes(t)))
    struct.pack_into("<I", h, 0, crc(bytes(h[4:])))
    f.seek(4096); f.write(h)
PY
  rc=0; err=$("$CAIRN" lvm vgs --devices "$p2" 2>&1) || rc=$?
  [ "$rc" != 0 ] || fail "a syntax error was accepted"
  expect_contains "$err" "metadata on $p2, line 3: expected '=' after 'seqno'" "syntax error"
  # lvm itself agrees the text is broken (its parser, not its checksum).
  if command -v pvck >/dev/null && [ "$(id -u)" = 0 ]; then
    local l
    l=$(ro_loop "$p2")
    rc=0; pvck --dump metadata "$l" >/dev/null 2>&1 || rc=$?
    say "pvck --dump metadata on the edited PV exited $rc"
  fi
}

# Refusals: each a sentence and a non-zero exit, nothing changed.
t_refusals() {
  local p0=$SHM/r0.img p1=$SHM/r1.img devs err rc before
  truncate -s 32M "$p0" "$p1"
  devs="$p0,$p1"
  "$CAIRN" lvm vgcreate vgr "$p0" "$p1" >/dev/null
  "$CAIRN" lvm lvcreate -n a -L 12M --devices "$devs" vgr >/dev/null
  before=$(sha256sum "$p0" "$p1")
  rc=0; err=$("$CAIRN" lvm lvreduce -L -4M --devices "$devs" vgr/a 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "lvreduce without -f exited $rc"
  expect_contains "$err" "would discard the data in its last 1 extents" "lvreduce refusal"
  expect_contains "$err" "-f" "lvreduce refusal"
  rc=0; err=$("$CAIRN" lvm lvcreate -n s -i 3 -l 3 --devices "$devs" vgr 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "3 stripes on 2 PVs exited $rc"
  expect_contains "$err" "3 stripes need 3 PVs" "stripe refusal"
  rc=0; err=$("$CAIRN" lvm lvcreate -n 'bad/name' -l 1 --devices "$devs" vgr 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "bad LV name exited $rc"
  expect_contains "$err" "invalid LV name" "name refusal"
  rc=0; err=$("$CAIRN" lvm lvs --devices "$p0" 2>&1) || rc=$?
  [ "$rc" = 0 ] || fail "lvs with a PV missing should show what it can: $err"
  rc=0; err=$("$CAIRN" lvm lvcreate -n c -l 1 --devices "$p0" vgr 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "lvcreate with a PV missing exited $rc"
  expect_contains "$err" "missing PV pv1" "missing PV"
  expect_contains "$err" "$p1" "missing PV's device hint"
  rc=0; err=$("$CAIRN" lvm pvcreate "$p0" 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "pvcreate over a PV exited $rc"
  expect_contains "$err" "already an LVM2 physical volume in VG vgr" "pvcreate refusal"
  expect_eq "$(sha256sum "$p0" "$p1")" "$before" "PV files after refused commands"
}

# LVM on md RAID5 (4 members, 64K chunks): pe_start is a multiple of the 192K full stripe
# (3 MiB = LCM(1 MiB, 192K)), and data round-trips through LV -> PV -> array -> members.
t_on_md() {
  local m="$SHM/m0.img,$SHM/m1.img,$SHM/m2.img,$SHM/m3.img"
  truncate -s 32M "$SHM/m0.img" "$SHM/m1.img" "$SHM/m2.img" "$SHM/m3.img"
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 4 \
    "$SHM/m0.img" "$SHM/m1.img" "$SHM/m2.img" "$SHM/m3.img" >/dev/null
  "$CAIRN" lvm vgcreate vgm --md "$m" >/dev/null
  "$CAIRN" lvm lvcreate -n data -l 4 --md "$m" vgm >/dev/null
  "$CAIRN" --json lvm pvs --md "$m" >"$WORK/pvs.json"
  py - "$WORK/pvs.json" <<'PY'
import json, sys
(p,) = json.load(open(sys.argv[1]))["pvs"]
assert p["pe_start"] == 3 << 20 and p["pe_start"] % (192 << 10) == 0, p
print("pe_start", p["pe_start"])
PY
  random_file "$WORK/d.data" 16M
  start_cairn --md "$m" --lvm
  nbdcopy "$WORK/d.data" "$(unix_uri vgm/data)"
  nbdcopy "$(unix_uri vgm/data)" "$WORK/d.back"
  stop_cairn
  # 4 extents of 12 MiB: vgcreate raised lvm's 4 MiB to a multiple of the 192K stripe.
  expect_eq "$(stat -c %s "$WORK/d.back")" $((48 << 20)) "size of vgm/data (4 x 12 MiB extents)"
  cmp -n $((16 << 20)) "$WORK/d.data" "$WORK/d.back" || fail "LV on md read back differs"
}

# Crash states of metadata commits, as lvm sees them: the Rust crash test writes the first
# crash state of every instant of lv_create, lv_extend, lv_remove and vgextend as PV files
# with the state cairn read from them; lvm's vgs and lvs, on read-only loop devices over
# each set, must read the same seqno and the same LVs (so old or new, never neither).
t_crash_states_lvm_agrees() {
  need_root
  need_tool vgs lvs losetup cargo
  local dir=$SHM/crash d f l loops devs want got n=0
  mkdir -p "$dir"
  (cd "$REPO" && CAIRN_LVM_CRASH_DIR=$dir cargo test -q -p cairn-lvm --test crash) >"$WORK/crash-test.log" 2>&1 ||
    { cat "$WORK/crash-test.log"; fail "the crash test failed"; }
  grep -m1 'seed' "$WORK/crash-test.log" || true
  for d in "$dir"/*/; do
    loops=()
    for f in "$d"pv*.img; do
      l=$(losetup -r -f --show "$f") || fail "losetup -r $f"
      loops+=("$l")
    done
    devs=$(IFS=,; echo "${loops[*]}")
    got=$(vgs --devices "$devs" "${NOACT[@]}" --noheadings -o vg_seqno vg 2>"$WORK/vgs.err" | tr -d ' ')
    got="$got $(lvs --devices "$devs" "${NOACT[@]}" -a --noheadings -o lv_name vg 2>>"$WORK/vgs.err" |
      tr -d ' ' | sort | paste -sd, -)"
    losetup -d "${loops[@]}"
    want=$(cat "$d/expect")
    [ "$got" = "$want" ] || {
      cat "$WORK/vgs.err"
      fail "crash state $(basename "$d"): lvm reads '$got', cairn read '$want'"
    }
    n=$((n + 1))
  done
  [ "$n" -ge 20 ] || fail "only $n crash states were checked"
  echo "NOTE: $n crash states: lvm and cairn read the same metadata"
  rm -rf "$dir"
}

# Signatures other tools left (mkfs.ext4, mkfs.xfs, mkswap, sfdisk with a DOS and a GPT
# table): pvcreate, vgcreate and vgextend refuse each with its name, exit non-zero and
# leave the file as it was; -y (lvm's answer) or -f goes ahead, and the old signature is
# gone (blkid's view: cairn's own probe through `cairn scan` sees only the PV).
t_wipe_signatures() {
  local f err rc before kind made
  need_tool mkfs.ext4
  need_tool mkfs.xfs
  need_tool mkswap
  need_tool sfdisk
  for kind in ext4 xfs swap dos gpt; do
    f=$SHM/sig-$kind.img
    rm -f "$f"
    truncate -s 320M "$f"
    case $kind in
      ext4) mkfs.ext4 -q -F -L home -U 0b6f1c8e-2f6a-4b9e-9d0e-3c1a2b4d5e6f "$f" ;;
      xfs) mkfs.xfs -q -f -L media -m uuid=5d2e3f4a-1b2c-4d3e-8f9a-0b1c2d3e4f5a "$f" ;;
      swap) mkswap -q -L sw -U 7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d "$f" >/dev/null ;;
      dos) printf 'label: dos\n,100M,83\n,,83\n' | sfdisk -q "$f" >/dev/null ;;
      gpt) printf 'label: gpt\n,100M\n,\n' | sfdisk -q "$f" >/dev/null ;;
    esac || fail "making $kind on $f"
    before=$(sha256sum "$f")
    case $kind in
      ext4) made='holds an ext4 filesystem (label "home", UUID 0b6f1c8e-2f6a-4b9e-9d0e-3c1a2b4d5e6f)' ;;
      xfs) made='holds an XFS filesystem (label "media", UUID 5d2e3f4a-1b2c-4d3e-8f9a-0b1c2d3e4f5a)' ;;
      swap) made='holds a swap area (label "sw", UUID 7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d)' ;;
      dos) made='holds an MBR partition table (2 partitions)' ;;
      gpt) made='holds a GPT partition table (2 partitions)' ;;
    esac
    rc=0; err=$("$CAIRN" lvm pvcreate "$f" 2>&1) || rc=$?
    [ "$rc" != 0 ] || fail "pvcreate over $kind exited 0: $err"
    expect_contains "$err" "cairn: $f $made" "pvcreate over $kind"
    expect_contains "$err" "--force" "pvcreate over $kind"
    rc=0; err=$("$CAIRN" lvm vgcreate vgs$kind "$f" 2>&1) || rc=$?
    [ "$rc" != 0 ] || fail "vgcreate over $kind exited 0: $err"
    expect_contains "$err" "$f $made" "vgcreate over $kind"
    expect_eq "$(sha256sum "$f")" "$before" "$kind file after the refusals"
    if [ "$kind" = ext4 ] || [ "$kind" = gpt ]; then
      "$CAIRN" lvm pvcreate -y "$f" >/dev/null || fail "pvcreate -y over $kind"
    else
      "$CAIRN" lvm pvcreate --force "$f" >/dev/null || fail "pvcreate --force over $kind"
    fi
    if command -v blkid >/dev/null; then
      expect_eq "$(blkid -p -o value -s TYPE "$f" 2>/dev/null || true)" "LVM2_member" \
        "blkid's view of the $kind file after pvcreate -y"
    fi
    expect_contains "$("$CAIRN" lvm pvs "$f" 2>&1)" "$f" "pvs after pvcreate over $kind"
  done
  # vgcreate and vgextend make PVs of unlabelled devices: refused the same way, -y goes on.
  local a=$SHM/sig-a.img b=$SHM/sig-b.img
  truncate -s 64M "$a" "$b"
  mkfs.ext4 -q -F -L data "$a"
  before=$(sha256sum "$a")
  rc=0; err=$("$CAIRN" lvm vgcreate vgw "$a" "$b" 2>&1) || rc=$?
  [ "$rc" != 0 ] || fail "vgcreate over ext4 exited 0"
  expect_contains "$err" "$a holds an ext4 filesystem (label \"data\"" "vgcreate refusal"
  expect_eq "$(sha256sum "$a")" "$before" "ext4 file after the vgcreate refusal"
  "$CAIRN" lvm vgcreate vgw "$b" >/dev/null
  rc=0; err=$("$CAIRN" lvm vgextend vgw "$a" --devices "$b" 2>&1) || rc=$?
  [ "$rc" != 0 ] || fail "vgextend over ext4 exited 0"
  expect_contains "$err" "$a holds an ext4 filesystem" "vgextend refusal"
  expect_eq "$(sha256sum "$a")" "$before" "ext4 file after the vgextend refusal"
  "$CAIRN" lvm vgextend -y vgw "$a" --devices "$b" >/dev/null || fail "vgextend -y"
  expect_contains "$("$CAIRN" lvm vgs --devices "$a,$b" 2>&1)" "vgw" "vgs after vgextend -y"
  rm -f "$SHM"/sig-*.img
}

# craft_pe_start FILE SECTORS: every "pe_start = N" in FILE's committed metadata becomes
# SECTORS, the text's size and both checksums recomputed (as someone crafting it would).
craft_pe_start() {
  py - "$1" "$2" <<'PY'
import re, struct, sys, zlib
def crc(b):  # lvm's calc_crc via zlib (ondisk-formats.md §4.4)
    return zlib.crc32(b, 0xf597a6cf ^ 0xffffffff) ^ 0xffffffff
with open(sys.argv[1], "r+b") as f:
    f.seek(4096); h = bytearray(f.read(512))
    off, size = struct.unpack_from("<QQ", h, 40)
    f.seek(4096 + off); t = f.read(size)
    new, n = re.subn(rb"pe_start = \d+", b"pe_start = " + sys.argv[2].encode(), t)
    assert n >= 1, t
    f.seek(4096 + off); f.write(new)
    struct.pack_into("<QI", h, 48, len(new), crc(new))
    struct.pack_into("<I", h, 0, crc(bytes(h[4:])))
    f.seek(4096); f.write(h)
PY
}

# Crafted metadata whose pe_start (0, 8 or 1024 sectors) puts the first extents over the
# PV label or inside the metadata area: `serve --lvm` refuses with the PV and the overlap
# named, and nothing is written to any PV (before, a write to the first LV wiped the
# label and the VG metadata of every PV).
t_pe_start_overlap() {
  local p0=$SHM/o0.img p1=$SHM/o1.img devs err rc before sectors
  for sectors in 0 8 1024; do
    rm -f "$p0" "$p1"
    truncate -s 32M "$p0" "$p1"
    devs="$p0,$p1"
    "$CAIRN" lvm vgcreate vgo "$p0" "$p1" >/dev/null
    "$CAIRN" lvm lvcreate -n first -L 8M --devices "$devs" vgo >/dev/null
    craft_pe_start "$p0" "$sectors"
    craft_pe_start "$p1" "$sectors"
    before=$(sha256sum "$p0" "$p1")
    rc=0
    err=$(timeout 60 "$CAIRN" serve --listen "unix:$WORK/o.sock" --lvm "$devs" 2>&1) || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "serve --lvm with pe_start $sectors: exit $rc: $err"
    expect_contains "$err" "the VG metadata puts the PV's extents at bytes $((sectors * 512)).." \
      "serve --lvm refusal (pe_start $sectors)"
    expect_contains "$err" "(pe_start $sectors sectors), over its" "serve --lvm refusal (pe_start $sectors)"
    expect_contains "$err" "$p0" "serve --lvm refusal names the PV (pe_start $sectors)"
    rc=0; err=$("$CAIRN" lvm lvs --devices "$devs" 2>&1) || rc=$?
    [ "$rc" != 0 ] || fail "lvs with pe_start $sectors exited 0"
    expect_eq "$(sha256sum "$p0" "$p1")" "$before" "PV files after the refusals (pe_start $sectors)"
  done
}

run_test cairn_to_lvm t_cairn_to_lvm
run_test lvm_to_cairn t_lvm_to_cairn
run_test corrupt_metadata t_corrupt_metadata
run_test refusals t_refusals
run_test on_md t_on_md
run_test crash_states_lvm_agrees t_crash_states_lvm_agrees
run_test wipe_signatures t_wipe_signatures
run_test pe_start_overlap t_pe_start_overlap
finish
