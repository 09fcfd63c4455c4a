#!/usr/bin/env bash
# The member server's owner gate (docs/fencing.md): the same file served with --fence on
# and --fence off by two `cairn serve` processes at once, fio's nbd engine against each in
# turn (alternating, so machine load hits both alike). 4k random reads and writes at QD32,
# one connection; the on-server's client is a plain one (no token), which takes the same
# gate path as an owner's.
#
# Usage: CAIRN=target/release/cairn bench/fence.sh [--runtime SECONDS] [--rounds N]
set -euo pipefail
RUNTIME=8
ROUNDS=3
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) RUNTIME=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "usage: $0 [--runtime S] [--rounds N]" >&2; exit 2 ;;
  esac
done
CAIRN=${CAIRN:-$(dirname "$0")/../target/release/cairn}
W=$(mktemp -d /dev/shm/cairn-fence-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
for m in on off; do
  # Allocated up front: first-touch page allocation would otherwise favour whichever runs second.
  fallocate -l 256M "$W/$m.img"
  "$CAIRN" serve --no-control --fence "$m" --listen "unix:$W/$m.sock" "$W/$m.img:disk" \
    >"$W/$m.json" 2>"$W/$m.log" &
  PIDS+=($!)
done
for i in $(seq 100); do [ -S "$W/on.sock" ] && [ -S "$W/off.sock" ] && break; sleep 0.1; done
run() { # MODE RW
  fio --name=b --ioengine=nbd --uri="nbd+unix:///disk?socket=$W/$1.sock" --rw="$2" --bs=4k \
    --iodepth=32 --numjobs=1 --size=256M --time_based=1 --runtime="$RUNTIME" --ramp_time=1 \
    --randrepeat=1 --norandommap=1 --output-format=json 2>/dev/null | sed -n "/^{/,\$p" |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(int(j["read"]["iops"]+j["write"]["iops"]))'
}
echo "workload round fence-on fence-off ratio"
for rw in randwrite randread; do
  for r in $(seq "$ROUNDS"); do
    # The order alternates, so a trend in the machine's load favours neither.
    if [ $((r % 2)) = 1 ]; then on=$(run on "$rw"); off=$(run off "$rw")
    else off=$(run off "$rw"); on=$(run on "$rw"); fi
    echo "$rw $r $on $off $(python3 -c "print(f'{$on/$off:.2f}')")"
  done
done
