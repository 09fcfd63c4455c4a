#!/usr/bin/env bash
# md arrays and the verbs around them (issue 12): read-only verbs (`cairn scan`,
# `cairn md detail`, `cairn md examine`) leave every member byte as it was and say nothing
# about failures, even on an array being served or left dirty by a crash; a failed
# `md create --size` leaves no file behind; stale members and a shared failure; an old
# copy of a member put back is rebuilt in full (issue 30).
. "$(dirname "$0")/lib.sh"

# make_array LEVEL N NAME: members $SHM/arr/NAME{0..N-1}.img, 32 MiB each; sets MEMBERS
# and MD_LIST.
make_array() {
  local level=$1 n=$2 name=$3 i
  mkdir -p "$SHM/arr"
  MEMBERS=()
  for i in $(seq 0 $((n - 1))); do MEMBERS+=("$SHM/arr/$name$i.img"); done
  MD_LIST=$(IFS=,; echo "${MEMBERS[*]}")
  "$CAIRN" md create --level "$level" --raid-devices "$n" --size 32M --name "$name" \
    --chunk 64K --bitmap-chunk 64K "${MEMBERS[@]}" >/dev/null || fail "md create $name"
}

# look: the read-only verbs on the array, their stderr kept; none may speak of failing
# or updating a member.
look() {
  "$CAIRN" scan "$SHM/arr" >"$WORK/scan.out" 2>"$WORK/scan.err" || fail "cairn scan: $(cat "$WORK/scan.err")"
  "$CAIRN" md detail "${MEMBERS[@]}" >"$WORK/detail.out" 2>"$WORK/detail.err" ||
    fail "cairn md detail: $(cat "$WORK/detail.err")"
  "$CAIRN" md examine "${MEMBERS[@]}" >/dev/null 2>"$WORK/examine.err" || fail "cairn md examine"
  local f
  for f in scan detail examine; do
    if grep -Ei "failed|out of the array|superblock|closing|bitmap" "$WORK/$f.err"; then
      fail "cairn $f tried to write: $(cat "$WORK/$f.err")"
    fi
  done
}

t_read_only_verbs() {
  command -v nbdsh >/dev/null || skip "nbdsh is not installed (python3-libnbd)"
  make_array 5 4 ro
  # Safe mode off: the array stays dirty from the first write, as a crash in the middle
  # of writing leaves it, however long the looking takes.
  start_cairn --control "$WORK/ctl.sock" --safe-mode-delay 0 --md "$MD_LIST:ro"
  nbdsh -u "$(unix_uri ro)" -c '
h.pwrite(b"\x5a" * 65536, 0)
h.pwrite(b"\xa5" * 4096, 5 << 20)
h.flush()'
  # Served and written: active, bits set. Looking must not disturb it.
  look
  grep -q "failed\|out of the array" "$CAIRN_LOG" && fail "the server saw a failure: $(cat "$CAIRN_LOG")"
  nbdsh -u "$(unix_uri ro)" -c 'assert h.pread(4096, 5 << 20) == b"\xa5" * 4096'
  # A crash leaves it dirty with bits set; with no server writing, every byte must stay.
  stop_cairn KILL
  sha256sum "${MEMBERS[@]}" >"$WORK/sums.before"
  look
  sha256sum "${MEMBERS[@]}" >"$WORK/sums.after"
  cmp "$WORK/sums.before" "$WORK/sums.after" || fail "a read-only verb changed a member"
  grep -q "active" "$WORK/detail.out" || fail "detail does not show the array active: $(cat "$WORK/detail.out")"
  # And the next real start still finds it dirty and resyncs.
  start_cairn --control "$WORK/ctl.sock" --md "$MD_LIST:ro"
  nbdsh -u "$(unix_uri ro)" -c 'assert h.pread(65536, 0) == b"\x5a" * 65536'
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
}

# --size the filesystem cannot hold (ext4: 16 TiB per file): refused, and the files it
# made are gone; a file that was there before stays.
t_create_size_leaves_nothing() {
  local dir=$WORK/big
  mkdir -p "$dir"
  : >"$dir/keep.txt"
  expect_status 1 "$CAIRN" md create --level 1 --raid-devices 2 --size 100T "$dir/a.img" "$dir/b.img" \
    2>"$WORK/err.txt"
  cat "$WORK/err.txt"
  expect_contains "$(cat "$WORK/err.txt")" "cannot create member file" "the reason"
  expect_eq "$(ls "$dir")" "keep.txt" "files left after a failed create"
}

