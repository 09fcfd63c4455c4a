#!/usr/bin/env bash
# Acknowledged writes survive `kill -9` of `cairn serve` at its default --threads (32),
# where one connection's replies come back out of order. crash.sh checks fio's saved
# verify state, which assumes replies in order, so it serves with --threads 1; this
# topic's oracle (acked_writes.py) logs each write the moment its reply is read and
# checks exactly those after the restart. RAID6 and RAID5, with the stripe cache on (the
# default), several kills each; the seed is printed and CAIRN_SEED replays the choices.
. "$(dirname "$0")/lib.sh"

KILLS=${CAIRN_KILLS:-4}
SEED=${CAIRN_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
say "acked: seed $SEED, $KILLS kills per array (replay: CAIRN_SEED=$SEED)"
ORACLE=$INTEROP_DIR/acked_writes.py

acked_after_kills() { # NAME LEVEL N
  need_tool nbdinfo jq
  py -c 'import nbd' 2>/dev/null || skip "python3-libnbd (the nbd module) is missing"
  local name=$1 level=$2 n=$3 i k bs=4096 blocks delay
  M=()
  for i in $(seq 0 $((n - 1))); do M+=("$SHM/$name-$i.img"); done
  "$CAIRN" md create --level "$level" --chunk 64K --raid-devices "$n" --size 128M \
    --name "$name" "${M[@]}" >/dev/null
  RANDOM=$((SEED % 32768))
  for k in $(seq 1 "$KILLS"); do
    local seed=$((SEED + k))
    start_cairn --md "$(IFS=,; echo "${M[*]}"):$name"
    local uri size
    uri=$(unix_uri "$name")
    size=$(nbdinfo --size "$uri")
    blocks=$((size / bs))
    rm -f "$WORK/log"
    # The writer runs until the server dies under it.
    py "$ORACLE" write "$uri" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
    local wpid=$!
    register pid "$wpid"
    # Kill once some writes are acknowledged, 0.1-0.9 s in (the whole export takes
    # a few seconds to write).
    for i in $(seq 100); do [ -s "$WORK/log" ] && break; sleep 0.05; done
    delay=$((100 + RANDOM % 800))
    sleep "$(printf '0.%03d' "$delay")"
    kill -KILL "$CAIRN_PID"
    wait "$CAIRN_PID" 2>/dev/null || true
    wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
    say "kill $k: $(cat "$WORK/writer.out")"
    [ -s "$WORK/log" ] || fail "no write was acknowledged before the kill"
    start_cairn --md "$(IFS=,; echo "${M[*]}"):$name"
    py "$ORACLE" check "$(unix_uri "$name")" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
      fail "after kill $k (seed $seed): $(cat "$WORK/check.out")"
    say "  $(cat "$WORK/check.out")"
    if [ "$k" = 1 ]; then
      # The oracle can fail: one acknowledged block overwritten is found.
      local b
      b=$(head -1 "$WORK/log")
      py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(bytes(4096), int(sys.argv[2]) * 4096); h.shutdown()' \
        "$(unix_uri "$name")" "$b"
      if py "$ORACLE" check "$(unix_uri "$name")" "$seed" "$bs" "$WORK/log" >"$WORK/check2.out" 2>&1; then
        fail "the oracle missed an overwritten block: $(cat "$WORK/check2.out")"
      fi
      expect_contains "$(cat "$WORK/check2.out")" "wrong blocks: $b" "the oracle names the block"
    fi
    stop_cairn
  done
}

t_raid6() { acked_after_kills a6 6 4; }
t_raid5() { acked_after_kills a5 5 4; }

run_test raid6 t_raid6
run_test raid5 t_raid5
finish
