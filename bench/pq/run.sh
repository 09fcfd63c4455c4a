#!/usr/bin/env bash
# RAID6 P/Q generation: cairn's kernels beside ISA-L's pq_gen, on the same buffers.
#
# Usage: bench/pq/run.sh [--quick] [--rounds N] [--seconds S] [--ndata "2 4"] [--chunk 64K]
#   --rounds N    rounds of every case (default 7; the table shows medians)
#   --seconds S   CPU seconds each measurement runs for at least (default 0.5)
#   --ndata LIST  data blocks per stripe (default "2 4": 4- and 6-member RAID6)
#   --chunk C     chunk size (default 64K)
#   --quick       smoke run: 3 rounds of 0.2 s
#
# 1. Builds bench/pq/isal_pq.c against ISA-L (libisal-dev) and pq_bench (release).
# 2. Checks that every cairn kernel computes ISA-L's P and Q byte for byte on the same
#    input (isal_pq dump -> pq_bench verify) over several shapes; any difference fails.
# 3. For each NDATA x {cache, stream}: rounds of ISA-L, cairn's best kernel and each
#    kernel, each a fresh process measuring GB/s of data consumed per CPU second; the
#    order within a round rotates, so drift in the machine's speed spreads evenly.
#    "cache" repeats one stripe ((NDATA+2) x chunk, in L2); "stream" walks >= 256 MiB.
# Writes raw.tsv, verify.txt, machine.txt and table.md to bench/results/pq-DATE/.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="${HOME:-/root}/.cargo/bin:$PATH"

ROUNDS=7
SECONDS_EACH=0.5
NDATA="2 4"
CHUNK=64K
while [ $# -gt 0 ]; do
  case $1 in
    --quick) ROUNDS=3; SECONDS_EACH=0.2 ;;
    --rounds) ROUNDS=$2; shift ;;
    --seconds) SECONDS_EACH=$2; shift ;;
    --ndata) NDATA=$2; shift ;;
    --chunk) CHUNK=$2; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
  echo "rounds: $ROUNDS, at least $SECONDS_EACH CPU s each, chunk $CHUNK, ndata: $NDATA"
} >"$OUT/machine.txt"

# Contenders: ISA-L, cairn's automatic choice, then each kernel.
CONTENDERS=(isal best $KERNELS)
run_one() { # contender ndata mode
  case $1 in
    isal) "$ISAL" rate "$2" "$CHUNK" "$3" "$SECONDS_EACH" ;;
    *) "$CAIRN" rate "$1" "$2" "$CHUNK" "$3" "$SECONDS_EACH" ;;
  esac
}

echo "== rates: $ROUNDS rounds of: ${CONTENDERS[*]}"
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

python3 "$REPO/bench/pq/report.py" "$OUT/raw.tsv" "$CHUNK" | tee "$OUT/table.md"
echo "results: $OUT"
