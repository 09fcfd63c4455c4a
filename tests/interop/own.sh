#!/usr/bin/env bash
# One writer per device. While `cairn serve` holds members, PVs and LUKS files for writing,
# every other writer is refused with the holder named ("in use by PID N (cairn serve ...)",
# exit 5 as cryptsetup's "device busy"): a second server on the same members, `md create
# --force`, `luks format --force`, `lvm lvremove` and `lvrename`, and a member exported raw
# beside its own array. Read-only verbs (md examine, md detail, luks dump, lvm lvs, scan) work
# and warn once that the data may be changing. The server's own changes through its
# control socket (md fail, remove, re-add) still work, and after it stops the next one
# starts.
. "$(dirname "$0")/lib.sh"

CHEAP=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)

# expect_busy WHAT CMD...: CMD fails with exit 5 and names the running server.
expect_busy() {
  local what=$1 rc=0 err
  shift
  # Bounded: a server that is let in serves until stopped.
  err=$(timeout -k 2 20 "$@" 2>&1 >/dev/null) || rc=$?
  say "$what: exit $rc: $err"
  expect_eq "$rc" 5 "$what: exit status"
  expect_contains "$err" "in use by PID $CAIRN_PID (cairn serve" "$what: names the holder"
}

# expect_warned WHAT STDERR-FILE: one warning that the data may be changing.
expect_warned() {
  local n
  n=$(grep -c "may be changing" "$2" || true)
  expect_eq "$n" 1 "$1: warnings in $(cat "$2")"
  expect_contains "$(cat "$2")" "in use by PID $CAIRN_PID (cairn serve" "$1: names the writer"
}

make_array() {
  M=("$SHM/m0.img" "$SHM/m1.img" "$SHM/m2.img")
  rm -f "${M[@]}"
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --size 16M --name own "${M[@]}" >/dev/null
  LIST=$(IFS=,; echo "${M[*]}")
}

events() { "$CAIRN" md examine "$1" 2>/dev/null | sed -n 's/^ *Events : //p'; }

t_second_server_refused() {
  need_tool nbdcopy
  make_array
  start_cairn --control "$WORK/c1.sock" --md "$LIST:own"
  local first=$CAIRN_PID
  expect_busy "second serve --md" "$CAIRN" serve --listen "unix:$WORK/x.sock" \
    --control "$WORK/x-ctl.sock" --md "$LIST:own"
  # Nothing of the first server's array was touched by the refused one.
  random_file "$WORK/d" 8M
  nbdcopy "$WORK/d" "$(unix_uri own)"
  nbdcopy "$(unix_uri own)" "$WORK/back"
  cmp -n $((8 << 20)) "$WORK/d" "$WORK/back" || fail "data through the first server"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "first server's exit"
  # The first one gone, the next one starts and reads what the first wrote.
  start_cairn --control "$WORK/c2.sock" --md "$LIST:own"
  [ "$CAIRN_PID" != "$first" ] || fail "the same server?"
  nbdcopy "$(unix_uri own)" "$WORK/back2"
  cmp -n $((8 << 20)) "$WORK/d" "$WORK/back2" || fail "data through the second server"
  stop_cairn
}

t_member_beside_its_array() {
  make_array
  local rc=0 err
  err=$(timeout -k 2 20 "$CAIRN" serve --listen "unix:$WORK/x.sock" --control "$WORK/x-ctl.sock" \
    --md "$LIST:own" "${M[1]}:raw" 2>&1 >/dev/null) || rc=$?
  say "exit $rc: $err"
  expect_eq "$rc" 5 "exit status"
  expect_contains "$err" "m1.img is already open for writing in this process" "the refusal"
  # Alone, the file serves (nobody else holds it).
  start_cairn --control "$WORK/c.sock" "${M[1]}:raw"
  stop_cairn
}