# After `md replace`, the original member list: the replaced member is stale (its role
# now belongs to the new device). The start is refused, precisely and once; --force
# starts it degraded (said once); the current members start as they are.
t_stale_after_replace() {
  command -v nbdsh >/dev/null || skip "nbdsh is not installed (python3-libnbd)"
  make_array 5 4 st
  local ctl=$WORK/ctl.sock old_list=$MD_LIST new=$SHM/arr/new.img out n
  truncate -s 32M "$new"
  start_cairn --control "$ctl" --md "$MD_LIST:st"
  nbdsh -u "$(unix_uri st)" -c 'h.pwrite(b"\x77" * 65536, 1 << 20); h.flush()'
  "$CAIRN" md replace st "${MEMBERS[1]}" --with "$new" --control "$ctl"
  for _ in $(seq 100); do
    "$CAIRN" md remove st "${MEMBERS[1]}" --control "$ctl" 2>/dev/null && break
    sleep 0.1
  done
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
  out=$(timeout -k 5 30 "$CAIRN" serve --control "$ctl" --listen "unix:$WORK/x.sock" \
    --md "$old_list:st" 2>&1 >/dev/null) && fail "the stale member list started: $out"
  say "$out"
  expect_contains "$out" "1 of 4 members missing" "missing roles counted"
  expect_contains "$out" "stale" "the reason"
  expect_contains "$out" "--force" "the way out"
  n=$(grep -o "st1.img" <<<"$out" | wc -l)
  expect_eq "$n" 1 "times the stale member is named"
  start_cairn --force --control "$ctl" --md "$old_list:st"
  n=$(grep -c "DEGRADED" "$CAIRN_LOG")
  expect_eq "$n" 1 "degraded warnings: $(cat "$CAIRN_LOG")"
  expect_contains "$(cat "$CAIRN_LOG")" "1 of 4 members missing: role 1 (" "the warning"
  nbdsh -u "$(unix_uri st)" -c 'assert h.pread(65536, 1 << 20) == b"\x77" * 65536'
  stop_cairn
}

# A RAID6 whose four members share one filesystem that fills up: members fail one after
# another by ENOSPC (their superblocks, already allocated, record each other's failures)
# until writes are refused. With space back, the restart is refused without --force and
# says --force can do it; with --force the freshest members are taken and every write
# that was acknowledged reads back.
t_shared_failure_force() {
  need_root
  command -v nbdsh >/dev/null || skip "nbdsh is not installed (python3-libnbd)"
  local fs=$WORK/full ctl=$WORK/ctl.sock out i
  mkdir -p "$fs"
  mount -t tmpfs -o size=20M tmpfs "$fs" || skip "cannot mount a tmpfs"
  register mount "$fs"
  MEMBERS=()
  for i in 0 1 2 3; do MEMBERS+=("$fs/f$i.img"); done
  MD_LIST=$(IFS=,; echo "${MEMBERS[*]}")
  "$CAIRN" md create --level 6 --raid-devices 4 --size 32M --name full --chunk 64K \
    "${MEMBERS[@]}" >/dev/null || fail "md create"
  start_cairn --control "$ctl" --md "$MD_LIST:full"
  ACKED=$WORK/acked.json nbdsh -u "$(unix_uri full)" -c '
import json, os
ok = []
for i in range(60):
    try:
        h.pwrite(bytes([i + 1]) * (1 << 20), i << 20)
        h.flush()
    except Exception as e:
        print("write", i, "refused:", e)
        break
    ok.append(i)
json.dump(ok, open(os.environ["ACKED"], "w"))
' || true
  [ -s "$WORK/acked.json" ] || fail "no record of the acknowledged writes"
  say "acknowledged: $(cat "$WORK/acked.json")"
  stop_cairn
  for m in "${MEMBERS[@]}"; do say "$m: events $(mdadm --examine "$m" | sed -n 's/^ *Events : //p')"; done
  mount -o remount,size=400M "$fs"
  out=$(timeout -k 5 30 "$CAIRN" serve --control "$ctl" --listen "unix:$WORK/x.sock" \
    --md "$MD_LIST:full" 2>&1 >/dev/null) && fail "started without --force: $out"
  say "$out"
  expect_contains "$out" "with force the freshest" "the refusal says what force does"
  start_cairn --force --control "$ctl" --md "$MD_LIST:full"
  expect_contains "$(cat "$CAIRN_LOG")" "started by force from the freshest members" "the risk said"
  ACKED=$WORK/acked.json nbdsh -u "$(unix_uri full)" -c '
import json, os
for i in json.load(open(os.environ["ACKED"])):
    assert h.pread(1 << 20, i << 20) == bytes([i + 1]) * (1 << 20), f"acknowledged MiB {i} lost"
'
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
}

