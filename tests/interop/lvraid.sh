#!/usr/bin/env bash
# LVM RAID LVs against lvm 2.03 (verification.md §4; activation off, no device-mapper):
# RAID LVs cairn makes are read by lvs/vgcfgbackup/pvck, and their metadata LVs hold
# dm-raid's superblock; RAID LVs lvm's metadata describes (written through vgcfgrestore,
# since lvm cannot create them without device-mapper) are served by cairn with the data
# from where md's layout over the image sub-LVs puts it, whole and with a PV missing; and
# fio verifies through an NBD-served raid10 LV with one PV missing.
. "$(dirname "$0")/lib.sh"

export LVM_SUPPRESS_FD_WARNINGS=1
NOACT=(--config 'global{activation=0}')

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

# cairn's raid1/raid10/raid5/raid6 LVs, read by lvm.
t_lvm_reads_cairn_raid() {
  need_root
  need_tool lvs vgcfgbackup pvck losetup
  local p=() l=() i devs loops
  for i in 0 1 2 3 4; do p[$i]=$SHM/c$i.img; done
  truncate -s 64M "${p[@]}"
  devs=$(IFS=,; echo "${p[*]}")
  "$CAIRN" lvm vgcreate vgc "${p[@]}" >/dev/null
  "$CAIRN" lvm lvcreate --type raid1 -m 1 -n mir -L 8M --devices "$devs" vgc
  "$CAIRN" lvm lvcreate --type raid10 -m 1 -i 2 -I 64k -n r10 -L 16M --devices "$devs" vgc
  "$CAIRN" lvm lvcreate --type raid5 -i 3 -n r5 -L 12M --nosync --devices "$devs" vgc
  "$CAIRN" lvm lvcreate --type raid6 -i 3 -I 128k -n r6 -L 12M --devices "$devs" vgc
  local before rc=0 err
  "$CAIRN" lvm lvs --devices "$devs" | tee "$WORK/cairn-lvs.txt"
  expect_contains "$(cat "$WORK/cairn-lvs.txt")" "[r10_rimage_3]" "cairn lvs -a"
  expect_contains "$(cat "$WORK/cairn-lvs.txt")" "Cpy%Sync" "cairn lvs sync column"
  # Seven images cannot go on five PVs: refused, nothing written.
  before=$(sha256sum "${p[@]}")
  rc=0; err=$("$CAIRN" lvm lvcreate --type raid6 -i 5 -n no -L 4M --devices "$devs" vgc 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "raid6 with 7 images on 5 PVs exited $rc"
  expect_contains "$err" "7 different PVs" "allocation refusal"
  expect_eq "$(sha256sum "${p[@]}")" "$before" "PV files after the refusal"
  for i in 0 1 2 3 4; do l[$i]=$(ro_loop "${p[$i]}"); done
  loops=$(IFS=,; echo "${l[*]}")
  for i in 0 1 2 3 4; do
    pvck --dump headers "${l[$i]}" >"$WORK/pvck.txt" 2>&1 || fail "pvck ${l[$i]}: $(cat "$WORK/pvck.txt")"
    grep -q CHECK: "$WORK/pvck.txt" && fail "pvck ${l[$i]} complains: $(cat "$WORK/pvck.txt")"
  done
  lvs "${NOACT[@]}" --devices "$loops" --reportformat json --units b --nosuffix -a \
    -o lv_name,segtype,stripes,stripe_size,devices,region_size,seg_pe_ranges vgc >"$WORK/lvs.json" ||
    fail "lvs -a failed"
  vgcfgbackup "${NOACT[@]}" --devices "$loops" -f "$WORK/vgc.vg" vgc || fail "vgcfgbackup failed"
  expect_contains "$(cat "$WORK/vgc.vg")" 'type = "raid10"' "vgcfgbackup text"
  expect_contains "$(cat "$WORK/vgc.vg")" '"r10_rmeta_0", "r10_rimage_0"' "vgcfgbackup raids"
  py - "$WORK/lvs.json" "$loops" "$devs" <<'PY'
import json, struct, sys
lvs = {l["lv_name"]: l for l in json.load(open(sys.argv[1]))["report"][0]["lv"]}
files = dict(zip(sys.argv[2].split(","), sys.argv[3].split(",")))
want = {"mir": ("raid1", 2, 0), "r10": ("raid10", 4, 65536), "r5": ("raid5_ls", 4, 65536),
        "r6": ("raid6_zr", 5, 131072)}
for name, (segtype, stripes, ssize) in want.items():
    l = lvs[name]
    assert l["segtype"] == segtype, l
    assert int(l["stripes"]) == stripes, l
    assert int(l["stripe_size"]) == ssize, l
    assert int(l["region_size"]) == 2 << 20, l
    imgs = [f"{name}_rimage_{i}" for i in range(stripes)]
    assert l["devices"] == ",".join(f"{i}(0)" for i in imgs), l
    # Each image and its metadata LV on one PV; the images on distinct PVs.
    pvs = set()
    for i in range(stripes):
        img, meta = lvs[f"[{name}_rimage_{i}]"], lvs[f"[{name}_rmeta_{i}]"]
        dev = img["devices"].split("(")[0]
        assert meta["devices"].split("(")[0] == dev, (img, meta)
        pvs.add(dev)
        # The metadata LV starts with dm-raid's superblock, md's bitmap at 4 KiB.
        first = int(meta["devices"].split("(")[1].rstrip(")"))
        with open(files[dev], "rb") as f:
            f.seek((1 << 20) + first * (4 << 20))
            sb = f.read(8192)
        magic, compat, ndev, pos = struct.unpack_from("<4sIII", sb, 0)
        assert magic == b"DmRd", (name, i, sb[:16])
        assert (compat, ndev, pos) == (1, stripes, i), (name, i, compat, ndev, pos)
        assert sb[4096:4100] == b"bitm", (name, i)
    assert len(pvs) == stripes, (name, pvs)
print("lvm sees cairn's RAID LVs as written")
PY
}

# make_vg_text IN OUT: adds to lvm's backup text a raid1 LV "m" (2 images, pv0 and pv1)
# and a raid10 LV "t" (4 images, 64K stripes, pv0..pv3), each image 2 extents after its
# 1-extent metadata LV, after the extents lvm's own LVs use; and a legacy mirror "o".
make_vg_text() {
  py - "$1" "$2" <<'PY'
import sys
t = open(sys.argv[1]).read()
n = [0]
def uid():
    n[0] += 1
    return "rAiD%02d-aaaa-bbbb-cccc-dddd-eeee-ffffff" % n[0]
def lv(name, status, seg):
    return (f'\n{name} {{\nid = "{uid()}"\nstatus = [{", ".join(chr(34)+s+chr(34) for s in status)}]\n'
            f'flags = []\nsegment_count = 1\n\nsegment1 {{\nstart_extent = 0\n{seg}}}\n}}\n')
def lin(pv, pe, count):
    return f'extent_count = {count}\n\ntype = "striped"\nstripe_count = 1\n\nstripes = [\n"{pv}", {pe}\n]\n'
lvs = ""
def raid(name, segtype, pvs, extents, per, extra):
    global lvs
    pairs = ",\n".join(f'"{name}_rmeta_{i}", "{name}_rimage_{i}"' for i in range(len(pvs)))
    lvs += lv(name, ["READ", "WRITE", "VISIBLE"],
              f'extent_count = {extents}\n\ntype = "{segtype}"\ndevice_count = {len(pvs)}\n'
              f'{extra}region_size = 4096\n\nraids = [\n{pairs}\n]\n')
    for i, (pv, pe) in enumerate(pvs):
        lvs += lv(f"{name}_rmeta_{i}", ["READ", "WRITE"], lin(pv, pe, 1))
        lvs += lv(f"{name}_rimage_{i}", ["READ", "WRITE"], lin(pv, pe + 1, per))
# pv0/pv1 start with lvm's own LV "lin" (2 extents on pv0): start the RAID LVs at 4.
raid("m", "raid1", [("pv0", 4), ("pv1", 4)], 2, 2, "")
raid("t", "raid10", [("pv0", 7), ("pv1", 7), ("pv2", 0), ("pv3", 0)], 4, 2,
     "data_copies = 2\nstripe_size = 128\n")
# A legacy mirror (core log) "o" over pv2/pv3 extents 3-4.
lvs += lv("o", ["READ", "WRITE", "VISIBLE"],
          'extent_count = 2\n\ntype = "mirror"\nmirror_count = 2\nregion_size = 1024\n\n'
          'mirrors = [\n"o_mimage_0", 0,\n"o_mimage_1", 0\n]\n')
lvs += lv("o_mimage_0", ["READ", "WRITE"], lin("pv2", 3, 2))
lvs += lv("o_mimage_1", ["READ", "WRITE"], lin("pv3", 3, 2))
i = t.index("\n\tlogical_volumes {")
j = t.index("\n\t}\n", i)
t = t[:j] + lvs + t[j:]
open(sys.argv[2], "w").write(t)
PY
}

# place.py DIR LV DATA put|check: the raid1 LV "m" is the same bytes on both images; the
# raid10 LV "t" (near 2 over 4 images, 64K chunks) puts array chunk c on images 2c%4 and
# 2c%4+1 at row 2c//4. Offsets from lvm's lvs report (loop devices -> files).
cat >"$WORK/place.py" <<'PY'
import json, sys
d, lv, data_path, mode, mapping = sys.argv[1:6]
files = dict(kv.split("=", 1) for kv in mapping.split(","))
lvs = {l["lv_name"].strip("[]"): l for l in json.load(open(f"{d}/lvs.json"))["report"][0]["lv"]}
def where(img):
    dev, pe = lvs[img]["devices"].rstrip(")").split("(")
    return files[dev], (1 << 20) + int(pe) * (4 << 20)
data = open(data_path, "rb").read()
pieces = []
if lv in ("m", "o"):
    for i in range(2):
        f, off = where(f"m_rimage_{i}" if lv == "m" else f"o_mimage_{i}")
        pieces.append((f, off, data))
else:
    z = 64 << 10
    for c in range(len(data) // z):
        for k in range(2):
            img = (2 * c) % 4 + k
            row = (2 * c) // 4
            f, off = where(f"t_rimage_{img}")
            pieces.append((f, off + row * z, data[c * z:(c + 1) * z]))
for f, off, b in pieces:
    with open(f, "r+b") as fh:
        fh.seek(off)
        if mode == "put":
            fh.write(b)
        elif fh.read(len(b)) != b:
            sys.exit(f"{lv}: data differs at {f}:{off}")
PY

# lvm's metadata for raid1 and raid10 LVs (vgcfgrestore): cairn serves the data from
# where the images are, whole and with one PV missing.
t_cairn_reads_lvm_raid() {
  need_root
  need_tool pvcreate vgcreate lvcreate vgcfgbackup vgcfgrestore lvs losetup nbdcopy
  local p=() l=() i devs loops map
  for i in 0 1 2 3; do p[$i]=$SHM/l$i.img; done
  truncate -s 64M "${p[@]}"
  for i in 0 1 2 3; do l[$i]=$(rw_loop "${p[$i]}"); done
  loops=$(IFS=,; echo "${l[*]}")
  map="${l[0]}=${p[0]},${l[1]}=${p[1]},${l[2]}=${p[2]},${l[3]}=${p[3]}"
  pvcreate -q --devices "$loops" "${l[@]}"
  vgcreate -q --devices "$loops" vgl "${l[@]}"
  lvcreate -q "${NOACT[@]}" --devices "$loops" --zero n -n lin -L 8M vgl "${l[0]}"
  vgcfgbackup "${NOACT[@]}" --devices "$loops" -f "$WORK/vgl.vg" vgl
  make_vg_text "$WORK/vgl.vg" "$WORK/vgl-raid.vg"
  vgcfgrestore "${NOACT[@]}" --devices "$loops" --force -f "$WORK/vgl-raid.vg" vgl ||
    fail "vgcfgrestore of the RAID text failed"
  lvs "${NOACT[@]}" --devices "$loops" --reportformat json -a -o lv_name,segtype,devices vgl \
    >"$WORK/lvs.json"
  expect_contains "$(cat "$WORK/lvs.json")" '"segtype":"raid10"' "lvm took the raid10 LV"
  expect_contains "$(cat "$WORK/lvs.json")" '"segtype":"mirror"' "lvm took the mirror LV"
  for i in 0 1 2 3; do losetup -d "${l[$i]}"; done
  random_file "$WORK/m.data" 8M
  random_file "$WORK/o.data" 8M
  random_file "$WORK/t.data" 16M
  py "$WORK/place.py" "$WORK" m "$WORK/m.data" put "$map"
  py "$WORK/place.py" "$WORK" o "$WORK/o.data" put "$map"
  py "$WORK/place.py" "$WORK" t "$WORK/t.data" put "$map"
  devs=$(IFS=,; echo "${p[*]}")
  "$CAIRN" lvm lvs --devices "$devs"
  start_cairn --read-only --lvm "$devs"
  nbdcopy "$(unix_uri vgl/m)" "$WORK/m.back"
  nbdcopy "$(unix_uri vgl/t)" "$WORK/t.back"
  nbdcopy "$(unix_uri vgl/o)" "$WORK/o.back"
  stop_cairn
  cmp "$WORK/o.data" "$WORK/o.back" || fail "mirror LV read differs"
  cmp "$WORK/m.data" "$WORK/m.back" || fail "raid1 LV read differs"
  cmp "$WORK/t.data" "$WORK/t.back" || fail "raid10 LV read differs"
  # pv1 missing: raid1 reads image 0, raid10 reads the copies on images 0, 2, 3.
  start_cairn --read-only --lvm "${p[0]},${p[2]},${p[3]}"
  expect_contains "$(cat "$CAIRN_LOG")" "DEGRADED" "degraded warning"
  nbdcopy "$(unix_uri vgl/m)" "$WORK/m.back2"
  nbdcopy "$(unix_uri vgl/t)" "$WORK/t.back2"
  stop_cairn
  cmp "$WORK/m.data" "$WORK/m.back2" || fail "degraded raid1 LV read differs"
  cmp "$WORK/t.data" "$WORK/t.back2" || fail "degraded raid10 LV read differs"
  # Writes through cairn land on both copies where lvm's metadata says.
  random_file "$WORK/t2.data" 16M
  start_cairn --lvm "$devs"
  nbdcopy "$WORK/t2.data" "$(unix_uri vgl/t)"
  stop_cairn
  py "$WORK/place.py" "$WORK" t "$WORK/t2.data" check "$map"
}

# fio verify through an NBD-served raid10 LV (4 images, 2 copies) with one PV missing; then the PV
# comes back: its stale image is recorded as failed and not read, and the data fio
# wrote verifies again.
t_raid10_fio_degraded() {
  need_tool fio
  local p=() i devs less
  for i in 0 1 2 3; do p[$i]=$SHM/f$i.img; done
  truncate -s 128M "${p[@]}"
  devs=$(IFS=,; echo "${p[*]}")
  "$CAIRN" lvm vgcreate vgf "${p[@]}" >/dev/null
  "$CAIRN" lvm lvcreate --type raid10 -m 1 -i 2 -I 64k -n r10 -L 192M --devices "$devs" vgf
  less="${p[0]},${p[2]},${p[3]}"
  start_cairn --lvm "$less"
  expect_contains "$(cat "$CAIRN_LOG")" "DEGRADED" "degraded warning"
  timeout 300 fio --output-format=terse --terse-version=3 --ioengine=nbd --uri="$(unix_uri vgf/r10)" \
    --name=deg --rw=randwrite --bs=4k --iodepth=32 --size=96M --verify=crc32c --verify_state_save=0 \
    --do_verify=1 --verify_fatal=1 >"$WORK/fio.out" 2>&1 || { cat "$WORK/fio.out"; fail "fio degraded"; }
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn's exit status"
  start_cairn --read-only --lvm "$devs"
  timeout 300 fio --output-format=terse --terse-version=3 --ioengine=nbd --uri="$(unix_uri vgf/r10)" \
    --name=deg --rw=randwrite --bs=4k --iodepth=32 --size=96M --verify=crc32c --verify_state_save=0 \
    --verify_only=1 --verify_fatal=1 >"$WORK/fio2.out" 2>&1 || { cat "$WORK/fio2.out"; fail "fio verify after the PV returned"; }
  expect_contains "$(cat "$CAIRN_LOG")" "DEGRADED" "the stale image stays out"
  stop_cairn
}

# lvconvert --repair after a PV is lost for good (written degraded first): the image moves
# to the spare PV, is rebuilt with progress, and the LV serves whole without the lost PV;
# --replace with no PV left to take an image is refused and changes nothing.
t_lvconvert_repair() {
  need_tool nbdcopy
  local p=() i devs less out before rc=0 err
  for i in 0 1 2 3 4; do p[$i]=$SHM/r$i.img; done
  truncate -s 64M "${p[@]}"
  devs=$(IFS=,; echo "${p[*]}")
  "$CAIRN" lvm vgcreate vgx "${p[@]}" >/dev/null
  "$CAIRN" lvm lvcreate --type raid10 -m 1 -i 2 -n r10 -L 32M --devices "$devs" vgx >/dev/null
  less="${p[0]},${p[2]},${p[3]},${p[4]}"
  random_file "$WORK/d.data" 32M
  start_cairn --lvm "$less"
  nbdcopy "$WORK/d.data" "$(unix_uri vgx/r10)"
  stop_cairn
  out=$("$CAIRN" lvm lvconvert --repair vgx/r10 --devices "$less" 2>&1) || fail "lvconvert --repair: $out"
  say "$out"
  expect_contains "$out" "rebuilt 100%" "rebuild progress"
  expect_contains "$out" "r10_rimage_1 moved from missing to pv4" "the move"
  start_cairn --read-only --lvm "$less"
  case $(cat "$CAIRN_LOG") in *DEGRADED*) fail "still degraded after the repair: $(cat "$CAIRN_LOG")" ;; esac
  nbdcopy "$(unix_uri vgx/r10)" "$WORK/d.back"
  stop_cairn
  cmp "$WORK/d.data" "$WORK/d.back" || fail "data differs after the repair"
  # Nothing left to move an image to (the lost PV is flagged MISSING): refused.
  before=$(sha256sum "${p[0]}" "${p[2]}" "${p[3]}" "${p[4]}")
  rc=0; err=$("$CAIRN" lvm lvconvert --replace "${p[0]}" vgx/r10 --devices "$less" 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "lvconvert --replace without room exited $rc: $err"
  expect_contains "$err" "needs another PV" "refusal"
  expect_eq "$(sha256sum "${p[0]}" "${p[2]}" "${p[3]}" "${p[4]}")" "$before" "PVs after the refusal"
}

# lv_progress CTL: "done total" of the recovery an LV node of `cairn status --json` shows,
# or "none".
lv_progress() {
  "$CAIRN" --json status --control "$1" 2>/dev/null | py -c '
import json, sys
def walk(n):
    yield n
    for c in n.get("children", []):
        yield from walk(c)
try:
    j = json.load(sys.stdin)
except ValueError:
    print("none"); sys.exit()
for e in j.get("exports", []):
    for n in walk(e):
        p = n.get("progress")
        if n.get("kind") == "lv" and p and p["action"] == "recovery":
            print(p["done_bytes"], p["total_bytes"]); sys.exit()
print("none")'
}

# served_rebuild TYPE IMAGES -m -i: a served TYPE LV with image 1's PV missing is
# repaired onto a spare PV through the running server (`cairn lvm lvconvert --repair
# --control`) while fio writes and verifies (crc32c) through it; status shows the
# rebuild's progress on the LV; 0 verify errors; then the LV read from the old images
# only and from the new image (with the old one's PV left out) is the same.
served_rebuild() {
  local type=$1 n=$2 vg=vs$1 i p=() less=() spare devs ctl uri size seen=0 st out
  shift 2
  need_tool fio nbdinfo nbdcopy curl
  for i in $(seq 0 "$n"); do p[$i]=$SHM/$vg-$i.img; done
  truncate -s 64M "${p[@]}"
  spare=${p[$n]}
  "$CAIRN" lvm vgcreate "$vg" "${p[@]}" >/dev/null
  "$CAIRN" lvm lvcreate --type "$type" "$@" -n r -L 32M --devices "$(IFS=,; echo "${p[*]}")" "$vg" >/dev/null
  for i in $(seq 0 $((n - 1))); do [ "$i" = 1 ] || less+=("${p[$i]}"); done
  ctl=$WORK/$vg.ctl
  # Slow enough that the rebuild runs beside fio for a few seconds.
  start_cairn --control "$ctl" --speed-limit-min 3000 --speed-limit-max 6000 \
    --lvm "$(IFS=,; echo "${less[*]}")"
  expect_contains "$(cat "$CAIRN_LOG")" "DEGRADED" "served degraded"
  uri=$(unix_uri "$vg/r")
  size=$(nbdinfo --size "$uri")
  timeout -k 5 120 fio --name=verify --ioengine=nbd --uri="$uri" --rw=randrw --rwmixread=30 \
    --bsrange=4k-64k --iodepth=4 --size="$size" --verify=crc32c --verify_backlog=64 \
    --verify_fatal=1 --rate=$((size / 8)),$((size / 8)) --output-format=json \
    --output="$WORK/$vg-fio.json" >"$WORK/$vg-fio.out" 2>&1 &
  local fio_pid=$!
  register pid "$fio_pid"
  sleep 1
  out=$("$CAIRN" lvm lvconvert --repair "$vg/r" --devices "$(IFS=,; echo "${less[*]},$spare")" \
    --control "$ctl" 2>&1) || fail "served lvconvert --repair: $out"
  say "$out"
  expect_contains "$out" "r_rimage_1 moved from missing to pv$n" "the move"
  expect_contains "$out" "rebuilding" "background rebuild"
  for i in $(seq 600); do
    st=$(lv_progress "$ctl")
    case $st in
      none) [ "$seen" -gt 0 ] && break ;;
      *) seen=$((seen + 1)); [ "$seen" = 1 ] && say "status during the rebuild: $st of the image's bytes" ;;
    esac
    sleep 0.1
  done
  [ "$seen" -gt 1 ] || fail "status never showed the rebuild's progress on the LV"
  "$CAIRN" status --control "$ctl" >"$WORK/$vg-status.txt" 2>&1 || true
  # The rebuild's end is recorded in the metadata LVs: lvs through the daemon says 100%.
  for i in $(seq 50); do
    st=$(curl -s --unix-socket "$ctl" "http://cairn/v1/lvm/$vg" |
      py -c 'import json,sys; print([l["sync_percent"] for l in json.load(sys.stdin)["lvs"] if l["name"]=="r"][0])')
    [ "$st" = 100.00 ] && break
    sleep 0.1
  done
  expect_eq "$st" 100.00 "Cpy%Sync after the served rebuild"
  local status=0
  wait "$fio_pid" || status=$?
  [ "$status" = 0 ] || fail "fio failed ($status): $(tail -5 "$WORK/$vg-fio.out")"
  expect_eq "$(py -c 'import json,sys; print(sum(j["error"] for j in json.load(open(sys.argv[1]))["jobs"]))' "$WORK/$vg-fio.json")" 0 "fio errors"
  grep -qi "verify" "$WORK/$vg-fio.out" && fail "fio reported verify trouble: $(grep -i verify "$WORK/$vg-fio.out" | head -3)"
  say "fio: $(py -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j["write"]["io_bytes"], "bytes written,", j["read"]["io_bytes"], "read and verified")' "$WORK/$vg-fio.json")"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn's exit status"
  # Whole without the lost PV now.
  start_cairn --read-only --lvm "$(IFS=,; echo "${less[*]},$spare")"
  case $(cat "$CAIRN_LOG") in *DEGRADED*) fail "still degraded after the served repair: $(cat "$CAIRN_LOG")" ;; esac
  nbdcopy "$(unix_uri "$vg/r")" "$WORK/$vg-whole"
  stop_cairn
  # The old images alone, then the new image in place of image 0's copy.
  start_cairn --read-only --lvm "$(IFS=,; echo "${less[*]}")"
  nbdcopy "$(unix_uri "$vg/r")" "$WORK/$vg-old"
  stop_cairn
  local others=("${less[@]:1}")
  start_cairn --read-only --lvm "$(IFS=,; echo "${others[*]}${others[*]:+,}$spare")"
  nbdcopy "$(unix_uri "$vg/r")" "$WORK/$vg-new"
  stop_cairn
  cmp "$WORK/$vg-old" "$WORK/$vg-new" || fail "the rebuilt image differs from its mirror"
  cmp "$WORK/$vg-old" "$WORK/$vg-whole" || fail "the whole LV differs"
}

