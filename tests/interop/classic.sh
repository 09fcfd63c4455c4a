#!/usr/bin/env bash
# The classic home-server stack, end to end, made and served by cairn alone:
# md RAID6 -> LUKS2 -> LVM2 (home, media) -> ext4 on home through nbdfuse + loop.
# Alignment is checked by arithmetic on the real offsets the tools report.
. "$(dirname "$0")/lib.sh"

KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)

# make_stack N CHUNK SIZE: N member files of SIZE in $SHM/sN, RAID6 with CHUNK, LUKS2
# over it, a PV and VG "vg0" on the LUKS volume. Sets M (members, comma-separated), KEY.
make_stack() {
  local n=$1 chunk=$2 size=$3 i files=()
  local d
  d=$(mktemp -d "$SHM/stack.XXXXXX")
  for i in $(seq 0 $((n - 1))); do
    truncate -s "$size" "$d/d$i.img"
    files+=("$d/d$i.img")
  done
  M=$(IFS=,; echo "${files[*]}")
  KEY=$d/key
  printf %s "classic stack $n" >"$KEY"
  "$CAIRN" md create --level 6 --chunk "$chunk" --raid-devices "$n" "${files[@]}" >/dev/null
  "$CAIRN" luks format -q "${KDF[@]}" --key-file "$KEY" --md "$M" >/dev/null
  "$CAIRN" lvm pvcreate --md "$M" --luks --key-file "$KEY" >/dev/null
  "$CAIRN" lvm vgcreate vg0 --md "$M" --luks --key-file "$KEY"
}

# check_alignment FULL_STRIPE: every LV's first byte, as an offset into the array
# (LUKS payload offset + pe_start + first PE x extent size), is a multiple of the full
# stripe.
check_alignment() {
  local full=$1
  "$CAIRN" --json luks dump --md "$M" >"$WORK/dump.json"
  "$CAIRN" --json lvm pvs --md "$M" --luks --key-file "$KEY" >"$WORK/pvs.json"
  "$CAIRN" --json lvm lvs --md "$M" --luks --key-file "$KEY" >"$WORK/lvs.json"
  py - "$full" "$WORK/dump.json" "$WORK/pvs.json" "$WORK/lvs.json" <<'EOF'
import json, sys
full = int(sys.argv[1])
dump, pvs, lvs = (json.load(open(p)) for p in sys.argv[2:5])
payload = dump["segments"][0]["offset"]
pe_start = pvs["pvs"][0]["pe_start"]
extent = lvs["extent_size"]
print(f"payload {payload}, pe_start {pe_start}, extent {extent}, full stripe {full}")
assert payload % full == 0, f"LUKS payload {payload} is off the full stripe {full}"
assert lvs["lvs"], "no LVs"
for lv in lvs["lvs"]:
    for seg in lv["segments"]:
        first_pe = int(seg["seg_pe_ranges"].rsplit(":", 1)[1].split("-")[0])
        at = payload + pe_start + first_pe * extent
        print(f"{lv['name']}: segment at extent {seg['start_extent']} starts at array byte {at}")
        assert at % full == 0, f"{lv['name']} starts at {at}, not a multiple of {full}"
EOF
}

t_classic_stack_ext4() {
  need_root
  need_fuse
  need_tool mkfs.ext4 e2fsck
  make_stack 4 64K 192M
  "$CAIRN" lvm lvcreate -n home -L 160M vg0 --md "$M" --luks --key-file "$KEY"
  "$CAIRN" lvm lvcreate -n media -l 100%FREE vg0 --md "$M" --luks --key-file "$KEY"
  # 4 members, 64 KiB chunks: 2 data members, full stripe 128 KiB.
  check_alignment $((128 << 10))
  start_cairn --md "$M" --luks --lvm --key-file "$KEY" --control "$WORK/control.sock"
  py - "$CAIRN_JSON" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))
names = sorted(e["name"] for e in a["exports"])
assert names == ["vg0/home", "vg0/media"], names
for e in a["exports"]:
    assert e["optimal_io_size"] == 128 << 10, e
