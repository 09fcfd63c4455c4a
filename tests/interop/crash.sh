#!/usr/bin/env bash
# Crashes: `kill -9` of `cairn serve` at a random moment while fio writes random blocks
# (crc32c headers) to a RAID6 or RAID5 export, then a restart on the same member files
# and `fio --verify_only`: every write fio saw completed must read back intact.
#
# Each iteration:
#   1. cairn serves the array (from the second iteration on it comes up dirty: the
#      previous one was killed; it must assemble without --force, all members are there,
#      and resync the bitmap's dirty chunks in the background);
#   2. fio writes random blocks (4k-64k, iodepth 4-8, one or two connections) with
#      verify=crc32c, do_verify=0 and verify_state_save=1; a fixed randseed per
#      iteration makes the offsets, sizes and contents a function of that seed;
#   3. after 0.3-3 s, kill -9 of cairn: fio fails (expected) and, on its way out, writes
#      the number of writes it issued and the last iodepth ones that completed to
#      local-crash-N-verify.state in the working directory ($WORK);
#   4. the superblocks say "active" (the array was written and not closed);
#   5. cairn restarts, and fio runs the same job with --verify_only
#      --verify_state_load=1: it regenerates the same writes without issuing them and
#      reads back every write up to the first one that had not completed (in the last
#      iodepth window it skips nothing and checks only the writes the state lists as
#      completed); its exit status must be 0, its JSON must show no error and a non-zero
#      number of bytes read (verified);
#   6. sometimes (and always at the end) the resync is let finish: the superblocks then
#      say "clean"; at the end `cairn md check --wait` must find 0 mismatched sectors.
#
# The check can fail: overwriting one written 4K block in a member file (with cairn
# stopped) before step 5 makes fio report "verify: bad magic header" / "crc32c: verify
# failed" and exit 1 (tried by hand when this test was written; CAIRN_CRASH_CORRUPT=1
# does it in the first iteration and expects the failure, to prove the test still bites).
#
# Kills: 5 per array by default, 50 with CAIRN_LONG=1 (or CAIRN_KILLS=N). The random
# choices (delays, seeds, depths) come from a generator seeded by CAIRN_SEED (printed;
# default: random), so a failing run's choices can be replayed; where in the write
# stream the kill lands still depends on the machine's speed.
. "$(dirname "$0")/lib.sh"

if [ "${CAIRN_LONG:-0}" = 1 ]; then KILLS=${CAIRN_KILLS:-50}; else KILLS=${CAIRN_KILLS:-5}; fi
SEED=${CAIRN_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
say "crash: seed $SEED, $KILLS kills per array (replay: CAIRN_SEED=$SEED${CAIRN_LONG:+ CAIRN_LONG=$CAIRN_LONG})"

# rng N: sets R to a number in [0, N) (a 64-bit LCG in bash arithmetic, the same on every
# bash; not $RANDOM, which bash reseeds in subshells).
rng() {
  RNG=$((RNG * 6364136223846793005 + 1442695040888963407))
  R=$((((RNG >> 33) & 0x7fffffff) % $1))
}

# serve NAME: serves ${M[@]} as NAME with a control socket; sets CTL, URI, SIZE.
serve() {
  CTL=$WORK/c$((CAIRN_N + 1)).sock
  start_cairn --control "$CTL" --md "$(IFS=,; echo "${M[*]}"):$1"
  URI=$(unix_uri "$1")
  SIZE=$(nbdinfo --size "$URI")
}

# bg_state ARRAY: "ACTION STATE" of the array's background work, or "none".
bg_state() {
  curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$1" |
    jq -r 'if .background then "\(.background.action) \(.background.state)" else "none" end'
}

# wait_resynced ARRAY: waits (60 s at most) until no resync is pending or running.
wait_resynced() {
  local i st
  for i in $(seq 600); do
    st=$(bg_state "$1")
    case $st in
      none | "resync finished") return 0 ;;
      *failed*) fail "resync of $1 failed: $st; log: $(tail -5 "$CAIRN_LOG")" ;;
    esac
    sleep 0.1
  done
  fail "resync of $1 did not finish within 60 s (last: $st)"
}

# sb_states: the State line of every member's superblock, as mdadm reads it, one word each.
sb_states() {
  local m
  for m in "${M[@]}"; do
    mdadm --examine "$m" | sed -n 's/^ *State : //p' | awk '{print $1}'
  done | sort -u | tr '\n' ' ' | sed 's/ $//'
}

# fio_job OUT EXTRA...: the iteration's job (FIO_ARGS) with EXTRA; JSON to OUT.json.
fio_job() {
  local out=$1
  shift
  timeout 120 fio --name=crash --ioengine=nbd --uri="$URI" "${FIO_ARGS[@]}" "$@" \
    --output-format=json --output="$out.json" >"$out.stdout" 2>"$out.err"
}

