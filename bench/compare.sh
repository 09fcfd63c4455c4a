#!/usr/bin/env bash
# Side by side: several cairn variants (binaries and/or options) and nbdkit serve the same
# file in /dev/shm; each workload of bench/nbd.fio runs on every server in turn, so drift
# in a busy machine's speed spreads over all of them. Prints IOPS per cell and the ratio to
# nbdkit.
#
# Usage: bench/compare.sh [--runtime S] [--size SIZE] [--rounds N] NAME=BINARY[:OPTIONS]...
#   e.g. bench/compare.sh before=/tmp/cairn-old after=target/release/cairn \
#          'after-t1=target/release/cairn:--threads 1'
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
RUNTIME=5 SIZE=1G ROUNDS=1
JOBS="randread-4k seqread-1m seqwrite-1m randwrite-4k"
VARIANTS=()
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) RUNTIME=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *=*) VARIANTS+=("$1") ;;
    *) echo "compare: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#VARIANTS[@]} -gt 0 ] || { echo "compare: give at least one NAME=BINARY[:OPTIONS]" >&2; exit 2; }

D=$(mktemp -d /dev/shm/cairn-compare.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$D"
}
trap cleanup EXIT
head -c "$(numfmt --from=iec "$SIZE")" < <(openssl enc -aes-128-ctr -nosalt -pass pass:cairn-bench </dev/zero 2>/dev/null) >"$D/disk.img"

declare -A URI
NAMES=(nbdkit)
nbdkit -f -U "$D/nbdkit.sock" file "$D/disk.img" >"$D/nbdkit.log" 2>&1 &
PIDS+=($!)
URI[nbdkit]="nbd+unix:///?socket=$D/nbdkit.sock"
for v in "${VARIANTS[@]}"; do
  name=${v%%=*} rest=${v#*=}
  bin=${rest%%:*} opts=""
  [ "$bin" != "$rest" ] && opts=${rest#*:}
  # cairn holds a lock on what it serves (one writer per file): each variant its own copy.
  cp "$D/disk.img" "$D/$name.img"
  # shellcheck disable=SC2086
  "$bin" serve --no-control --listen "unix:$D/$name.sock" $opts "$D/$name.img:bench" >"$D/$name.log" 2>&1 &
  PIDS+=($!)
  URI[$name]="nbd+unix:///bench?socket=$D/$name.sock"
  NAMES+=("$name")
done
for n in "${NAMES[@]}"; do
  for _ in $(seq 100); do nbdinfo --size "${URI[$n]}" >/dev/null 2>&1 && break; sleep 0.1; done
  nbdinfo --size "${URI[$n]}" >/dev/null 2>&1 || { echo "compare: $n did not start:" >&2; cat "$D/$n.log" >&2; exit 1; }
done

iops() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["read"]["iops"] + j["write"]["iops"]))' "$1"; }
declare -A SUM
for job in $JOBS; do
  for r in $(seq "$ROUNDS"); do
    for n in "${NAMES[@]}"; do
      if URI=${URI[$n]} SIZE=$SIZE RUNTIME=$RUNTIME RAMP=1 timeout $((RUNTIME + 60)) \
        fio "$REPO/bench/nbd.fio" --section="$job" --output-format=json --output="$D/out.json" >"$D/fio.err" 2>&1; then
        v=$(iops "$D/out.json")
      else
        echo "compare: fio $job on $n failed:" >&2
        tail -5 "$D/fio.err" >&2
        v=0
      fi
      SUM[$job,$n]=$(( ${SUM[$job,$n]:-0} + v ))
    done
  done
done
printf '%-14s' workload; for n in "${NAMES[@]}"; do printf ' %12s' "$n"; done; echo "   (IOPS, mean of $ROUNDS; x = / nbdkit)"
for job in $JOBS; do
  printf '%-14s' "$job"
  base=$(( ${SUM[$job,nbdkit]} / ROUNDS ))
  for n in "${NAMES[@]}"; do
    v=$(( ${SUM[$job,$n]} / ROUNDS ))
    if [ "$n" = nbdkit ]; then printf ' %12s' "$v"; else printf ' %6s %5s' "$v" "$(python3 -c "print(f'{$v/max($base,1):.2f}x')")"; fi
  done
  echo
done
