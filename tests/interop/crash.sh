#!/usr/bin/env bash
# Crashes: `kill -9` of `cairn serve` at a random moment while fio writes random blocks
# (crc32c headers) to a RAID6 or RAID5 export, then a restart on the same member files
# and `fio --verify_only`: every write fio saw completed must read back intact.
#
# Each iteration:
#   1. cairn serves the array; from the second iteration on it comes up dirty (the
#      previous one was killed): it must assemble without --force (all members are
#      there), announce the array not clean, resync pending, not forced, and resync the
#      bitmap's dirty chunks in the background;
#   2. fio writes random blocks (4k-64k, iodepth 4-8, one or two connections, paced to
#      take at least 3.5 s for the export) with verify=crc32c, do_verify=0 and
#      verify_state_save=1; --randrepeat=0 with a randseed per iteration makes the
#      offsets, sizes and contents a function of that seed (fio 3.33 ignores randseed
#      for the offsets while randrepeat is on);
#   3. 0.3-3 s after cairn served fio's first write, kill -9 of cairn: fio fails
#      (expected) and, on its way out, writes the number of writes it issued and the last
#      iodepth ones that completed to local-crash-N-verify.state in the working
#      directory ($WORK);
#   4. the superblocks say "active" (written and not closed; fio never leaves the array
#      idle for md's safe-mode delay, 200 ms, which would mark them clean while it runs);
#   5. cairn restarts, and fio runs the same job with --verify_only
#      --verify_state_load=1: it regenerates the same writes without issuing them and
#      reads back every write up to the first one that had not completed (in the last
#      iodepth window it checks only the writes the state lists as completed); its exit
#      status must be 0, its JSON must show no error, and it must have read back exactly
#      the bytes the write run saw completed (non-zero);
#   6. sometimes (and always at the end) the resync is let finish: the superblocks then
#      say "clean"; at the end `cairn md check --wait` must find 0 mismatched sectors.
#
# The check can fail: with CAIRN_CRASH_CORRUPT=1 the first iteration overwrites 512 bytes
# inside the first block fio wrote (through NBD, after the restart) and expects
# --verify_only to fail; it does ("crc32c: verify failed ..."; by hand, a 4K overwrite of
# the block's start gives "bad magic header").
#
# Kills: 5 per array by default, 50 with CAIRN_LONG=1 (or CAIRN_KILLS=N). The random
# choices (delays, seeds, depths) come from a generator seeded by CAIRN_SEED (printed;
# default: random), so a failing run's choices can be replayed; where in the write
# stream the kill lands still depends on the machine's speed.
. "$(dirname "$0")/lib.sh"