# wait_idle CTL ARRAY: until the served array has no dirty bitmap bit (bits clear once
# idle for 5 s; safe mode marked the array clean 200 ms after the last write); 30 s at most.
wait_idle() {
  local i st
  for i in $(seq 300); do
    st=$(curl -s --unix-socket "$1" "http://cairn/v1/arrays/$2" |
      jq -r '"\(.detail.bitmap.dirty) \(.detail.state.clean)"')
    [ "${st% *}" = 0 ] && { say "idle: dirty bits, clean: $st"; return 0; }
    sleep 0.1
  done
  fail "$2 did not go idle (bits cleared) within 30 s: $st"
}

# x_reads URI OFFSET FILE: reads FILE's bytes back from OFFSET 64 times in 128 KiB pieces
# (RAID1 reads take turns between the mirrors); prints how many differ.
x_reads() {
  X=$3 nbdsh -u "$1" -c "
import os
x = open(os.environ['X'], 'rb').read()
n = 128 << 10
print(sum(h.pread(n, $2 + i * n) != x[i * n:(i + 1) * n] for i in range(64)))"
}

# A member that comes back as an older copy of itself (issue 30): RAID1 with 1 MiB bitmap
# chunks, data written, the array idle; member 1's file copied; 8 MiB X written, idle again
# (bits cleared, marked clean); member 1 failed and removed, its old copy put back and
# added. The copy's events are below the bitmap's events_cleared, so md's rule makes it a
# full recovery (not "only the N bytes the bitmap marks"), and 64 reads of X through NBD,
# both mirrors in turn, all return X.
t_stale_copy_of_a_member() {
  need_tool nbdsh jq curl mdadm
  local ctl=$WORK/oc.sock out
  mkdir -p "$SHM/arr"
  MEMBERS=("$SHM/arr/oc0.img" "$SHM/arr/oc1.img")
  "$CAIRN" md create --level 1 --raid-devices 2 --size 24M --name oc --bitmap-chunk 1M \
    "${MEMBERS[@]}" >/dev/null || fail "md create"
  random_file "$WORK/a" 8M
  random_file "$WORK/x" 8M
  start_cairn --control "$ctl" --md "$(IFS=,; echo "${MEMBERS[*]}"):oc"
  local uri
  uri=$(unix_uri oc)
  A=$WORK/a nbdsh -u "$uri" -c 'import os; h.pwrite(open(os.environ["A"], "rb").read(), 4 << 20); h.flush()'
  wait_idle "$ctl" oc
  cp --sparse=always "${MEMBERS[1]}" "$SHM/arr/oc1.old"
  X=$WORK/x nbdsh -u "$uri" -c 'import os; h.pwrite(open(os.environ["X"], "rb").read(), 4 << 20); h.flush()'
  wait_idle "$ctl" oc
  say "events: copy $(mdadm --examine "$SHM/arr/oc1.old" | sed -n 's/^ *Events : //p'), array $(mdadm --examine "${MEMBERS[0]}" | sed -n 's/^ *Events : //p')"
  "$CAIRN" md fail oc "${MEMBERS[1]}" --control "$ctl" >/dev/null || fail "md fail"
  "$CAIRN" md remove oc "${MEMBERS[1]}" --control "$ctl" >/dev/null || fail "md remove"
  cp --sparse=always "$SHM/arr/oc1.old" "${MEMBERS[1]}"
  out=$("$CAIRN" md add oc "${MEMBERS[1]}" --control "$ctl" 2>&1) || fail "md add: $out"
  say "$out"
  local i st
  for i in $(seq 300); do
    st=$(curl -s --unix-socket "$ctl" "http://cairn/v1/arrays/oc" |
      jq -r '"\(.background.action) \(.background.state) \(.detail.state.degraded)"')
    [ "$st" = "recovery finished false" ] && break
    sleep 0.1
  done
  expect_eq "$st" "recovery finished false" "rebuilt"
  expect_eq "$(x_reads "$uri" $((4 << 20)) "$WORK/x")" 0 "reads of X returning old data"
  expect_contains "$out" "full recovery" "the old copy is rebuilt in full"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  for m in "${MEMBERS[@]}"; do
    expect_eq "$(mdadm --examine "$m" | sed -n 's/^ *State : //p')" clean "$m: state"
  done
  expect_eq "$(mdadm --examine "${MEMBERS[1]}" | sed -n 's/^ *Events : //p')" \
    "$(mdadm --examine "${MEMBERS[0]}" | sed -n 's/^ *Events : //p')" "events on both members"
}

run_test read_only_verbs_write_nothing t_read_only_verbs
run_test stale_copy_of_a_member t_stale_copy_of_a_member
run_test create_size_leaves_nothing t_create_size_leaves_nothing
run_test stale_after_replace t_stale_after_replace
run_test shared_failure_force t_shared_failure_force
finish