t_served_rebuild_raid1() { served_rebuild raid1 2 -m 1; }
t_served_rebuild_raid10() { served_rebuild raid10 4 -m 1 -i 2 -I 64k; }

# rmeta_bits FILE: the first 2 bytes of md's bitmap bits in the metadata LV at extent 0
# of FILE (1 MiB pe_start, bitmap at 4 KiB, bits after its 256-byte header), as a number.
rmeta_bits() {
  py -c 'import sys
with open(sys.argv[1], "rb") as f:
    f.seek((1 << 20) + 4096)
    h = f.read(512)
assert h[:4] == b"bitm", h[:4]
print(int.from_bytes(h[256:258], "little"))' "$1"
}

# kill -9 mid-write: the bitmap in both metadata LVs marks exactly the 2 MiB regions the
# writes touched (md's write-intent bits, per region), and the next start resyncs those
# regions only (4 MiB, not the LV's 32 MiB); a clean stop then leaves no bit set.
t_unclean_stop_dirty_regions() {
  need_tool nbdsh
  local p=("$SHM/u0.img" "$SHM/u1.img") devs
  truncate -s 64M "${p[@]}"
  devs=$(IFS=,; echo "${p[*]}")
  "$CAIRN" lvm vgcreate vgu "${p[@]}" >/dev/null
  "$CAIRN" lvm lvcreate --type raid1 -m 1 -n r -L 32M --devices "$devs" vgu >/dev/null
  expect_eq "$(rmeta_bits "${p[0]}")" 0 "bits after lvcreate"
  start_cairn --lvm "$devs"
  # Regions 1 and 5 (2 MiB each), written and never flushed; then the server dies.
  nbdsh -u "$(unix_uri vgu/r)" -c '
h.pwrite(b"\x11" * 4096, (2 << 20) + 4096)
h.pwrite(b"\x55" * 8192, (10 << 20) + 65536)
'
  stop_cairn KILL
  expect_eq "$(rmeta_bits "${p[0]}")" $(((1 << 1) | (1 << 5))) "bits of rmeta_0 after kill -9"
  expect_eq "$(rmeta_bits "${p[1]}")" $(((1 << 1) | (1 << 5))) "bits of rmeta_1 after kill -9"
  RUST_LOG=cairn_lvm=info start_cairn --lvm "$devs"
  expect_contains "$(cat "$CAIRN_LOG")" "resyncing the 2 regions its bitmap marks" "resync of the dirty regions"
  expect_contains "$(cat "$CAIRN_LOG")" "resynced 4194304 bytes" "bytes resynced"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  expect_eq "$(rmeta_bits "${p[0]}")" 0 "bits after a clean stop"
  expect_eq "$(rmeta_bits "${p[1]}")" 0 "bits of rmeta_1 after a clean stop"
}

