#!/usr/bin/env bash
# The stripe cache's effect on sequential sub-stripe writes over NBD: a RAID5 of three
# 64 KiB-chunk members in /dev/shm (full stripe 128 KiB), served by `cairn serve
# --threads 4`, written by fio's nbd engine with 64 KiB sequential writes at queue depth
# 16, once with --stripe-cache-size 0 (off) and once with the default. Alternates the two
# ROUNDS times and prints MiB/s and the member reads (from --metrics: read-modify-write
# reads that merged full stripes avoid) per run, and the ratio of the medians.
#
# Usage: bench/stripe-cache.sh [ROUNDS]   (CAIRN=path/to/cairn, BENCH_RUNTIME=seconds,
#                                          BENCH_SIZE=array size, BENCH_BS, BENCH_QD)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CAIRN=${CAIRN:-${CARGO_TARGET_DIR:-$REPO/target}/release/cairn}
ROUNDS=${1:-3}
RUNTIME=${BENCH_RUNTIME:-8}
SIZE=${BENCH_SIZE:-1G}
BS=${BENCH_BS:-64k}
QD=${BENCH_QD:-16}
for tool in fio python3 curl; do
  command -v $tool >/dev/null || { echo "bench: $tool is missing" >&2; exit 1; }
done
[ -x "$CAIRN" ] || { echo "bench: no cairn at $CAIRN (cargo build --release -p cairn-cli)" >&2; exit 1; }

SCRATCH=$(mktemp -d /dev/shm/cairn-stripe-cache.XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# Member size: the array's size over two data members, plus room for md's data offset.
member=$(python3 -c "
s='$SIZE'; m={'K':1<<10,'M':1<<20,'G':1<<30}
n=int(s[:-1])*m[s[-1]] if s[-1] in m else int(s)
print(n//2 + (4<<20))")
"$CAIRN" md create -l 5 -n 3 -c 64K --size "$member" --name bench \
  "$SCRATCH"/d{0,1,2}.img >/dev/null
MEMBERS="$SCRATCH/d0.img,$SCRATCH/d1.img,$SCRATCH/d2.img"

run() { # $1: stripe cache size; prints "MiB/s member-reads"
  local sock=$SCRATCH/nbd.sock metrics=$SCRATCH/metrics.sock
  rm -f "$sock" "$metrics"
  "$CAIRN" serve --threads 4 --listen "unix:$sock" --no-control --metrics "unix:$metrics" \
    --stripe-cache-size "$1" \
    --md "$MEMBERS:r5" >"$SCRATCH/serve.out" 2>"$SCRATCH/serve.err" &
  PID=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  fio --name=seqwrite --ioengine=nbd --uri="nbd+unix:///r5?socket=$sock" \
    --rw=write --bs="$BS" --iodepth="$QD" --numjobs=1 --size="$SIZE" \
    --time_based=1 --runtime="$RUNTIME" --ramp_time=1 --output-format=json \
    --output="$SCRATCH/fio.json" >/dev/null
  reads=$(curl -s --unix-socket "$metrics" http://cairn/metrics |
    awk '/^cairn_io_requests_total/ && /kind="member"/ && /op="read"/ { n += $2 } END { print n + 0 }')
  kill -INT "$PID"
  wait "$PID" || true
  PID=
  python3 -c "
import json; j=json.load(open('$SCRATCH/fio.json'))
print('%.1f' % (j['jobs'][0]['write']['bw_bytes']/1048576), $reads)"
}

off=() on=()
for r in $(seq "$ROUNDS"); do
  read -r a ra < <(run 0)
  read -r b rb < <(run 256)
  off+=("$a"); on+=("$b")
  echo "round $r: stripe cache off $a MiB/s ($ra member reads), on (256) $b MiB/s ($rb member reads)"
done
python3 -c "
import statistics as s
off=[float(x) for x in '${off[*]}'.split()]; on=[float(x) for x in '${on[*]}'.split()]
a,b=s.median(off),s.median(on)
print(f'median: off {a:.1f} MiB/s, on {b:.1f} MiB/s, ratio {b/a:.2f}x')"