t_create_and_format_refused() {
  need_tool cryptsetup
  make_array
  start_cairn --control "$WORK/c.sock" --md "$LIST:own"
  local before
  before=$(events "${M[0]}")
  expect_busy "md create --force" "$CAIRN" md create --force --level 5 --chunk 64K \
    --raid-devices 3 --name other "${M[@]}"
  stop_cairn
  expect_eq "$(events "${M[0]}")" "$before" "events after the refused create (and a clean stop)"
  expect_contains "$("$CAIRN" md examine "${M[0]}")" "own" "still the array it was"

  printf %s 'own test passphrase' >"$WORK/k1"
  printf %s 'another passphrase' >"$WORK/k2"
  truncate -s 32M "$SHM/l.img"
  "$CAIRN" luks format -q --key-file "$WORK/k1" "${CHEAP[@]}" "$SHM/l.img" >/dev/null
  local uuid
  uuid=$(cryptsetup luksUUID "$SHM/l.img")
  start_cairn --control "$WORK/c3.sock" --luks "$SHM/l.img:vol" --key-file "$WORK/k1"
  expect_busy "luks format --force" "$CAIRN" luks format -q --force --key-file "$WORK/k2" \
    "${CHEAP[@]}" "$SHM/l.img"
  # Read-only verbs work while it is served, with one warning.
  "$CAIRN" luks dump "$SHM/l.img" >"$WORK/dump.txt" 2>"$WORK/dump.err" || fail "luks dump: $(cat "$WORK/dump.err")"
  expect_warned "luks dump" "$WORK/dump.err"
  stop_cairn
  expect_eq "$(cryptsetup luksUUID "$SHM/l.img")" "$uuid" "the LUKS header is the one served"
  cryptsetup open --test-passphrase --key-file "$WORK/k1" "$SHM/l.img" || fail "the old key opens it"
}

t_lvm_changes_refused() {
  local p0=$SHM/p0.img p1=$SHM/p1.img devs
  truncate -s 32M "$p0" "$p1"
  devs="$p0,$p1"
  "$CAIRN" lvm pvcreate "$p0" "$p1" >/dev/null
  "$CAIRN" lvm vgcreate -s 4M vgo "$p0" "$p1" >/dev/null
  "$CAIRN" lvm lvcreate -n a -L 8M --devices "$devs" vgo >/dev/null
  "$CAIRN" lvm lvcreate -n b -L 8M --devices "$devs" vgo >/dev/null
  start_cairn --control "$WORK/c.sock" --lvm "$devs"
  expect_busy "lvremove" "$CAIRN" lvm lvremove --devices "$devs" vgo/a
  expect_busy "lvrename" "$CAIRN" lvm lvrename --devices "$devs" vgo b c
  expect_busy "lvcreate" "$CAIRN" lvm lvcreate -n d -L 4M --devices "$devs" vgo
  "$CAIRN" lvm lvs --devices "$devs" >"$WORK/lvs.txt" 2>"$WORK/lvs.err" || fail "lvs: $(cat "$WORK/lvs.err")"
  expect_warned "lvm lvs" "$WORK/lvs.err"
  expect_contains "$(cat "$WORK/lvs.txt")" " b " "lvs lists b"
  stop_cairn
  "$CAIRN" lvm lvremove --devices "$devs" vgo/a || fail "lvremove once nobody serves it"
  "$CAIRN" lvm lvrename --devices "$devs" vgo b c || fail "lvrename once nobody serves it"
}

t_readers_warned() {
  make_array
  start_cairn --control "$WORK/c.sock" --md "$LIST:own"
  "$CAIRN" md examine "${M[@]}" >"$WORK/ex.txt" 2>"$WORK/ex.err" || fail "md examine: $(cat "$WORK/ex.err")"
  expect_warned "md examine" "$WORK/ex.err"
  expect_contains "$(cat "$WORK/ex.txt")" "Events" "examine output"
  "$CAIRN" md detail "${M[@]}" >"$WORK/detail.txt" 2>"$WORK/detail.err" || fail "md detail: $(cat "$WORK/detail.err")"
  expect_warned "md detail" "$WORK/detail.err"
  "$CAIRN" scan "$SHM" >"$WORK/scan.txt" 2>"$WORK/scan.err" || fail "scan: $(cat "$WORK/scan.err")"
  expect_warned "scan" "$WORK/scan.err"
  expect_contains "$(cat "$WORK/scan.txt")" "own" "scan finds the array"
  stop_cairn
  # Nobody writes: no warning.
  "$CAIRN" md examine "${M[0]}" >/dev/null 2>"$WORK/ex2.err"
  expect_eq "$(grep -c "may be changing" "$WORK/ex2.err" || true)" 0 "warning with no writer"
}