# image_at VG IMAGE DEVS: "FILE OFFSET" of the first byte of the sub-LV IMAGE (one
# segment on one PV), from cairn's VG report (pe_start, extent size, seg_pe_ranges).
image_at() {
  "$CAIRN" --json lvm vgs --devices "$3" | py -c '
import json, sys
r = json.load(sys.stdin)
lv = [l for l in r["lvs"] if l["name"] == sys.argv[1]][0]
pv, ext = lv["segments"][0]["seg_pe_ranges"].split(":")
start = int(ext.split("-")[0])
pe = [p for p in r["pvs"] if p["name"] == pv][0]["pe_start"]
print(pv, pe + start * r["extent_size"])' "$2"
}

# bytes_at FILE OFFSET LEN: sha256 of LEN bytes of FILE at OFFSET.
bytes_at() {
  py -c 'import hashlib, sys
with open(sys.argv[1], "rb") as f:
    f.seek(int(sys.argv[2])); print(hashlib.sha256(f.read(int(sys.argv[3]))).hexdigest())' "$@"
}

# Scrub of a served raid1 LV (lvchange --syncaction through the control socket): one
# 4 KiB block of image 1 corrupted in its PV file; check finds 8 sectors and writes
# nothing; lvs (SyncAction, Mismatches), status and /v1/arrays show it, an event says
# so; repair makes the images agree again (the first copy, which holds the data); a
# check while fio writes and verifies through NBD finds nothing and fio sees 0 errors.
t_served_scrub_raid1() {
  need_tool nbdcopy curl fio
  local p=("$SHM/s0.img" "$SHM/s1.img") devs ctl out rc i0 i1 f0 o0 f1 o1 bad st
  truncate -s 64M "${p[@]}"
  devs=$(IFS=,; echo "${p[*]}")
  "$CAIRN" lvm vgcreate vgs "${p[@]}" >/dev/null
  "$CAIRN" lvm lvcreate --type raid1 -m 1 -n r -L 16M --devices "$devs" vgs >/dev/null
  random_file "$WORK/s-data" 16M
  start_cairn --lvm "$devs"
  nbdcopy "$WORK/s-data" "$(unix_uri vgs/r)"
  stop_cairn
  read -r f0 o0 < <(image_at vgs r_rimage_0 "$devs")
  read -r f1 o1 < <(image_at vgs r_rimage_1 "$devs")
  expect_eq "$(bytes_at "$f0" "$o0" $((16 << 20)))" "$(bytes_at "$f1" "$o1" $((16 << 20)))" "the images before"
  bad=$((o1 + (5 << 20) + 4096))
  py -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); f.write(b"\xab" * 4096)' "$f1" "$bad"
  ctl=$WORK/vgs.ctl
  # Slow enough (16 MiB at 4 MB/s) that a check runs beside fio for a few seconds.
  start_cairn --control "$ctl" --speed-limit-min 2000 --speed-limit-max 4000 --lvm "$devs"
  rc=0; out=$("$CAIRN" lvm lvchange --syncaction check vgs/r --wait --control "$ctl" 2>&1) || rc=$?
  say "$out"
  expect_eq "$rc" 1 "check's exit status with a mismatch"
  expect_contains "$out" "8 mismatched sectors" "check's count"
  expect_contains "$out" "5246976" "the mismatch's LV offset"
  expect_eq "$(bytes_at "$f1" "$bad" 4096)" "$(py -c 'import hashlib; print(hashlib.sha256(b"\xab" * 4096).hexdigest())')" "the bad block after check"
  "$CAIRN" lvm lvs --devices "$devs" --control "$ctl" | tee "$WORK/s-lvs.txt"
  expect_contains "$(cat "$WORK/s-lvs.txt")" "Mismatches" "lvs column"
  st=$("$CAIRN" --json lvm lvs --devices "$devs" --control "$ctl" | py -c 'import json,sys
l = [l for l in json.load(sys.stdin)["lvs"] if l["name"] == "r"][0]
print(l["raid_sync_action"], l["raid_mismatch_count"])')
  expect_eq "$st" "idle 8" "lvs raid_sync_action raid_mismatch_count"
  st=$("$CAIRN" --json status --control "$ctl" | py -c 'import json,sys
def walk(n):
    yield n
    for c in n.get("children", []): yield from walk(c)
print([n["lv"]["mismatch_sectors"] for e in json.load(sys.stdin)["exports"] for n in walk(e) if n.get("kind") == "lv"][0])')
  expect_eq "$st" 8 "status: the LV node's mismatch_sectors"
  st=$(curl -s --unix-socket "$ctl" http://cairn/v1/arrays | py -c 'import json,sys
print([(a["kind"], a["scrub"]["mismatch_sectors"]) for a in json.load(sys.stdin)["arrays"] if a["name"] == "vgs/r"])')
  expect_eq "$st" "[('raid-lv', 8)]" "/v1/arrays"
  expect_contains "$(curl -s --unix-socket "$ctl" http://cairn/v1/events)" "RAID LV vgs/r: a scrub found 8 mismatched sectors" "the MismatchesFound event"
  rc=0; out=$("$CAIRN" lvm lvchange --syncaction repair vgs/r --wait --control "$ctl" 2>&1) || rc=$?
  say "$out"
  expect_eq "$rc" 1 "repair's exit status (mismatches found, and repaired)"
  expect_contains "$out" "repaired" "repair's words"
  "$CAIRN" lvm lvchange --syncaction check vgs/r --wait --control "$ctl" >/dev/null ||
    fail "a check after the repair still finds mismatches"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  i0=$(bytes_at "$f0" "$o0" $((16 << 20)))
  i1=$(bytes_at "$f1" "$o1" $((16 << 20)))
  expect_eq "$i1" "$i0" "image 1 after the repair"
  expect_eq "$i0" "$(sha256sum <"$WORK/s-data" | cut -d' ' -f1)" "the images against the data written"
  # A check while fio writes and verifies through NBD: no false mismatch, no fio error.
  start_cairn --control "$ctl" --speed-limit-min 2000 --speed-limit-max 4000 --lvm "$devs"
  timeout -k 5 60 fio --name=verify --ioengine=nbd --uri="$(unix_uri vgs/r)" --rw=randrw \
    --rwmixread=30 --bsrange=4k-64k --iodepth=4 --size=4M --verify=crc32c --verify_backlog=64 \
    --verify_fatal=1 --rate=1m,1m --output-format=json --output="$WORK/s-fio.json" \
    >"$WORK/s-fio.out" 2>&1 &
  local fio_pid=$! status=0
  register pid "$fio_pid"
  sleep 0.5
  out=$("$CAIRN" lvm lvchange --syncaction check vgs/r --wait --control "$ctl" 2>&1) ||
    fail "check during fio: $out"
  say "during fio: $out"
  kill -0 "$fio_pid" 2>/dev/null || say "note: fio ended before the check did"
  wait "$fio_pid" || status=$?
  [ "$status" = 0 ] || fail "fio failed ($status): $(tail -5 "$WORK/s-fio.out")"
  expect_eq "$(py -c 'import json,sys; print(sum(j["error"] for j in json.load(open(sys.argv[1]))["jobs"]))' "$WORK/s-fio.json")" 0 "fio errors"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop after fio"
}

run_test lvm-reads-cairn-raid t_lvm_reads_cairn_raid
run_test lvconvert-repair t_lvconvert_repair
run_test cairn-reads-lvm-raid t_cairn_reads_lvm_raid
run_test raid10-fio-degraded t_raid10_fio_degraded
run_test served-rebuild-raid1 t_served_rebuild_raid1
run_test served-rebuild-raid10 t_served_rebuild_raid10
run_test unclean-stop-dirty-regions t_unclean_stop_dirty_regions
run_test served-scrub-raid1 t_served_scrub_raid1
finish