EOF
  # An LV export's name has a slash: the README's `cairn advise vg0/home` and the API
  # route take it whole, spelled with / or %2F.
  "$CAIRN" advise vg0/home --control "$WORK/control.sock" >"$WORK/advise.txt" ||
    fail "cairn advise vg0/home: $(cat "$WORK/advise.txt")"
  expect_contains "$(cat "$WORK/advise.txt")" "stride=16,stripe_width=32" "advise vg0/home"
  need_tool curl
  for route in vg0/home vg0%2Fhome; do
    curl -sf --unix-socket "$WORK/control.sock" "http://cairn/v1/exports/$route" >"$WORK/lv.json" ||
      fail "GET /v1/exports/$route failed"
    expect_eq "$(py -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$WORK/lv.json")" \
      vg0/home "the export GET /v1/exports/$route names"
  done
  nbdinfo --json "$(unix_uri vg0/home)" | py -c '
import json, sys; j = json.load(sys.stdin)
size = j["exports"][0]["export-size"]
assert size == 160 << 20, size
# The description is the stack, not a member path.
d = j["exports"][0]["description"]
assert d.startswith("LV vg0/home over LUKS2") and "raid6 over" in d, d'
  # media gets random data first; home's filesystem must not disturb it.
  random_file "$WORK/media.bin" 64M
  nbdcopy "$WORK/media.bin" "$(unix_uri vg0/media)"
  attach_export "$(unix_uri vg0/home)"
  mkfs.ext4 -q -F -E stride=16,stripe_width=32 "$LOOP"
  mkdir -p "$WORK/mnt"
  mount "$LOOP" "$WORK/mnt"
  register mount "$WORK/mnt"
  mkdir -p "$WORK/mnt/photos"
  for i in $(seq 1 20); do
    head -c $((i * 37000)) /dev/urandom >"$WORK/mnt/photos/p$i.jpg"
  done
  cp -r "$REPO/docs" "$WORK/mnt/docs"
  (cd "$WORK/mnt" && find . -type f -exec sha256sum {} + | sort -k2) >"$WORK/sums"
  umount "$WORK/mnt"
  e2fsck -fn "$LOOP"
  mount "$LOOP" "$WORK/mnt"
  (cd "$WORK/mnt" && sha256sum --quiet -c "$WORK/sums")
  umount "$WORK/mnt"
  detach_export
  nbdcopy "$(unix_uri vg0/media)" "$SHM/media.out"
  cmp -n $((64 << 20)) "$SHM/media.out" "$WORK/media.bin"
  rm -f "$SHM/media.out"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn's exit status"
  # Served again from the members, this time from a config file saying the same: the
  # filesystem is still there and clean.
  {
    echo '[[export]]'
    echo "md = [$(printf '"%s",' ${M//,/ } | sed 's/,$//')]"
    echo 'luks = true'
    echo 'lvm = true'
    echo "key_file = \"$KEY\""
  } >"$WORK/cairn.toml"
  cat "$WORK/cairn.toml"
  start_cairn --config "$WORK/cairn.toml"
  py - "$CAIRN_JSON" <<'EOF'
import json, sys
names = sorted(e["name"] for e in json.load(open(sys.argv[1]))["exports"])
assert names == ["vg0/home", "vg0/media"], names
EOF
  attach_export "$(unix_uri vg0/home)"
  e2fsck -fn "$LOOP"
  dumpe2fs -h "$LOOP" 2>/dev/null | grep -E 'RAID stride:\s+16'
  detach_export
  stop_cairn
}

