#!/usr/bin/env bash
# Arrays that survive: a member failed under fio verify=crc32c load, a spare added through
# `cairn md add`, the rebuild running and finishing while fio goes on; 0 verify errors,
# then `cairn md check` finds 0 mismatches and mdadm reads the rebuilt members. For RAID1,
# RAID5, RAID6 and RAID10; and a second failure during a RAID6 rebuild.
. "$(dirname "$0")/lib.sh"

# serve_array NAME: serves the array in ${M[@]} with a control socket and an event log;
# sets CTL, EVENTS, URI and SIZE (the export's bytes).
serve_array() {
  local name=$1
  CTL=$WORK/c$((CAIRN_N + 1)).sock
  EVENTS=$WORK/events$((CAIRN_N + 1)).log
  : >"$EVENTS"
  # The minimum speed applies while fio runs: fast enough to finish during the run.
  start_cairn --control "$CTL" --speed-limit-min 40000 --speed-limit-max 200000 \
    --on-event "echo \"\$CAIRN_EVENT|\$CAIRN_DEVICE|\$CAIRN_MEMBER|\$CAIRN_MESSAGE\" >>$EVENTS" \
    --md "$(IFS=,; echo "${M[*]}"):$name"
  URI=$(unix_uri "$name")
  SIZE=$(nbdinfo --size "$URI")
}

md() { "$CAIRN" md "$@" --control "$CTL"; }

# bg_state ARRAY: "ACTION STATE" of the array's background work, or "none".
bg_state() {
  "$CAIRN" --json status --control "$CTL" >/dev/null 2>&1 || true
  curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$1" |
    jq -r 'if .background then "\(.background.action) \(.background.state)" else "none" end'
}

degraded() {
  curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$1" | jq -r .detail.state.degraded
}

# wait_rebuilt ARRAY SECS: waits until a recovery has finished and the array is not
# degraded; fails after SECS.
wait_rebuilt() {
  local i st
  for i in $(seq $(($2 * 10))); do
    st=$(bg_state "$1")
    case $st in
      "recovery finished") [ "$(degraded "$1")" = false ] && return 0 ;;
      *failed*) fail "rebuild of $1 failed: $st" ;;
    esac
    sleep 0.1
  done
  fail "rebuild of $1 did not finish within $2 s (last: $st)"
}

# start_fio: random read/write with crc32c verification over the whole export, paced to
# last about RUN seconds; sets FIO_PID.
start_fio() {
  local rate=$((SIZE / RUN))
  fio --name=verify --ioengine=nbd --uri="$URI" --rw=randrw --rwmixread=30 \
    --bsrange=4k-64k --iodepth=4 --size="$SIZE" --verify=crc32c --verify_backlog=64 \
    --verify_fatal=1 --rate="$rate,$rate" --output-format=json --output="$WORK/fio.json" \
    >"$WORK/fio.stdout" 2>"$WORK/fio.err" &
  FIO_PID=$!
  register pid "$FIO_PID"
}

fio_ok() {
  local status=0
  wait "$FIO_PID" || status=$?
  [ "$status" = 0 ] || fail "fio failed ($status): $(tail -5 "$WORK/fio.err") $(tail -5 "$WORK/fio.stdout")"
  local errs verified
  errs=$(jq '[.jobs[].error] | add' "$WORK/fio.json")
  expect_eq "$errs" 0 "fio errors"
  grep -qi "verify" "$WORK/fio.err" && fail "fio reported verify trouble: $(grep -i verify "$WORK/fio.err" | head -3)"
  verified=$(jq '[.jobs[].read.io_bytes] | add' "$WORK/fio.json")
  say "fio: read (and verified) $verified bytes, 0 errors"
}

check_clean() {
  md check "$1" --wait >"$WORK/check.txt" || fail "cairn md check $1: $(cat "$WORK/check.txt")"
  cat "$WORK/check.txt"
  expect_contains "$(cat "$WORK/check.txt")" " 0 mismatched sectors" "check result"
}