# The server's own changes through its control socket still open members; a member the
# array let go of can come back; another server's file is refused by name.
t_daemon_changes_still_work() {
  need_tool jq
  make_array
  truncate -s 16M "$SHM/spare.img"
  CTL=$WORK/c.sock
  start_cairn --control "$CTL" --md "$LIST:own"
  local out
  out=$("$CAIRN" md add own "${M[1]}" --control "$CTL" 2>&1) || fail "re-adding a present member: $out"
  expect_contains "$out" "nothing to do" "a present member"
  "$CAIRN" md fail own "${M[0]}" --control "$CTL"
  "$CAIRN" md remove own "${M[0]}" --control "$CTL"
  out=$("$CAIRN" md add own "${M[0]}" --control "$CTL" 2>&1) || fail "re-add after remove: $out"
  say "$out"
  out=$("$CAIRN" md add own "$SHM/spare.img" --control "$CTL" 2>&1) || fail "add a spare: $out"
  say "$out"
  # A file another server writes cannot become a member here.
  local main=$CAIRN_PID mainsock=$CAIRN_SOCK
  truncate -s 16M "$SHM/theirs.img"
  start_cairn --control "$WORK/c2.sock" "$SHM/theirs.img:theirs"
  local rc=0
  out=$("$CAIRN" md add own "$SHM/theirs.img" --control "$CTL" 2>&1) || rc=$?
  say "exit $rc: $out"
  [ "$rc" != 0 ] || fail "a file another server writes was added"
  expect_contains "$out" "in use by PID $CAIRN_PID (cairn serve" "names the other server"
  stop_cairn
  CAIRN_PID=$main
  CAIRN_SOCK=$mainsock
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# Block devices are claimed with O_EXCL, as mdadm and lvm claim them: a second cairn is
# refused by name, and so is mdadm's write; mdadm --examine and cairn's readers still read.
t_block_devices_exclusive() {
  need_root
  need_tool losetup mdadm
  local i l loops=() list rc err
  for i in 0 1 2; do
    truncate -s 32M "$SHM/b$i.img"
    l=$(losetup -f --show "$SHM/b$i.img") || fail "losetup $SHM/b$i.img"
    register loop "$l"
    loops+=("$l")
  done
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --name blk "${loops[@]}" >/dev/null
  list=$(IFS=,; echo "${loops[*]}")
  start_cairn --control "$WORK/c.sock" --md "$list:blk"
  expect_busy "second serve on block devices" "$CAIRN" serve --listen "unix:$WORK/x.sock" \
    --control "$WORK/x-ctl.sock" --md "$list:blk"
  rc=0
  err=$(mdadm --zero-superblock "${loops[0]}" 2>&1) || rc=$?
  say "mdadm --zero-superblock: exit $rc: $err"
  [ "$rc" != 0 ] || fail "mdadm zeroed the superblock of a device cairn serves"
  mdadm --examine "${loops[0]}" >/dev/null || fail "mdadm --examine of a served device"
  "$CAIRN" md examine "${loops[0]}" >/dev/null 2>"$WORK/ex.err" || fail "md examine: $(cat "$WORK/ex.err")"
  expect_warned "md examine of a block device" "$WORK/ex.err"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "exit status"
  start_cairn --control "$WORK/c2.sock" --md "$list:blk"
  stop_cairn
}

run_test second_server_refused t_second_server_refused
run_test member_beside_its_array t_member_beside_its_array
run_test create_and_format_refused t_create_and_format_refused
run_test lvm_changes_refused t_lvm_changes_refused
run_test readers_warned t_readers_warned
run_test daemon_changes_still_work t_daemon_changes_still_work
run_test block_devices_exclusive t_block_devices_exclusive
finish