t_non_power_of_two_stripe() {
  # 5 members, 64 KiB chunks: 3 data members, full stripe 192 KiB. lvm's 4 MiB extents
  # would put the second LV 64 KiB off the stripe; cairn picks 12 MiB extents.
  make_stack 5 64K 128M >"$WORK/vgcreate.out" 2>&1
  cat "$WORK/vgcreate.out"
  expect_contains "$(cat "$WORK/vgcreate.out")" "extent size 12 MiB" "the note on the extent size"
  "$CAIRN" lvm lvcreate -n a -l 1 vg0 --md "$M" --luks --key-file "$KEY"
  "$CAIRN" lvm lvcreate -n b -l 2 vg0 --md "$M" --luks --key-file "$KEY"
  "$CAIRN" lvm lvextend -l +1 vg0/a --md "$M" --luks --key-file "$KEY"
  "$CAIRN" --json lvm vgs --md "$M" --luks --key-file "$KEY" | py -c '
import json, sys; j = json.load(sys.stdin)
vg = j["vgs"][0] if "vgs" in j else j
assert vg["extent_size"] == 12 << 20, vg'
  check_alignment $((192 << 10))
  start_cairn --md "$M" --luks --lvm --key-file "$KEY"
  random_file "$WORK/a.bin" 24M
  nbdcopy "$WORK/a.bin" "$(unix_uri vg0/a)"
  nbdcopy "$(unix_uri vg0/a)" - | cmp - "$WORK/a.bin"
  stop_cairn
}

t_lvm_needs_its_pvs() {
  make_stack 4 64K 96M
  "$CAIRN" lvm lvcreate -n x -L 16M vg0 --md "$M" --luks --key-file "$KEY"
  # A bare --lvm with nothing below it, and a PV without a label, are refused clearly.
  local st=0
  "$CAIRN" serve --lvm --listen "unix:$WORK/x.sock" 2>"$WORK/e1" || st=$?
  expect_eq "$st" 1 "exit status of a bare --lvm"
  expect_contains "$(cat "$WORK/e1")" "--lvm without PVs" "bare --lvm message"
  truncate -s 64M "$SHM/blank.img"
  st=0
  "$CAIRN" serve --lvm "$SHM/blank.img" --listen "unix:$WORK/x.sock" 2>"$WORK/e2" || st=$?
  expect_eq "$st" 1 "exit status with a blank PV"
  expect_contains "$(cat "$WORK/e2")" "holds no LVM2 physical volume label" "blank PV message"
  [ ! -e "$WORK/x.sock" ] || fail "a refused serve left its socket"
}

# A served stack answers `cairn lvm vgs/lvs` itself: the daemon has the PVs open and
# unlocked, so the report needs no key (a key file that does not exist proves nothing
# was unlocked) and matches what lvs reads from the devices once the server is gone.
t_lvs_from_the_daemon() {
  need_tool jq
  make_stack 4 64K 32M
  "$CAIRN" lvm lvcreate -n home -l 2 vg0 --md "$M" --luks --key-file "$KEY" >/dev/null
  mkdir -p "$WORK/xdg"
  XDG_RUNTIME_DIR=$WORK/xdg start_cairn --md "$M" --luks --lvm --key-file "$KEY"
  XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" --json lvm lvs --md "$M" --luks --key-file "$WORK/no-such-key" \
    >"$WORK/served.json" 2>"$WORK/served.err" ||
    fail "lvs of a served VG without its key: $(cat "$WORK/served.err")"
  expect_contains "$(cat "$WORK/served.err")" "VG vg0 is served by cairn serve (PID $CAIRN_PID)" "where the report came from"
  XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" lvm vgs --md "$M" --luks --key-file "$WORK/no-such-key" >"$WORK/vgs.txt" 2>&1 ||
    fail "vgs of a served VG: $(cat "$WORK/vgs.txt")"
  expect_contains "$(cat "$WORK/vgs.txt")" "vg0" "vgs through the daemon"
  stop_cairn
  "$CAIRN" --json lvm lvs --md "$M" --luks --key-file "$KEY" >"$WORK/local.json"
  expect_eq "$(jq -c '.lvs' "$WORK/served.json")" "$(jq -c '.lvs' "$WORK/local.json")" "the daemon's LVs and the devices' LVs"
}

run_test classic-stack-ext4 t_classic_stack_ext4
run_test non-power-of-two-stripe t_non_power_of_two_stripe
run_test lvm-needs-its-pvs t_lvm_needs_its_pvs
run_test lvs-from-the-daemon t_lvs_from_the_daemon
finish