# rebuild_under_fio NAME LEVEL N [CREATE-ARGS...]
rebuild_under_fio() {
  need_tool fio jq curl nbdinfo mdadm
  local name=$1 level=$2 n=$3 i
  shift 3
  M=()
  for i in $(seq 0 $((n - 1))); do M+=("$SHM/$name-$i.img"); done
  "$CAIRN" md create --level "$level" --raid-devices "$n" --size 48M --name "$name" "$@" "${M[@]}" >/dev/null
  truncate -s 48M "$SHM/$name-spare.img"
  serve_array "$name"
  RUN=12
  start_fio
  sleep $((RUN / 4))
  kill -0 "$FIO_PID" 2>/dev/null || fail "fio ended before the failure"
  md fail "$name" "${M[1]}"
  expect_eq "$(degraded "$name")" true "degraded after the failure"
  md add "$name" "$SHM/$name-spare.img"
  wait_rebuilt "$name" $((RUN * 2))
  kill -0 "$FIO_PID" 2>/dev/null || fail "the rebuild did not finish during the fio run"
  say "rebuild finished while fio was running"
  "$CAIRN" status --control "$CTL"
  fio_ok
  check_clean "$name"
  for ev in Fail RebuildStarted RebuildFinished SpareActive; do
    grep -q "^$ev|" "$EVENTS" || fail "no $ev event: $(cat "$EVENTS")"
  done
  md remove "$name" "${M[1]}"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  # mdadm reads the rebuilt member: right checksum, the failed member's role, in sync.
  mdadm --examine "$SHM/$name-spare.img" >"$WORK/examine.txt" || fail "mdadm --examine: $(cat "$WORK/examine.txt")"
  expect_contains "$(cat "$WORK/examine.txt")" "Checksum : " "examine"
  grep -q "Checksum.*correct" "$WORK/examine.txt" || fail "bad checksum: $(cat "$WORK/examine.txt")"
  expect_contains "$(cat "$WORK/examine.txt")" "Device Role : Active device 1" "the spare took role 1"
  expect_contains "$(cat "$WORK/examine.txt")" "State : clean" "clean after the stop"
  grep -q "Recovery Offset" "$WORK/examine.txt" && fail "a finished rebuild still has a recovery offset"
  # And cairn assembles the new set.
  M[1]=$SHM/$name-spare.img
  "$CAIRN" md detail --json "${M[@]}" | jq -e '.state.degraded == false and .state.clean == true' >/dev/null ||
    fail "the rebuilt set does not assemble clean: $("$CAIRN" md detail "${M[@]}")"
}

t_raid6() { rebuild_under_fio r6 6 4 --chunk 64K; }
t_raid5() { rebuild_under_fio r5 5 4 --chunk 64K; }
t_raid1() { rebuild_under_fio r1 1 2; }
t_raid10() { rebuild_under_fio r10 10 4 --chunk 64K; }

# RAID6: a second member fails while the first rebuild runs: fio sees no error, the
# rebuild finishes, a second spare rebuilds the second role, and check finds nothing.
t_raid6_second_failure() {
  need_tool fio jq curl nbdinfo
  local name=d6 i
  M=()
  for i in 0 1 2 3 4; do M+=("$SHM/$name-$i.img"); done
  "$CAIRN" md create --level 6 --chunk 64K --raid-devices 5 --size 48M --name "$name" "${M[@]}" >/dev/null
  truncate -s 48M "$SHM/$name-s1.img" "$SHM/$name-s2.img"
  CTL=$WORK/c$((CAIRN_N + 1)).sock
  EVENTS=$WORK/events$((CAIRN_N + 1)).log
  start_cairn --control "$CTL" --speed-limit-min 8000 --speed-limit-max 8000 \
    --md "$(IFS=,; echo "${M[*]}"):$name"
  URI=$(unix_uri "$name")
  SIZE=$(nbdinfo --size "$URI")
  RUN=16
  start_fio
  sleep 3
  md fail "$name" "${M[1]}"
  md add "$name" "$SHM/$name-s1.img"
  sleep 2
  expect_eq "$(bg_state "$name")" "recovery running" "first rebuild running"
  md fail "$name" "${M[3]}"
  say "second member failed during the rebuild"
  wait_rebuilt_or_degraded() {
    local i st
    for i in $(seq 400); do
      st=$(bg_state "$name")
      [ "$st" = "recovery finished" ] && return 0
      case $st in *failed*) fail "rebuild failed: $st" ;; esac
      sleep 0.1
    done
    fail "first rebuild did not finish: $st"
  }
  wait_rebuilt_or_degraded
  md add "$name" "$SHM/$name-s2.img"
  wait_rebuilt "$name" 60
  fio_ok
  check_clean "$name"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
}

