#!/usr/bin/env bash
# Side-by-side NBD server benchmark: cairn, nbdkit (file plugin) and qemu-nbd serve the
# same file in /dev/shm over Unix sockets; fio's nbd engine drives each workload of
# bench/nbd.fio against each server in turn (workload 1 on A, B, C, then workload 2 ...),
# so drift in the machine's speed spreads evenly over the servers.
#
# Usage: bench/run.sh [--quick] [--md | --luks] [--runtime SECONDS] [--size SIZE] [--servers "cairn nbdkit qemu-nbd"]
#   --quick      smoke run: 1 s per workload on a 256 MiB file, no ramp
#   --md         RAID6 against a plain file: cairn serves a 4-member RAID6 (64K chunk,
#                members in /dev/shm, array of about SIZE) as "cairn-raid6", nbdkit serves a
#                plain file of the array's size; the table ends with the ratios and the
#                md issue's goals (seq write >= 0.5x, seq read >= 0.7x, 4k rand read >= 0.7x)
#   --luks       encrypted: cairn serves a LUKS2 volume (aes-xts-plain64, 512-bit key,
#                4096-byte sectors) as "cairn-luks"; nbdkit's luks filter ("nbdkit-luks") and
#                qemu-nbd's luks driver ("qemu-nbd-luks") serve the same data as LUKS1 volumes
#                made by qemu-img (aes-xts-plain64, 512-bit key; LUKS1 has 512-byte sectors,
#                and neither serves LUKS2); the table ends with the ratios and the LUKS issue's
#                goals (>= 2x nbdkit-luks sequential, >= 1.3x 4k random). Also runs
#                crates/luks/examples/xts_bench.rs: XTS per core against `openssl speed`.
#   BENCH_RUNTIME, BENCH_SIZE, BENCH_RAMP   the same settings from the environment
#
# Server settings (the defaults of each, made comparable, see docs/BENCHMARKS.md):
#   cairn     cairn serve FILE (defaults: 32 requests running per connection on a shared
#             worker pool, page cache; CAIRN_SERVE_ARGS="--threads 1" adds options)
#   nbdkit    nbdkit file plugin defaults (16 threads, parallel model, page cache)
#   qemu-nbd  -f raw --cache=writeback --aio=threads --shared=8 --persistent
# Writes the raw fio JSON, machine details and the table to bench/results/DATE/.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
export PATH="${HOME:-/root}/.cargo/bin:$PATH:/usr/sbin:/sbin"

RUNTIME=${BENCH_RUNTIME:-8}
SIZE=${BENCH_SIZE:-1G}
RAMP=${BENCH_RAMP:-1}
SERVERS="cairn nbdkit qemu-nbd"
MD=0
LUKS=0
JOBS="randread-4k seqread-1m seqwrite-1m randwrite-4k"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) RUNTIME=${BENCH_RUNTIME:-1}; SIZE=${BENCH_SIZE:-256M}; RAMP=${BENCH_RAMP:-0} ;;
    --runtime) RUNTIME=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --servers) SERVERS=$2; shift ;;
    --md) MD=1 ;;
    --luks) LUKS=1 ;;
    -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$MD" = 1 ] && SERVERS="cairn-raid6 nbdkit"
[ "$LUKS" = 1 ] && SERVERS="cairn-luks nbdkit-luks qemu-nbd-luks"

for tool in fio python3 nbdinfo; do
  command -v $tool >/dev/null || { echo "bench: $tool is missing; run scripts/install-deps.sh" >&2; exit 1; }
done
for s in $SERVERS; do
  case $s in
    cairn | cairn-raid6 | cairn-luks) ;;
    nbdkit-luks | qemu-nbd-luks) command -v "${s%-luks}" >/dev/null && command -v qemu-img >/dev/null ||
      { echo "bench: ${s%-luks} or qemu-img is missing; run scripts/install-deps.sh" >&2; exit 1; } ;;
    nbdkit | qemu-nbd) command -v "$s" >/dev/null || { echo "bench: $s is missing; run scripts/install-deps.sh" >&2; exit 1; } ;;
    *) echo "bench: unknown server $s" >&2; exit 2 ;;
  esac
done

if [ -z "${CAIRN:-}" ]; then
  echo "bench: building cairn (release) ..."
  (cd "$REPO" && cargo build --release -q -p cairn-cli)
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi

OUT=$REPO/bench/results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
SCRATCH=$(mktemp -d /dev/shm/cairn-bench.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

FILE=$SCRATCH/disk.img
BYTES=$(numfmt --from=iec "$SIZE")
MEMBERS=()
if [ "$MD" = 1 ]; then
  # Two data members: each member holds half the array, plus md's data offset.
  for i in 0 1 2 3; do MEMBERS+=("$SCRATCH/raid6-$i.img"); done
  "$CAIRN" md create --level 6 --chunk 64K --raid-devices 4 --name bench \
    --size $((BYTES / 2 + 4 * 1024 * 1024)) "${MEMBERS[@]}" >"$OUT/md-create.txt"
  # The plain file gets exactly the array's size.
  BYTES=$("$CAIRN" md detail --json "${MEMBERS[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["array_size_bytes"])')
  SIZE=$BYTES
fi
KEY=$SCRATCH/bench.key
if [ "$LUKS" = 1 ]; then
  # Cheap KDFs: they cost once at start-up and never touch the data path.
  printf %s 'cairn bench passphrase' >"$KEY"
  truncate -s $((BYTES + 16 * 1024 * 1024)) "$SCRATCH/luks2.img"
  "$CAIRN" luks format -q --key-file "$KEY" --key-size 512 --sector-size 4096 \
    --pbkdf pbkdf2 --pbkdf-force-iterations 1000 "$SCRATCH/luks2.img" >"$OUT/luks-format.txt"
  # qemu-img's defaults: aes-256 xts plain64 (aes-xts-plain64, 512-bit key), sha256.
  qemu-img create -q -f luks --object "secret,id=s0,file=$KEY" -o key-secret=s0,iter-time=10 \
    "$SCRATCH/luks1-nbdkit.img" "$BYTES"
fi
echo "bench: filling $SIZE bytes of random data in $FILE"
# Real data, not holes: reading a hole is a different (faster) path in every server.
if command -v openssl >/dev/null; then
  head -c "$BYTES" < <(openssl enc -aes-128-ctr -nosalt -pass pass:cairn-bench </dev/zero 2>/dev/null) >"$FILE"
else
  head -c "$BYTES" /dev/urandom >"$FILE"
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "cairn: $("$CAIRN" --version | cut -d' ' -f2) ($(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  command -v nbdkit >/dev/null && echo "nbdkit: $(nbdkit --version | cut -d' ' -f2)"
  command -v qemu-nbd >/dev/null && echo "qemu-nbd: $(qemu-nbd --version | head -1 | cut -d' ' -f2)"
  echo "fio: $(fio --version)"
  echo "settings: size=$SIZE runtime=${RUNTIME}s ramp=${RAMP}s, file in /dev/shm, Unix sockets"
  [ "$LUKS" = 1 ] && echo "luks: cairn-luks = LUKS2 aes-xts-plain64 512-bit key, 4096-byte sectors; nbdkit-luks and qemu-nbd-luks = LUKS1 (qemu-img) aes-xts-plain64 512-bit key, 512-byte sectors; same plaintext in all, files in /dev/shm"
  [ "$MD" = 1 ] && echo "md: cairn-raid6 = 4-member RAID6, 64K chunk (full stripe 128K), members in /dev/shm; nbdkit = plain file of the array's size"
} >"$OUT/machine.txt"

declare -A URI
start_server() {
  local s=$1 sock=$SCRATCH/$1.sock
  case $s in
    cairn)
      "$CAIRN" serve --no-control --listen "unix:$sock" ${CAIRN_SERVE_ARGS:-} "$FILE:bench" >"$OUT/cairn.log" 2>&1 &
      URI[$s]="nbd+unix:///bench?socket=$sock"
      ;;
    cairn-raid6)
      local list
      list=$(IFS=,; echo "${MEMBERS[*]}")
      "$CAIRN" serve --no-control --listen "unix:$sock" ${CAIRN_SERVE_ARGS:-} --md "$list:bench" >"$OUT/$s.log" 2>&1 &
      URI[$s]="nbd+unix:///bench?socket=$sock"
      ;;
    cairn-luks)
      "$CAIRN" serve --no-control --listen "unix:$sock" ${CAIRN_SERVE_ARGS:-} --luks "$SCRATCH/luks2.img:bench" --key-file "$KEY" \
        >"$OUT/$s.log" 2>&1 &
      URI[$s]="nbd+unix:///bench?socket=$sock"
      ;;
    nbdkit-luks)
      nbdkit -f -U "$sock" --filter=luks file "$SCRATCH/luks1-nbdkit.img" "passphrase=+$KEY" \
        >"$OUT/$s.log" 2>&1 &
      URI[$s]="nbd+unix:///?socket=$sock"
      ;;
    qemu-nbd-luks)
      qemu-nbd --object "secret,id=s0,file=$KEY" \
        --image-opts "driver=luks,key-secret=s0,file.filename=$SCRATCH/luks1-qemu.img" \
        --cache=writeback --aio=threads --shared=8 --persistent -k "$sock" >"$OUT/$s.log" 2>&1 &
      URI[$s]="nbd+unix:///?socket=$sock"
      ;;
    nbdkit)
      nbdkit -f -U "$sock" file "$FILE" >"$OUT/nbdkit.log" 2>&1 &
      URI[$s]="nbd+unix:///?socket=$sock"
      ;;
    qemu-nbd)
      qemu-nbd -f raw --cache=writeback --aio=threads --shared=8 --persistent -k "$sock" \
        "$FILE" >"$OUT/qemu-nbd.log" 2>&1 &
      URI[$s]="nbd+unix:///?socket=$sock"
      ;;
  esac
  PIDS+=($!)
  local i
  for i in $(seq 100); do
    nbdinfo --size "${URI[$s]}" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "bench: $s did not start; its log:" >&2
  cat "$OUT/$s.log" >&2
  exit 1
}