# details: what a failure report needs.
details() {
  say "--- iteration $IT of $KILLS, seed $SEED, fio: ${FIO_ARGS[*]}"
  say "--- write run (exit $WSTATUS):"; tail -5 "$WORK/w.err" 2>/dev/null
  say "--- verify run:"; tail -20 "$WORK/v.err" 2>/dev/null; tail -20 "$WORK/v.stdout" 2>/dev/null
  say "--- cairn log (killed run, then this run):"
  tail -10 "$KILLED_LOG" 2>/dev/null
  tail -20 "$CAIRN_LOG" 2>/dev/null
}

# crash_loop NAME LEVEL N SALT [CREATE-ARGS...]
crash_loop() {
  need_tool fio nbdinfo mdadm jq curl
  local name=$1 level=$2 n=$3 i ms delay qd jobs fseed alive st verified errs vstatus
  RNG=$((SEED * 7919 + $4))
  shift 4
  M=()
  for i in $(seq 0 $((n - 1))); do M+=("$SHM/$name-$i.img"); done
  "$CAIRN" md create --level "$level" --raid-devices "$n" --size 96M --name "$name" "$@" "${M[@]}" >/dev/null
  say "NOTE: seed $SEED, $KILLS kills"
  serve "$name"
  wait_resynced "$name"
  KILLED_LOG=
  for IT in $(seq "$KILLS"); do
    rng 2701; ms=$((300 + R))
    delay=$((ms / 1000)).$(printf %03d $((ms % 1000)))
    rng 5; qd=$((4 + R))
    rng 2; jobs=$((1 + R))
    rng 2147483647; fseed=$R
    FIO_ARGS=(--rw=randwrite --bsrange=4k-64k --iodepth="$qd" --numjobs="$jobs"
      --size=$((SIZE / jobs)) --offset_increment=$((SIZE / jobs)) --randseed="$fseed"
      --verify=crc32c --verify_fatal=1)
    rm -f "$WORK"/local-crash-*-verify.state
    WSTATUS=running
    fio_job "$WORK/w" --do_verify=0 --verify_state_save=1 &
    FIO_PID=$!
    register pid "$FIO_PID"
    sleep "$delay"
    alive=yes
    kill -0 "$FIO_PID" 2>/dev/null || alive=no
    stop_cairn KILL
    expect_eq "$CAIRN_STATUS" 137 "cairn's status after kill -9"
    KILLED_LOG=$CAIRN_LOG
    WSTATUS=0
    wait "$FIO_PID" || WSTATUS=$?
    # fio still writing at the kill fails on the dead connection; one that had finished
    # (a short delay on a fast machine does not leave it time) exits 0.
    if [ "$alive" = yes ]; then
      [ "$WSTATUS" != 0 ] || { details; fail "fio was writing at the kill but exited 0"; }
    else
      expect_eq "$WSTATUS" 0 "fio, done before the kill"
    fi
    for i in $(seq 0 $((jobs - 1))); do
      [ -s "$WORK/local-crash-$i-verify.state" ] ||
        { details; fail "fio left no verify state $WORK/local-crash-$i-verify.state"; }
    done
    st=$(sb_states)
    expect_eq "$st" active "superblock state after kill -9 (iteration $IT)"

    serve "$name"
    vstatus=0
    fio_job "$WORK/v" --verify_only --verify_state_load=1 --do_verify=1 || vstatus=$?
    if [ "$vstatus" != 0 ] || grep -qiE 'verify|bad magic|crc32c' "$WORK/v.err"; then
      details
      fail "fio --verify_only after kill -9 number $IT failed (exit $vstatus)"
    fi
    errs=$(jq '[.jobs[].error] | add' "$WORK/v.json")
    verified=$(jq '[.jobs[].read.io_bytes] | add' "$WORK/v.json")
    expect_eq "$errs" 0 "fio verify errors (iteration $IT)"
    [ "$verified" -gt 0 ] || { details; fail "fio verified nothing after kill $IT"; }
    say "kill $IT: after ${delay}s (fio ${alive/yes/writing}${alive/no/ done}, iodepth $qd, $jobs job(s), randseed $fseed): verified $verified bytes, 0 errors; resync: $(bg_state "$name")"

    # Every third iteration, and the last, the resync finishes before the next kill.
    rng 3
    if [ "$R" = 0 ] || [ "$IT" = "$KILLS" ]; then
      wait_resynced "$name"
      expect_eq "$(sb_states)" clean "superblock state once resynced (iteration $IT)"
    fi
  done

  "$CAIRN" md check "$name" --wait --control "$CTL" >"$WORK/check.txt" 2>&1 ||
    fail "cairn md check $name: $(cat "$WORK/check.txt")"
  cat "$WORK/check.txt"
  expect_contains "$(cat "$WORK/check.txt")" " 0 mismatched sectors" "md check after $KILLS kills"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  expect_eq "$(sb_states)" clean "superblock state after a clean stop"
  say "NOTE: $KILLS kills of cairn under fio, 0 verify errors, 0 mismatches"
}

t_raid6() { crash_loop r6 6 4 6 --chunk 64K; }
t_raid5() { crash_loop r5 5 3 5 --chunk 64K; }

if [ -n "${ONLY:-}" ]; then
  for t in $ONLY; do run_test "$t" "t_$t"; done
  finish
  exit
fi
run_test raid6-kill9-under-fio t_raid6
run_test raid5-kill9-under-fio t_raid5
finish
