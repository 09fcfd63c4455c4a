#!/usr/bin/env bash
# What TLS costs: `cairn serve` on a /dev/shm file, read and written by fio's nbd engine
# (libnbd) over plain TCP and over TLS (PSK, then X.509), one after the other in the same
# run so the busy machine is as busy for each. Workloads: 1 MiB sequential read and write
# (QD 8) and 4 KiB random read and write (QD 32), ROUNDS rounds interleaved
# plain/psk/x509; the median of the rounds is reported, and TLS as a ratio of plain.
#
# Usage: bench/tls.sh [--runtime 10] [--size 512M] [--rounds 3]
#   CAIRN=path/to/cairn     binary to serve with (default: target/release/cairn, built)
# Needs fio (with its nbd engine), certtool and psktool (scripts/install-deps.sh).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
RUNTIME=10 SIZE=512M ROUNDS=3
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) RUNTIME=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in fio certtool psktool; do
  command -v $tool >/dev/null || { echo "tls bench: $tool is missing" >&2; exit 1; }
done
if [ -z "${CAIRN:-}" ]; then
  (cd "$REPO" && cargo build --release -q -p cairn-cli)
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi

D=$(mktemp -d /dev/shm/cairn-tlsbench.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$D"
}
trap cleanup EXIT INT TERM

bash "$REPO/tests/interop/tls/make-creds.sh" "$D/creds" >/dev/null
truncate -s "$SIZE" "$D/disk.img"
# Written once so reads are of real pages.
dd if=/dev/zero of="$D/disk.img" bs=1M count=$(( $(stat -c %s "$D/disk.img") >> 20 )) \
  conv=notrunc status=none

# serve MODE: one cairn serve per mode on its own port; sets PORT and URI.
serve() {
  local mode=$1 args=()
  case $mode in
    plain) ;;
    psk) args=(--tls-psk "$D/creds/psk/keys.psk") ;;
    x509) args=(--tls-certificates "$D/creds/pki") ;;
  esac
  "$CAIRN" serve --json --no-control --listen tcp:127.0.0.1:0 "${args[@]}" \
    "$D/disk.img:disk" >"$D/$mode.json" 2>"$D/$mode.log" &
  PIDS+=($!)
  for _ in $(seq 100); do
    [ -s "$D/$mode.json" ] && [ -z "$(tail -c1 "$D/$mode.json")" ] && break
    sleep 0.1
  done
  local port
  port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"][0]["port"])' "$D/$mode.json")
  case $mode in
    plain) URI="nbd://127.0.0.1:$port/disk" ;;
    psk) URI="nbds://127.0.0.1:$port/disk?tls-psk-file=$D/creds/psk/keys.psk&tls-username=alice" ;;
    x509) URI="nbds://127.0.0.1:$port/disk?tls-certificates=$D/creds/pki" ;;
  esac
  eval "URI_$mode=\$URI"
}
for m in plain psk x509; do serve $m; done

# run MODE NAME RW BS QD: one fio run; prints MiB/s.
run() {
  local uri_var="URI_$1"
  fio --name="$2" --ioengine=nbd --uri="${!uri_var}" --rw="$3" --bs="$4" --iodepth="$5" \
    --size="$SIZE" --time_based --runtime="$RUNTIME" --ramp_time=1 --group_reporting \
    --output-format=json --output="$D/fio.json" >/dev/null 2>"$D/fio.err" ||
    { cat "$D/fio.err" >&2; exit 1; }
  python3 - "$D/fio.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print(round((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20, 1))
EOF
}

WORKLOADS=("seq-read read 1M 8" "seq-write write 1M 8" "rand-read randread 4k 32" "rand-write randwrite 4k 32")
: >"$D/results"
for r in $(seq "$ROUNDS"); do
  for w in "${WORKLOADS[@]}"; do
    set -- $w
    for m in plain psk x509; do
      echo "$2 $m $(run $m "$@")" | tee -a "$D/results"
    done
  done
done

echo
echo "| workload | plain MiB/s | TLS PSK MiB/s (ratio) | TLS X.509 MiB/s (ratio) |"
echo "| --- | ---: | ---: | ---: |"
python3 - "$D/results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, mode, v = line.split()
    rows.setdefault(name, {}).setdefault(mode, []).append(float(v))
for name, modes in rows.items():
    med = {m: statistics.median(v) for m, v in modes.items()}
    p = med["plain"]
    print(f"| {name} | {p:.0f} | {med['psk']:.0f} ({med['psk'] / p:.2f}) | "
          f"{med['x509']:.0f} ({med['x509'] / p:.2f}) |")
EOF
echo
echo "(medians of $ROUNDS rounds of ${RUNTIME}s each, size $SIZE; load average: $(cut -d' ' -f1-3 /proc/loadavg))"
