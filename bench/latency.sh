#!/usr/bin/env bash
# Through-NBD latency bench: a file whose every operation takes DELAY (nbdkit's memory
# plugin behind its delay filter, seen as a plain file through nbdfuse), read directly by
# fio with JOBS parallel psync jobs and with one io_uring job at QD JOBS, then served by
# `cairn serve` (its defaults, whose file leaf is pread/pwrite from a thread pool) and read by
# one fio NBD connection at QD JOBS. All runs are 4k random reads; the ratio to the psync
# jobs is the goal of issue 15 (>= 0.9), the ratio to io_uring says whether the thread
# pool keeps as many reads in flight on this file as io_uring does.
#
# Usage: bench/latency.sh [--delay 1ms] [--jobs 32] [--runtime 10] [--size 256M]
#                         [--connections 4]   nbdfuse's connections to nbdkit: the file
#                         carries about 1.3 reads in flight per connection
#   CAIRN=path/to/cairn     binary to serve with (default: target/release/cairn, built)
#   CAIRN_SERVE_ARGS=...    extra `cairn serve` options (e.g. "--threads 1")
#   FIO_DIRECT=--direct=1   fio's own runs on the file with O_DIRECT: with many
#                           connections the file's page cache, not its delay, sets the
#                           buffered runs' pace (each run starts cold all the same)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DELAY=1ms JOBS=32 RUNTIME=10 SIZE=256M CONNS=4
while [ $# -gt 0 ]; do
  case $1 in
    --delay) DELAY=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --runtime) RUNTIME=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "latency: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in nbdkit nbdfuse fio fusermount3; do
  command -v $tool >/dev/null || { echo "latency: $tool is missing" >&2; exit 1; }
done
if [ -z "${CAIRN:-}" ]; then
  (cd "$REPO" && cargo build --release -q -p cairn-cli)
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi

D=$(mktemp -d /dev/shm/cairn-latency.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  fusermount3 -u "$D/fuse" 2>/dev/null || true
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$D"
}
trap cleanup EXIT

mkdir "$D/fuse"
# Enough nbdkit threads and nbdfuse connections that the delay, not their pools, is the
# limit (both are well above JOBS).
nbdkit -f --unix "$D/mem.sock" --threads $((JOBS * 2)) --filter=delay memory "$SIZE" \
  rdelay="$DELAY" wdelay="$DELAY" &
PIDS+=($!)
for _ in $(seq 100); do [ -S "$D/mem.sock" ] && break; sleep 0.1; done
nbdfuse -C "$CONNS" "$D/fuse/disk" --unix "$D/mem.sock" &
PIDS+=($!)
for _ in $(seq 100); do [ -f "$D/fuse/disk" ] && break; sleep 0.1; done
[ -f "$D/fuse/disk" ] || { echo "latency: nbdfuse did not mount" >&2; exit 1; }

# Each run starts with the file's pages out of the page cache: reads it cached would not
# wait for the delay, and a run after another would find the pages that one read.
cold() {
  python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)' "$D/fuse/disk"
}

iops() { sed -n "/^{/,\$p" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'; }

cold
direct=$(fio --output-format=json --name=direct --filename="$D/fuse/disk" --ioengine=psync ${FIO_DIRECT:-} \
  --rw=randread --bs=4k --numjobs="$JOBS" --group_reporting --time_based --runtime="$RUNTIME" \
  --randrepeat=1 --norandommap | iops)

cold
uring=$(fio --output-format=json --name=uring --filename="$D/fuse/disk" --ioengine=io_uring ${FIO_DIRECT:-} \
  --rw=randread --bs=4k --iodepth="$JOBS" --numjobs=1 --time_based --runtime="$RUNTIME" \
  --randrepeat=1 --norandommap | iops)

# shellcheck disable=SC2086
"$CAIRN" serve --no-control --listen "unix:$D/cairn.sock" ${CAIRN_SERVE_ARGS:-} "$D/fuse/disk" \
  >"$D/cairn.out" 2>"$D/cairn.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -S "$D/cairn.sock" ] && break; sleep 0.1; done
cold
nbd=$(fio --output-format=json --name=nbd --ioengine=nbd --uri="nbd+unix:///disk?socket=$D/cairn.sock" \
  --rw=randread --bs=4k --iodepth="$JOBS" --numjobs=1 --size="$SIZE" --time_based \
  --runtime="$RUNTIME" --randrepeat=1 --norandommap | iops)

python3 - "$DELAY" "$JOBS" "$direct" "$uring" "$nbd" <<'PY'
import sys
delay, jobs = sys.argv[1], sys.argv[2]
direct, uring, nbd = (int(x) for x in sys.argv[3:6])
print(f"file with {delay} per operation, 4k random read:")
print(f"  fio, {jobs} psync jobs on the file:          {direct:>8} IOPS")
print(f"  fio, one io_uring job QD{jobs} on the file:   {uring:>8} IOPS")
print(f"  fio, one NBD connection QD{jobs} via cairn:   {nbd:>8} IOPS  "
      f"({nbd / max(direct, 1):.2f}x psync jobs, {nbd / max(uring, 1):.2f}x io_uring)")
PY