if [ "$LUKS" = 1 ]; then
  # The same plaintext in every volume: through nbdkit into LUKS1, then a copy of that
  # file for qemu-nbd (one writer per file), and through cairn into LUKS2.
  echo "bench: encrypting the data into the LUKS1 and LUKS2 volumes"
  nbdkit -U - --filter=luks file "$SCRATCH/luks1-nbdkit.img" "passphrase=+$KEY" \
    --run "nbdcopy $FILE \"\$uri\""
  cp "$SCRATCH/luks1-nbdkit.img" "$SCRATCH/luks1-qemu.img"
  rm -f "$FILE"
fi
for s in $SERVERS; do start_server "$s"; done
if [ "$LUKS" = 1 ]; then
  nbdkit -U - --filter=luks file "$SCRATCH/luks1-qemu.img" "passphrase=+$KEY" \
    --run "nbdcopy \"\$uri\" ${URI[cairn-luks]}"
  echo "bench: XTS per core against openssl speed (crates/luks/examples/xts_bench.rs)"
  (cd "$REPO" && cargo run --release -q -p cairn-luks --example xts_bench) >"$OUT/xts.txt" 2>&1 ||
    echo "bench: xts_bench failed (see $OUT/xts.txt)" >&2
  sed 's/^/  /' "$OUT/xts.txt"
fi
if [ "$MD" = 1 ]; then
  # The array holds the same real data as the plain file, parity included.
  echo "bench: copying the data into the RAID6"
  nbdcopy "$FILE" "${URI[cairn-raid6]}"
fi
for s in $SERVERS; do nbdinfo --json "${URI[$s]}" >"$OUT/nbdinfo-$s.json"; done

echo "bench: $(echo $JOBS | wc -w) workloads x $(echo $SERVERS | wc -w) servers, ${RUNTIME}s each (+${RAMP}s ramp)"
for job in $JOBS; do
  for s in $SERVERS; do
    printf '  %-13s %-9s ' "$job" "$s"
    if URI=${URI[$s]} SIZE=$SIZE RUNTIME=$RUNTIME RAMP=$RAMP \
      timeout $((RUNTIME + RAMP + 120)) fio "$REPO/bench/nbd.fio" --section="$job" \
      --output-format=json --output="$OUT/$job-$s.json" >"$OUT/$job-$s.err" 2>&1; then
      python3 "$REPO/bench/report.py" --one "$OUT/$job-$s.json"
    else
      echo "FAILED (see $OUT/$job-$s.err)"
    fi
  done
done

python3 "$REPO/bench/report.py" "$OUT" $SERVERS | tee "$OUT/table.md"
echo "bench: raw results in $OUT"
