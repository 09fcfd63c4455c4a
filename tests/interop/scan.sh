#!/usr/bin/env bash
# Stack discovery: a directory holding a RAID6, a RAID5 under LUKS2, a degraded RAID1, a
# plain LUKS2 file and stray files. `cairn scan` reports it and writes nothing;
# `cairn serve --scan DIR --key-file K` brings up exactly those stacks, whose data
# (written before through the explicit --md/--luks serve) reads back byte for byte;
# --key-dir picks keys by LUKS UUID; a config file serves what the equivalent command line
# serves.
. "$(dirname "$0")/lib.sh"

CHEAP=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
DIR=$SHM/disks
KEY=$WORK/key

# json FILE EXPR: evaluates a Python expression over the JSON in FILE (as j).
json() { py -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

# exports_json: the announcement's exports without their URIs (ports and sockets differ
# from run to run), sorted by name.
exports_json() {
  json "$CAIRN_JSON" 'json.dumps(sorted(({k: v for k, v in e.items() if k != "uris"} for e in j["exports"]), key=lambda e: e["name"]))'
}

# member_sums: sha256 of every file in $DIR (and the removed RAID1 member), one line each.
member_sums() { (cd "$SHM" && sha256sum disks/* removed/* 2>/dev/null); }

# The directory of stacks, with 8 MiB of known data written into each through the
# explicit serve. Sets R6, R5, R1 (member lists) and the *_SIZE of each export.
setup_dir() {
  need_tool nbdcopy nbdinfo cmp
  rm -rf "$DIR" "$SHM/removed" "$SHM/other"
  mkdir -p "$DIR" "$SHM/removed"
  printf %s 'scan test passphrase' >"$KEY"
  local i
  R6=() R5=() R1=()
  for i in 0 1 2 3; do R6+=("$DIR/r6-$i.img"); done
  for i in 0 1 2; do R5+=("$DIR/r5-$i.img"); done
  for i in 0 1; do R1+=("$DIR/r1-$i.img"); done
  "$CAIRN" md create -l 6 -n 4 -c 64K --size 64M --name r6 "${R6[@]}" >/dev/null
  "$CAIRN" md create -l 5 -n 3 -c 128K --size 64M --name r5 "${R5[@]}" >/dev/null
  "$CAIRN" md create -l 1 -n 2 --size 64M --name r1 "${R1[@]}" >/dev/null
  "$CAIRN" luks format -q --key-file "$KEY" "${CHEAP[@]}" --md "$(IFS=,; echo "${R5[*]}")" >/dev/null
  truncate -s 64M "$DIR/vol.img"
  "$CAIRN" luks format -q --key-file "$KEY" "${CHEAP[@]}" "$DIR/vol.img" >/dev/null
  random_file "$DIR/stray.img" 1M
  echo "not a disk" >"$DIR/notes.txt"
  : >"$DIR/empty.img"
  echo hidden >"$DIR/.hidden"
  random_file "$SHM/data.bin" 8M

  start_cairn --md "$(IFS=,; echo "${R6[*]}"):r6" --md "$(IFS=,; echo "${R1[*]}"):r1"
  nbdcopy "$SHM/data.bin" "$(unix_uri r6)"
  nbdcopy "$SHM/data.bin" "$(unix_uri r1)"
  R6_SIZE=$(nbdinfo --size "$(unix_uri r6)")
  R1_SIZE=$(nbdinfo --size "$(unix_uri r1)")
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "explicit serve exit status"
  start_cairn --md "$(IFS=,; echo "${R5[*]}"):r5" --luks --key-file "$KEY"
  nbdcopy "$SHM/data.bin" "$(unix_uri r5)"
  R5_SIZE=$(nbdinfo --size "$(unix_uri r5)")
  stop_cairn
  start_cairn --luks "$DIR/vol.img" --key-file "$KEY"
  nbdcopy "$SHM/data.bin" "$(unix_uri vol)"
  VOL_SIZE=$(nbdinfo --size "$(unix_uri vol)")
  stop_cairn
  # The RAID1 loses a member: the scan must start it degraded.
  mv "${R1[1]}" "$SHM/removed/"
}

# read_back URI: the first 8 MiB of the export equal $SHM/data.bin.
read_back() {
  rm -f "$SHM/back.bin"
  nbdcopy "$1" "$SHM/back.bin"
  cmp -n 8388608 "$SHM/data.bin" "$SHM/back.bin" || fail "read back through $1 differs"
}

t_scan_reports_and_writes_nothing() {
  setup_dir
  member_sums >"$WORK/sums.before"
  "$CAIRN" scan --json "$DIR" --key-file "$KEY" >"$WORK/scan.json" || fail "cairn scan failed"
  "$CAIRN" scan "$DIR" >"$WORK/scan.txt" || fail "cairn scan (text) failed"
  cat "$WORK/scan.txt"
  expect_eq "$(json "$WORK/scan.json" 'sorted(e["name"] for e in j["exports"])')" \
    "['r1', 'r5', 'r6', 'vol']" "exports cairn scan plans"
  expect_eq "$(json "$WORK/scan.json" '[e["state"] for e in j["exports"] if e["name"]=="r1"][0]')" \
    "clean, degraded" "r1 state"
  expect_eq "$(json "$WORK/scan.json" '[e["size"] for e in j["exports"] if e["name"]=="r5"][0]')" \
    "$R5_SIZE" "r5 size from the header alone"
  expect_contains "$(json "$WORK/scan.json" '[e["key"] for e in j["exports"] if e["name"]=="vol"][0]')" \
    "key file" "vol's key source"
  local skipped
  skipped=$(json "$WORK/scan.json" '" ".join(sorted(s["what"].rsplit("/",1)[-1] for s in j["skipped"]))')
  expect_eq "$skipped" ".hidden empty.img notes.txt stray.img" "skipped files"
  expect_contains "$(cat "$WORK/scan.txt")" "no md, LUKS or LVM2 signature" "reason for the stray file"
  member_sums >"$WORK/sums.after"
  cmp "$WORK/sums.before" "$WORK/sums.after" || fail "cairn scan changed a member file"

  # serve --scan --read-only, with a client reading: still nothing written.
  start_cairn --scan "$DIR" --key-file "$KEY" --read-only
  read_back "$(unix_uri r6)"
  stop_cairn
  # A serve --scan that assembles and unlocks everything writable, then fails.
  expect_status 1 "$CAIRN" serve --scan "$DIR" --key-file "$KEY" --listen "unix:$WORK/x.sock" \
    --default-export no-such-export
  # A scan that fails at the start: a path that does not exist.
  expect_status 1 "$CAIRN" scan "$DIR" "$SHM/no-such-dir"
  member_sums >"$WORK/sums.after"
  cmp "$WORK/sums.before" "$WORK/sums.after" || fail "a read-only or failed serve --scan changed a member file"
}

t_serve_scan_brings_up_every_stack() {
  setup_dir
  start_cairn --scan "$DIR" --key-file "$KEY" --control "$WORK/control.sock"
  cat "$CAIRN_LOG"
  # cairn status describes each stack the scan brought up, layer by layer.
  "$CAIRN" status --json --control "$WORK/control.sock" >"$WORK/status.json" || fail "cairn status failed"
  py - "$WORK/status.json" <<'PY' || fail "cairn status --json does not describe the scanned stacks"
import json, sys
st = json.load(open(sys.argv[1]))
ex = {e["name"]: e for e in st["exports"]}
assert sorted(ex) == ["r1", "r5", "r6", "vol"], sorted(ex)
def chain(e):
    out, n = [], e
    while n.get("children"):
        n = n["children"][0]
        out.append(n)
    return out
r6 = chain(ex["r6"])
assert r6[0]["kind"] == "md" and r6[0]["md"]["level"] == "raid6", r6[0]
assert len(ex["r6"]["children"][0]["children"]) == 4
r5 = chain(ex["r5"])
assert [n["kind"] for n in r5[:2]] == ["luks", "md"], [n["kind"] for n in r5]
assert r5[0]["luks"]["version"] == 2 and r5[1]["md"]["level"] == "raid5"
assert r5[1]["md"]["chunk_bytes"] == 131072
r1 = ex["r1"]["children"][0]
assert r1["kind"] == "md" and "degraded" in r1["state"], r1["state"]
states = sorted(m["state"] for m in r1["children"])
assert states == ["active sync", "removed"], states
vol = chain(ex["vol"])
assert [n["kind"] for n in vol] == ["luks", "file"], [n["kind"] for n in vol]
PY
  expect_eq "$(json "$CAIRN_JSON" 'sorted(e["name"] for e in j["exports"])')" \
    "['r1', 'r5', 'r6', 'vol']" "exports"
  local name want
  for name in r1 r5 r6 vol; do
    case $name in
      r1) want=$R1_SIZE ;; r5) want=$R5_SIZE ;; r6) want=$R6_SIZE ;; vol) want=$VOL_SIZE ;;
    esac
    expect_eq "$(json "$CAIRN_JSON" "[e['size'] for e in j['exports'] if e['name']=='$name'][0]")" \
      "$want" "$name size in the announcement"
    expect_eq "$(nbdinfo --size "$(unix_uri "$name")")" "$want" "$name size by nbdinfo"
    read_back "$(tcp_uri "$name")"
  done
  expect_eq "$(json "$CAIRN_JSON" '[e["md"]["level"] for e in j["exports"] if e["name"]=="r6"][0]')" raid6 "r6 level"
  expect_contains "$(json "$CAIRN_JSON" '[e["md"]["state_text"] for e in j["exports"] if e["name"]=="r1"][0]')" \
    "degraded" "r1 state"
  expect_eq "$(json "$CAIRN_JSON" '[e["luks"]["version"] for e in j["exports"] if e["name"]=="r5"][0]')" 2 "r5 is LUKS2"
  expect_eq "$(json "$CAIRN_JSON" '[e["md"]["level"] for e in j["exports"] if e["name"]=="r5"][0]')" raid5 "r5 over raid5"
  expect_eq "$(json "$CAIRN_JSON" '[e["luks"]["version"] for e in j["exports"] if e["name"]=="vol"][0]')" 2 "vol is LUKS2"
  grep -q DEGRADED "$CAIRN_LOG" || fail "no degraded warning for r1"
  grep -q "stray.img" "$CAIRN_LOG" || fail "the skipped stray file is not reported"
  # Writes through the scanned export land where the explicit serve finds them.
  random_file "$SHM/data.bin" 8M
  nbdcopy "$SHM/data.bin" "$(unix_uri r5)"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "exit status"
  start_cairn --md "$(IFS=,; echo "${R5[*]}"):r5" --luks --key-file "$KEY"
  read_back "$(unix_uri r5)"
  stop_cairn
}

t_key_dir_and_no_key() {
  setup_dir
  local uuid
  uuid=$("$CAIRN" luks dump --json --md "$(IFS=,; echo "${R5[*]}")" | py -c 'import json,sys; print(json.load(sys.stdin)["uuid"])')
  mkdir -p "$WORK/keys"
  cp "$KEY" "$WORK/keys/$uuid.key"
  # Without a terminal (setsid: no controlling one), vol (no key for it) is skipped with
  # a warning; r5 unlocks by its UUID. setsid execs in place, so the PID stays cairn's.
  local real=$CAIRN
  printf '#!/bin/sh\nexec setsid "%s" "$@"\n' "$real" >"$WORK/no-tty"
  chmod +x "$WORK/no-tty"
  CAIRN=$WORK/no-tty start_cairn --scan "$DIR" --key-dir "$WORK/keys" </dev/null
  expect_eq "$(json "$CAIRN_JSON" 'sorted(e["name"] for e in j["exports"])')" \
    "['r1', 'r5', 'r6']" "exports with the key directory only"
  grep -q "vol.img.*no key is available" "$CAIRN_LOG" || fail "no warning for vol: $(cat "$CAIRN_LOG")"
  read_back "$(unix_uri r5)"
  stop_cairn
  # A wrong key file: LUKS volumes skipped, the rest still served.
  printf wrong >"$WORK/wrong"
  start_cairn --scan "$DIR" --key-file "$WORK/wrong"
  expect_eq "$(json "$CAIRN_JSON" 'sorted(e["name"] for e in j["exports"])')" "['r1', 'r6']" "exports with a wrong key"
  grep -q "No key available with this passphrase" "$CAIRN_LOG" || fail "no wrong-key warning"
  stop_cairn
}

# Same stacks from a config file and from the command line: the same exports.
t_config_equals_command_line() {
  setup_dir
  mv "$SHM/removed/r1-1.img" "$DIR/"
  cat >"$WORK/cairn.toml" <<EOF
# the scan test's stacks, by name
key_file = "key"
scan = ["$SHM/other"]

[[export]]
name = "r6"
md = [$(printf '"%s", ' "${R6[@]}")]

[[export]]
md = [$(printf '"%s", ' "${R5[@]}")]
luks = true

[[export]]
file = "$DIR/vol.img"
luks = true
EOF
  mkdir -p "$SHM/other"
  mv "$DIR"/r1-*.img "$SHM/other/"
  start_cairn --config "$WORK/cairn.toml"
  exports_json >"$WORK/from-config"
  read_back "$(unix_uri r5)"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "exit status (config)"
  # A bare --luks unlocks every --md array, so the command line needs two servers for
  # what the config serves in one: the LUKS stacks and the scan, then the plain RAID6.
  start_cairn --md "$(IFS=,; echo "${R5[*]}")" --luks --key-file "$KEY" --luks "$DIR/vol.img" \
    --scan "$SHM/other"
  exports_json >"$WORK/from-cli"
  stop_cairn
  start_cairn --md "$(IFS=,; echo "${R6[*]}"):r6"
  exports_json >"$WORK/r6-cli"
  stop_cairn
  py - "$WORK/from-config" "$WORK/from-cli" "$WORK/r6-cli" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cli = json.load(open(sys.argv[2])) + json.load(open(sys.argv[3]))
cli.sort(key=lambda e: e["name"])
def norm(es):
    # Event counts and times move as each run marks the arrays active and then clean.
    for e in es:
        for k in ("events", "update_time"):
            (e.get("md") or {}).pop(k, None)
    return es
assert [e["name"] for e in cfg] == ["r1", "r5", "r6", "vol"], [e["name"] for e in cfg]
a, b = norm(cfg), norm(cli)
assert len(a) == len(b), (len(a), len(b))
for x, y in zip(a, b):
    assert x == y, f"config and command line differ:\n{x}\n{y}"
PY
}

need_tool python3
# LVM found by a scan: the classic stack (RAID5 -> LUKS2 -> VG "vgs" with home and media)
# and a VG "vgp" striped over two plain PV files come up as VG/LV exports; status shows the
# LV over LUKS over md; a VG with a PV missing is skipped with the reason.
t_scan_finds_lvm() {
  need_tool nbdcopy nbdinfo
  local d=$SHM/lvmscan i r5=() m
  rm -rf "$d"; mkdir -p "$d"
  printf %s 'lvm scan key' >"$KEY"
  for i in 0 1 2; do r5+=("$d/c5-$i.img"); done
  m=$(IFS=,; echo "${r5[*]}")
  "$CAIRN" md create -l 5 -n 3 -c 64K --size 64M --name c5 "${r5[@]}" >/dev/null
  "$CAIRN" luks format -q --key-file "$KEY" "${CHEAP[@]}" --md "$m" >/dev/null
  "$CAIRN" lvm vgcreate vgs --md "$m" --luks --key-file "$KEY" >/dev/null
  "$CAIRN" lvm lvcreate -n home -l 2 vgs --md "$m" --luks --key-file "$KEY" >/dev/null
  "$CAIRN" lvm lvcreate -n media -l 100%FREE vgs --md "$m" --luks --key-file "$KEY" >/dev/null
  truncate -s 32M "$d/p0.img" "$d/p1.img"
  "$CAIRN" lvm vgcreate vgp "$d/p0.img" "$d/p1.img" >/dev/null
  "$CAIRN" lvm lvcreate -n str -i 2 -I 64k -l 4 vgp --devices "$d/p0.img,$d/p1.img" >/dev/null
  # The preview and the server's log describe an LV as the LV over its stack.
  "$CAIRN" scan "$d" --key-file "$KEY" >"$WORK/preview.txt"
  grep -Eq '^  vgs/home .*LV vgs/home over LUKS2 .* over md raid5' "$WORK/preview.txt" ||
    fail "scan preview of an LV: $(cat "$WORK/preview.txt")"
  grep -Eq '^  vgp/str .*LV vgp/str over file .*p0.img over file .*p1.img' "$WORK/preview.txt" ||
    fail "scan preview of a striped LV: $(cat "$WORK/preview.txt")"
  start_cairn --scan "$d" --key-file "$KEY" --control "$WORK/lvm-control.sock"
  grep -q 'exporting "vgs/home": LV vgs/home over LUKS2' "$CAIRN_LOG" ||
    fail "serve --scan's log of an LV: $(cat "$CAIRN_LOG")"
  json "$CAIRN_JSON" 'sorted(e["name"] for e in j["exports"])' >"$WORK/names"
  expect_eq "$(cat "$WORK/names")" "['vgp/str', 'vgs/home', 'vgs/media']" "exports found by the scan"
  random_file "$SHM/lv.bin" 8M
  nbdcopy "$SHM/lv.bin" "$(unix_uri vgs/home)"
  nbdcopy "$SHM/lv.bin" "$(unix_uri vgp/str)"
  "$CAIRN" status --json --control "$WORK/lvm-control.sock" >"$WORK/status.json" ||
    fail "cairn status failed"
  py - "$WORK/status.json" <<'EOF2'
import json, sys
j = json.load(open(sys.argv[1]))
by = {e["name"]: e for e in j["exports"]}
home = by["vgs/home"]["children"][0]
assert home["kind"] == "lv", home["kind"]
luks = home["children"][0]
assert luks["kind"] == "luks", luks["kind"]
md = luks["children"][0]
assert md["kind"] == "md" and md["md"]["level"] == "raid5", md
assert len(md["children"]) == 3, md["children"]
st = by["vgp/str"]["children"][0]
assert st["lv"]["stripes"] == 2 and len(st["children"]) == 2, st
print("status tree ok")
EOF2
  stop_cairn
  start_cairn --read-only --md "$m" --luks --lvm --key-file "$KEY"
  rm -f "$SHM/back.bin"; nbdcopy "$(unix_uri vgs/home)" "$SHM/back.bin"
  cmp -n 8388608 "$SHM/lv.bin" "$SHM/back.bin" || fail "vgs/home differs"
  stop_cairn
  # A VG missing a PV is skipped, with the reason, and the rest still comes up.
  mv "$d/p1.img" "$SHM/p1.away"
  "$CAIRN" scan "$d" --key-file "$KEY" >"$WORK/scan.txt" 2>&1 || true
  cat "$WORK/scan.txt"
  expect_contains "$(cat "$WORK/scan.txt")" "p0.img" "the PV of the incomplete VG is named"
  start_cairn --scan "$d" --key-file "$KEY"
  json "$CAIRN_JSON" 'sorted(e["name"] for e in j["exports"])' >"$WORK/names"
  expect_eq "$(cat "$WORK/names")" "['vgs/home', 'vgs/media']" "exports with a PV of vgp missing"
  stop_cairn
  mv "$SHM/p1.away" "$d/p1.img"
}

run_test scan_reports_and_writes_nothing t_scan_reports_and_writes_nothing
run_test serve_scan_brings_up_every_stack t_serve_scan_brings_up_every_stack
run_test key_dir_and_no_key t_key_dir_and_no_key
run_test config_equals_command_line t_config_equals_command_line
run_test scan_finds_lvm t_scan_finds_lvm
finish
