#!/usr/bin/env bash
# RAID6 P/Q generation: cairn's kernels beside ISA-L's pq_gen, on the same buffers.
#
# Usage: bench/pq/run.sh [--quick] [--pair-runs N] [--pair-seconds S] [--rounds N]
#                         [--seconds S] [--ndata "2 4"] [--chunk 64K]
#   --pair-runs N     in-process paired runs of every case (default 5)
#   --pair-seconds S  CPU seconds of each paired run in cache (default 2; streaming
#                     runs get three times as long, a pass there being ~100x longer)
#   --rounds N        rounds of the separate-process cases (default 7)
#   --seconds S       CPU seconds of each separate-process measurement (default 0.5)
#   --ndata LIST      data blocks per stripe (default "2 4": 4- and 6-member RAID6)
#   --chunk C         chunk size (default 64K)
#   --quick           smoke run: 3 paired runs of 0.5 s, 3 rounds of 0.2 s
#
# 1. Builds bench/pq/isal_pq.c against ISA-L (libisal-dev) and pq_bench (release).
# 2. Checks that every cairn kernel computes ISA-L's P and Q byte for byte on the same
#    input (isal_pq dump -> pq_bench verify) over several shapes; any difference fails.
# 3. In process (the headline table): for each NDATA x {cache, stream}, pq_bench pair
#    runs ISA-L (dlopen'd) and every cairn kernel pass by pass on one region, in a
#    fresh random order every round; per-round ratios, medians. Each case runs in
#    several processes, cases interleaved, because a process's speed (both sides'
#    alike, but not always by the same factor) shifts with where its buffers land in
#    memory: the table shows the median over the runs. An ISA-L-vs-ISA-L row is the control: how far from 1.00x
#    the method itself lands.
# 4. Separate processes: rounds of isal_pq and pq_bench rate for the same cases, the
#    order rotating within a round; medians. Coarser (a process's speed varies more
#    than a pass's), but ISA-L there is the C program linked the ordinary way.
# Speeds are GB/s of data consumed (NDATA x chunk per stripe) per CPU second of the
# benchmarking thread. "cache" repeats one stripe ((NDATA+2) x chunk, in L2); "stream"
# walks stripes over >= 256 MiB.
# Writes pair.tsv, raw.tsv, verify.txt, machine.txt and table.md to
# bench/results/pq-DATE/.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="${HOME:-/root}/.cargo/bin:$PATH"

PAIR_RUNS=5
PAIR_SECONDS=2
ROUNDS=7
SECONDS_EACH=0.5
NDATA="2 4"
CHUNK=64K
while [ $# -gt 0 ]; do
  case $1 in
    --quick) PAIR_RUNS=3; PAIR_SECONDS=0.5; ROUNDS=3; SECONDS_EACH=0.2 ;;
    --pair-runs) PAIR_RUNS=$2; shift ;;
    --pair-seconds) PAIR_SECONDS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --seconds) SECONDS_EACH=$2; shift ;;
    --ndata) NDATA=$2; shift ;;
    --chunk) CHUNK=$2; shift ;;
    -h | --help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/pq: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in gcc cargo python3; do
  command -v $tool >/dev/null || { echo "bench/pq: $tool is missing; run scripts/install-deps.sh" >&2; exit 1; }
done
if [ ! -e /usr/include/isa-l/raid.h ]; then
  echo "bench/pq: ISA-L headers are missing (Debian: apt-get install libisal-dev; or scripts/install-deps.sh)" >&2
  exit 1
fi

BUILD=$REPO/target/bench-pq
OUT=$REPO/bench/results/pq-$(date +%Y%m%d-%H%M%S)
mkdir -p "$BUILD" "$OUT"

echo "== build"
gcc -O2 -Wall -Wextra -o "$BUILD/isal_pq" "$REPO/bench/pq/isal_pq.c" -lisal
(cd "$REPO" && cargo build --quiet --release -p cairn-md --example pq_bench)
ISAL=$BUILD/isal_pq
CAIRN=$REPO/target/release/examples/pq_bench