# A member failed, removed, written around (a known amount) and added back: the bitmap
# limits the rebuild to the chunks written meanwhile; the data is right without any other
# member; a clean stop leaves 0 dirty bits, and mdadm -X agrees on every member.
t_bitmap_readd() {
  need_tool fio jq curl nbdinfo mdadm losetup nbdcopy
  need_root
  local name=bm i
  M=()
  for i in 0 1 2 3; do M+=("$SHM/$name-$i.img"); done
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 4 --size 64M --bitmap-chunk 256K \
    --name "$name" "${M[@]}" >/dev/null
  serve_array "$name"
  fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --size="$SIZE" >/dev/null ||
    fail "fill"
  # Bits clear once idle for the daemon sleep (5 s) after a flush.
  local dirty
  for i in $(seq 100); do
    dirty=$(curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$name" | jq .detail.bitmap.dirty)
    [ "$dirty" = 0 ] && break
    sleep 0.2
  done
  expect_eq "$dirty" 0 "bits cleared after the fill"
  md fail "$name" "${M[2]}"
  md remove "$name" "${M[2]}"
  # A known amount: 12 writes of 4 KiB, scattered.
  fio --name=some --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --size="$SIZE" \
    --number_ios=12 --randseed=7 >/dev/null || fail "writes while degraded"
  local info chunk
  info=$(curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$name")
  dirty=$(jq .detail.bitmap.dirty <<<"$info")
  chunk=$(jq .detail.bitmap.chunk_bytes <<<"$info")
  say "degraded: $dirty dirty bits of $chunk bytes"
  [ "$dirty" -ge 1 ] && [ "$dirty" -le 12 ] || fail "dirty bits after 12 writes: $dirty"
  local msg
  msg=$(md add "$name" "${M[2]}")
  expect_contains "$msg" "re-added into role 2; only the" "bitmap-guided re-add"
  wait_rebuilt "$name" 30
  local worked
  worked=$(curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$name" | jq .background.worked_bytes)
  say "rebuilt $worked bytes for $dirty dirty bits of $chunk"
  [ "$worked" -le $(((dirty + 1) * chunk)) ] || fail "rebuilt $worked bytes, more than ($dirty + 1) x $chunk"
  [ "$worked" -gt 0 ] || fail "nothing rebuilt"
  local want
  want=$(nbdcopy "$URI" - | sha256sum | cut -d' ' -f1)
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  for i in 0 1 2 3; do
    bitmap_x "${M[$i]}"
    expect_eq "$X_DIRTY" 0 "${M[$i]}: dirty bits after a clean stop"
    expect_eq "$X_EVENTS" "$(mdadm --examine "${M[$i]}" | sed -n 's/^ *Events : //p')" "bitmap events"
  done
  # The re-added member holds its part: serve without member 0 and compare.
  M=("${M[1]}" "${M[2]}" "${M[3]}")
  serve_array "$name"
  expect_eq "$(nbdcopy "$URI" - | sha256sum | cut -d' ' -f1)" "$want" "data without member 0"
  stop_cairn
}

# Scrub through the CLI: bytes corrupted on one RAID6 member behind cairn's back are found
# by `md check` (the stripe, and the member the P/Q syndromes blame), which changes
# nothing; `md repair` rewrites them; a second check is clean and the data is the original.
t_scrub() {
  need_tool jq curl nbdinfo nbdcopy
  local name=sc i
  M=()
  for i in 0 1 2 3 4; do M+=("$SHM/$name-$i.img"); done
  "$CAIRN" md create --level 6 --chunk 64K --raid-devices 5 --size 32M --name "$name" "${M[@]}" >/dev/null
  serve_array "$name"
  random_file "$WORK/data" "$SIZE"
  nbdcopy "$WORK/data" "$URI"
  stop_cairn
  # Member 2's data area, 64 KiB into stripe 5 (a data chunk or P or Q: the syndromes tell).
  local off
  off=$("$CAIRN" md examine --json "${M[2]}" | jq '.[0].examine.data_offset')
  off=$((off * 512 + 5 * 65536 + 4096))
  printf 'corrupted!' | dd of="${M[2]}" bs=1 seek="$off" conv=notrunc status=none
  local before
  before=$(sha256sum "${M[@]}")
  serve_array "$name"
  md check "$name" --wait >"$WORK/check.txt" 2>&1 && fail "check passed over a corrupted member"
  cat "$WORK/check.txt"
  expect_contains "$(cat "$WORK/check.txt")" "8 mismatched sectors" "one page found"
  grep -Eq '^ +(data|p|q) +5 .* role 2$' "$WORK/check.txt" ||
    fail "check did not blame role 2 in stripe 5: $(cat "$WORK/check.txt")"
  grep -q "MismatchesFound" <(sleep 1.5; "$CAIRN" status --control "$CTL") ||
    fail "no MismatchesFound event: $("$CAIRN" status --control "$CTL")"
  stop_cairn
  expect_eq "$(sha256sum "${M[@]}")" "$before" "check wrote nothing"
  serve_array "$name"
  md repair "$name" --wait >"$WORK/repair.txt" 2>&1 && fail "repair reported nothing to repair"
  expect_contains "$(cat "$WORK/repair.txt")" "repaired" "repair"
  check_clean "$name"
  expect_eq "$(nbdcopy "$URI" - | sha256sum | cut -d' ' -f1)" \
    "$(sha256sum <"$WORK/data" | cut -d' ' -f1)" "data after the repair"
  stop_cairn
}

# Refusals through the CLI: each one sentence, nothing changed.
t_refusals() {
  need_tool jq curl
  M=("$SHM/x0.img" "$SHM/x1.img" "$SHM/x2.img")
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --size 16M --name x "${M[@]}" >/dev/null
  serve_array x
  local out
  out=$(md fail x nope.img 2>&1) && fail "failing an unknown member worked"
  expect_contains "$out" "no member named nope.img" "unknown member"
  out=$(md fail nosuch "${M[0]}" 2>&1) && fail "an unknown array worked"
  expect_contains "$out" "no md array named" "unknown array"
  md fail x "${M[0]}"
  out=$(md fail x "${M[1]}" 2>&1) && fail "failing a second RAID5 member worked"
  expect_contains "$out" "could not serve all its data" "second failure refused"
  out=$(md remove x "${M[1]}" 2>&1) && fail "removing an active member worked"
  expect_contains "$out" "fail it first" "active member"
  truncate -s 4M "$SHM/small.img"
  out=$(md add x "$SHM/small.img" 2>&1) && fail "a too small spare was added"
  expect_contains "$out" "need at least" "too small"
  out=$(md fail x "${M[0]}" 2>&1)
  expect_contains "$out" "nothing to do" "repeat"
  # A failed member not removed cannot be added back as it is (mdadm refuses too): the
  # array would stay degraded while the answer said "nothing to do".
  out=$(md add x "${M[0]}" 2>&1) && fail "md add of a failed, unremoved member exited 0: $out"
  expect_contains "$out" "remove it first (cairn md remove x ${M[0]})" "add of a failed member"
  expect_eq "$(degraded x)" true "still degraded"
  out=$(md check x 2>&1) && fail "check of a degraded array started"
  say "$out"
  stop_cairn
}

if [ -n "${ONLY:-}" ]; then
  for t in $ONLY; do run_test "$t" "t_$t"; done
  finish
  exit
fi
run_test raid6-rebuild-under-fio t_raid6
run_test raid5-rebuild-under-fio t_raid5
run_test raid1-rebuild-under-fio t_raid1
run_test raid10-rebuild-under-fio t_raid10
run_test raid6-second-failure t_raid6_second_failure
run_test bitmap-readd t_bitmap_readd
run_test scrub t_scrub
run_test refusals t_refusals
finish