if [ "${CAIRN_LONG:-0}" = 1 ]; then KILLS=${CAIRN_KILLS:-50}; else KILLS=${CAIRN_KILLS:-5}; fi
SEED=${CAIRN_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
say "crash: seed $SEED, $KILLS kills per array (replay: CAIRN_SEED=$SEED${CAIRN_LONG:+ CAIRN_LONG=$CAIRN_LONG})"

# rng N (lib.sh): the seeded choices below.

# serve NAME: serves ${M[@]} as NAME with a control socket; sets CTL, URI, SIZE.
serve() {
  CTL=$WORK/c$((CAIRN_N + 1)).sock
  # --threads 1: each connection answers its requests in order, which the check of fio's
  # verify state below relies on (see "bytes verified vs written"); fio's several jobs
  # still write concurrently over their own connections.
  start_cairn --threads 1 --control "$CTL" --md "$(IFS=,; echo "${M[*]}"):$1"
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
  fio_nbd crash "$URI" "$out" "${FIO_ARGS[@]}" "$@"
}

# details: what a failure report needs.
details() {
  say "--- iteration $IT of $KILLS, seed $SEED, fio: ${FIO_ARGS[*]}"
  say "--- write run (exit $WSTATUS):"
  tail -5 "$WORK/w.err" 2>/dev/null
  say "--- verify run:"
  tail -20 "$WORK/v.err" 2>/dev/null
  tail -20 "$WORK/v.stdout" 2>/dev/null
  say "--- cairn log, the killed run:"
  tail -10 "$KILLED_LOG" 2>/dev/null
  say "--- cairn log, the restarted run:"
  tail -20 "$CAIRN_LOG" 2>/dev/null
}

# connect_trouble: what the server looks like when a client cannot connect to it.
connect_trouble() {
  say "--- fio did not get going (iteration $IT, seed $SEED): $(tail -3 "$WORK/w.err")"
  say "cairn $CAIRN_PID alive: $(kill -0 "$CAIRN_PID" 2>/dev/null && echo yes || echo no)"
  ls -l --time-style=full-iso "$CAIRN_SOCK" 2>&1
  ss -xlpn 2>&1 | grep -F "$CAIRN_SOCK" || say "(nothing listens on $CAIRN_SOCK)"
  say "nbdinfo now: $(nbdinfo --size "$URI" 2>&1)"
  grep -E '^(State|Threads)' /proc/"$CAIRN_PID"/status 2>&1
  say "open fds: $(ls /proc/"$CAIRN_PID"/fd 2>/dev/null | wc -l)"
  tail -20 "$CAIRN_LOG"
}

# export_writes ARRAY: write requests the export has served (this cairn's counter).
export_writes() {
  curl -s --unix-socket "$CTL" http://cairn/metrics |
    awk -v e="export=\"$1\"" 'index($0, "cairn_io_requests_total{" e) == 1 && /kind="export"/ &&
      /op="write"/ { s += $2 } END { print s + 0 }'
}

# wait_writing ARRAY: waits (30 s at most) until fio's writes reach cairn, so the delay
# before the kill counts from there (fio can take longer than 0.3 s to start on a busy
# machine, and a kill before it connects is no test).
wait_writing() {
  local i
  for i in $(seq 300); do
    [ "$(export_writes "$1")" -gt 0 ] && return 0
    if ! kill -0 "$FIO_PID" 2>/dev/null; then
      connect_trouble
      fail "fio ended before writing anything (iteration $IT)"
    fi
    sleep 0.1
  done
  connect_trouble
  fail "fio wrote nothing within 30 s (iteration $IT)"
}

# unregister PID: a process this test saw die leaves the registry, so the cleanup can
# never signal a later process that reuses its number (pid_max can be 32768).
unregister() { sed -i "/^pid $1\$/d" "$REGISTRY"; }

# corrupt: 512 bytes of zeros into the first block fio wrote (not its header), through NBD.
corrupt() {
  local off
  off=$(awk '$3 == "write" { print $4; exit }' "$WORK/w.iolog")
  [ -n "$off" ] || fail "no write in fio's iolog"
  nbdsh -u "$URI" -c "h.pwrite(bytes(512), $off + 512)"
  say "corrupted 512 bytes at $((off + 512)), inside the first block fio wrote"
}

# crash_loop NAME LEVEL N SALT [CREATE-ARGS...]
crash_loop() {
  need_tool fio nbdinfo mdadm jq curl
  local name=$1 level=$2 n=$3 i ms delay qd jobs fseed st written verified vstatus
  local corrupt_it=0 mid=0 in_resync=0 extra at_kill
  [ "${CAIRN_CRASH_CORRUPT:-0}" = 1 ] && { need_tool nbdsh; corrupt_it=1; }
  RNG=$((SEED * 7919 + $4))
  shift 4
  M=()
  for i in $(seq 0 $((n - 1))); do M+=("$SHM/$name-$i.img"); done
  # Two data members of 384M, written at most at SIZE / 3.5 s (about 230 MB/s, near what
  # one fio job does here unpaced): every kill, at most 3 s after the first write, lands
  # while fio writes.
  "$CAIRN" md create --level "$level" --raid-devices "$n" --size 384M --name "$name" "$@" \
    "${M[@]}" >/dev/null
  say "NOTE: seed $SEED, $KILLS kills"
  serve "$name"
  KILLED_LOG=
  # Kills counted: those fio left a verify state for. fio 3.33 sometimes leaves none (a
  # job that dies on the dead connection before saving); such a kill cannot be checked,
  # is reported, and does not count. At most twice KILLS attempts.
  local counted=0 uncheckable=0
  IT=0
  while [ "$counted" -lt "$KILLS" ]; do
    IT=$((IT + 1))
    [ "$IT" -le $((KILLS * 2)) ] ||
      fail "only $counted of $KILLS kills could be checked in $((IT - 1)) attempts ($uncheckable without a verify state from fio)"
    rng 2701
    ms=$((300 + R))
    delay=$((ms / 1000)).$(printf %03d $((ms % 1000)))
    rng 5
    qd=$((4 + R))
    rng 2
    jobs=$((1 + R))
    rng 2147483647
    fseed=$R
    extra=()
    if [ "$IT" = "$corrupt_it" ]; then
      jobs=1
      extra=(--write_iolog="$WORK/w.iolog")
    fi
    FIO_ARGS=(--rw=randwrite --bsrange=4k-64k --iodepth="$qd" --numjobs="$jobs"
      --size=$((SIZE / jobs)) --offset_increment=$((SIZE / jobs)) --randrepeat=0 --randseed="$fseed"
      --verify=crc32c --rate=$((SIZE * 10 / 35 / jobs)))
    rm -f "$WORK"/local-crash-*-verify.state "$WORK/w.iolog" "$WORK"/[wv].json
    WSTATUS=running
    fio_job "$WORK/w" --do_verify=0 --verify_state_save=1 "${extra[@]}" &
    FIO_PID=$!
    register pid "$FIO_PID"
    wait_writing "$name"
    sleep "$delay"
    at_kill=$(bg_state "$name")
    stop_cairn KILL
    expect_eq "$CAIRN_STATUS" 137 "cairn's status after kill -9"
    [ "$at_kill" = "resync running" ] && in_resync=$((in_resync + 1))
    KILLED_LOG=$CAIRN_LOG
    unregister "$CAIRN_PID"
    WSTATUS=0
    wait "$FIO_PID" || WSTATUS=$?
    unregister "$FIO_PID"
    [ -s "$WORK/w.json" ] || { details; fail "fio wrote no JSON"; }
    # fio puts some messages about the dead connection into its --output file ahead of
    # the JSON: keep the JSON alone.
    sed -n '/^{/,$p' "$WORK/w.json" >"$WORK/w.clean.json"
    if ! jq -e .jobs "$WORK/w.clean.json" >/dev/null 2>&1; then
      uncheckable=$((uncheckable + 1))
      say "kill $IT: fio's JSON is unreadable ($(head -c 200 "$WORK/w.json" | tr '\n' ' ')); not counted"
      serve "$name"
      continue
    fi
    mv "$WORK/w.clean.json" "$WORK/w.json"
    written=$(jq '[.jobs[].write.io_bytes] | add' "$WORK/w.json")
    # fio still writing at the kill fails on the dead connection; one that had written
    # everything before it (a fast machine, a long delay) may exit 0.
    if [ "$written" -lt "$SIZE" ]; then
      mid=$((mid + 1))
      [ "$WSTATUS" != 0 ] || { details; fail "fio wrote $written of $SIZE bytes, yet exited 0"; }
    fi
    expect_eq "$(sb_states)" active "superblock state after kill -9 (iteration $IT)"
    local missing=0
    for i in $(seq 0 $((jobs - 1))); do
      [ -s "$WORK/local-crash-$i-verify.state" ] || missing=1
    done
    if [ "$missing" = 1 ]; then
      uncheckable=$((uncheckable + 1))
      say "kill $IT: fio left no verify state (fio exit $WSTATUS: $(tail -1 "$WORK/w.err")); not counted"
      serve "$name"
      continue
    fi
    counted=$((counted + 1))

    # No --force: every member is there, so a dirty array assembles and resyncs.
    serve "$name"
    st=$(jq -c '.exports[0].md.state | [.clean, .resync_pending, .degraded, .forced]' "$CAIRN_JSON")
    expect_eq "$st" "[false,true,false,false]" "[clean, resync_pending, degraded, forced] at restart $IT"
    [ "$IT" = "$corrupt_it" ] && corrupt
    # --iodepth=1: fio 3.33 decides where to stop (verify_state_should_stop) from the
    # count of verify reads that have completed, not issued; with several in flight it
    # reads past the window and "finds" the writes the crash cut off (bad magic header 0,
    # seen here with iodepth 4). The write run's depth is in the state file either way.
    # --verify_fatal=1: at iodepth 1 without it, fio 3.33 prints "verify failed" and
    # still exits 0 with error 0 in its JSON (seen with CAIRN_CRASH_CORRUPT=1).
    vstatus=0
    fio_job "$WORK/v" --verify_only --verify_state_load=1 --verify_state_save=0 --do_verify=1 \
      --iodepth=1 --verify_fatal=1 || vstatus=$?
    if [ "$IT" = "$corrupt_it" ]; then
      [ "$vstatus" != 0 ] && grep -q 'verify' "$WORK/v.err" ||
        { details; fail "fio --verify_only did not notice the corrupted block (exit $vstatus)"; }
      say "kill $IT: fio noticed the corruption: $(head -1 "$WORK/v.err")"
      continue
    fi
    # Each connection's requests complete in order (--threads 1), so the writes fio
    # saw complete are exactly those before the first failed one: fio must read back (and
    # check) exactly the bytes it wrote, per job.
    fio_verified "$WORK/w" "$WORK/v" "$vstatus" "after kill $IT" details
    verified=$VERIFIED
    say "kill $IT after ${delay}s (iodepth $qd, $jobs job(s), randseed $fseed; background work at the kill: $at_kill): wrote $written of $SIZE bytes (fio exit $WSTATUS), verified $verified, 0 errors; now $(bg_state "$name")"

    # Every third iteration, and the last, the resync finishes before the next kill.
    rng 3
    if [ "$R" = 0 ] || [ "$counted" = "$KILLS" ]; then
      wait_resynced "$name"
      expect_eq "$(sb_states)" clean "superblock state once resynced (iteration $IT)"
      say "  resync finished; superblocks clean"
    fi
  done

  wait_resynced "$name"
  "$CAIRN" md check "$name" --wait --control "$CTL" >"$WORK/check.txt" 2>&1 ||
    fail "cairn md check $name: $(cat "$WORK/check.txt")"
  cat "$WORK/check.txt"
  expect_contains "$(cat "$WORK/check.txt")" " 0 mismatched sectors" "md check after $KILLS kills"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  expect_eq "$(sb_states)" clean "superblock state after a clean stop"
  say "NOTE: seed $SEED: $KILLS kills checked ($mid while fio was writing, $in_resync during a resync; $uncheckable more without a verify state from fio), 0 verify errors, md check 0 mismatches"
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