echo "== byte equality of P and Q: ISA-L pq_gen vs every cairn kernel"
# Lengths: the chunk sizes md uses, and ones that leave a tail for the scalar finish.
for n in 2 3 4 6 8 16 32; do
  for len in 32 480 4096 65536 65632 524288; do
    "$ISAL" dump $n $len "$BUILD/stripe.bin"
    if ! "$CAIRN" verify "$BUILD/stripe.bin" $n $len >>"$OUT/verify.txt"; then
      echo "bench/pq: FAIL: cairn's P/Q differ from ISA-L's ($n data blocks of $len bytes); see above" >&2
      exit 1
    fi
  done
done
rm -f "$BUILD/stripe.bin"
echo "   all equal ($(wc -l <"$OUT/verify.txt") shapes; $OUT/verify.txt)"

KERNELS=$("$CAIRN" kernels | tr '\n' ' ')
BEST=$("$CAIRN" kernels best)
{
  echo "date: $(date -Is)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "cpus: $(nproc)"
  echo "cpu features: $(grep -m1 -o -w 'avx2\|avx512f\|avx512bw\|gfni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  lscpu | grep -i 'cache' || true
  echo "isa-l: $(dpkg-query -W -f '${Package} ${Version}' libisal-dev 2>/dev/null || echo unknown)"
  echo "cairn: $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$REPO" && git diff --quiet -- crates/md 2>/dev/null || echo ' (crates/md modified)')"
  echo "rustc: $(rustc --version)"
  echo "gcc: $(gcc --version | head -n1)"
  echo "cairn kernels: $KERNELS(best: $BEST)"
  echo "chunk $CHUNK, ndata: $NDATA; paired: $PAIR_RUNS runs of $PAIR_SECONDS CPU s per case (x3 streaming);" \
    "processes: $ROUNDS rounds, at least $SECONDS_EACH CPU s each"
} >"$OUT/machine.txt"

# Contenders: ISA-L, cairn's automatic choice, then each kernel.
CONTENDERS=(isal best $KERNELS)
run_one() { # contender ndata mode
  case $1 in
    isal) "$ISAL" rate "$2" "$CHUNK" "$3" "$SECONDS_EACH" ;;
    *) "$CAIRN" rate "$1" "$2" "$CHUNK" "$3" "$SECONDS_EACH" ;;
  esac
}

echo "== in process, paired with ISA-L pass by pass ($PAIR_RUNS runs): best $KERNELS+ isal (control)"
printf 'run\tndata\tmode\tcontender\tgbps\tratio\trounds\n' >"$OUT/pair.tsv"
for run in $(seq 1 "$PAIR_RUNS"); do
  for n in $NDATA; do
    for mode in cache stream; do
      secs=$PAIR_SECONDS
      [ "$mode" = stream ] && secs=$(awk "BEGIN { print 3 * $PAIR_SECONDS }")
      res=$("$CAIRN" pair "$n" "$CHUNK" "$mode" "$secs" best $KERNELS isal)
      printf '%s\n' "$res" | sed "s/^/$run\t$n\t$mode\t/" >>"$OUT/pair.tsv"
      echo "   run $run  ${n}+2 $mode: $(printf '%s\n' "$res" | awk '{printf " %s=%s(%sx)", $1, $2, $3}')"
    done
  done
done

echo "== separate processes: $ROUNDS rounds of: ${CONTENDERS[*]}"
printf 'round\tndata\tmode\tcontender\tgbps\n' >"$OUT/raw.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for n in $NDATA; do
    for mode in cache stream; do
      # Rotate the order by round so no contender always runs first or last.
      k=$(( (r - 1) % ${#CONTENDERS[@]} ))
      order=("${CONTENDERS[@]:k}" "${CONTENDERS[@]:0:k}")
      line=""
      for c in "${order[@]}"; do
        g=$(run_one "$c" "$n" "$mode")
        printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$n" "$mode" "$c" "$g" >>"$OUT/raw.tsv"
        line="$line $c=$g"
      done
      echo "   round $r  ${n}+2 $mode:$line"
    done
  done
done

python3 "$REPO/bench/pq/report.py" "$OUT" "$CHUNK" | tee "$OUT/table.md"
echo "results: $OUT"
