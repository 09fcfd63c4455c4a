#!/usr/bin/env bash
# What TLS costs: `cairn serve` on a /dev/shm file, read and written by nbdcopy (libnbd)
# over plain TCP, TLS with PSK and TLS with X.509, one after the other in the same run so
# the busy machine is as busy for each. Workloads: the whole export copied in 1 MiB
# requests (8 in flight) and in 4 KiB requests (32 in flight), each way, over one
# connection. ROUNDS rounds interleave the three modes; the median of the rounds is
# reported, and TLS as a ratio of plain: throughput, and the CPU time the server and the
# client spent (on a busy machine the CPU time moves much less than the throughput).
#
# Why nbdcopy and not fio: fio's nbd engine takes a URI, but libnbd refuses the local
# files a TLS URI names (tls-psk-file=, tls-certificates=) unless the program allows them,
# and fio does not (nor has qemu-img bench --object for qemu's TLS credentials). nbdcopy
# walks the export in order: for a file in the page cache the server's work per request,
# which is what TLS adds to, does not depend on the order, so the 4 KiB figures stand for
# 4 KiB random I/O as far as TLS is concerned.
#
# Usage: bench/tls.sh [--rounds 3] [--size 256M]
#   CAIRN=path/to/cairn     binary to serve with (default: target/release/cairn, built)
# Needs nbdcopy, certtool and psktool (scripts/install-deps.sh).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SIZE=256M ROUNDS=3
while [ $# -gt 0 ]; do
  case $1 in
    --size) SIZE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in nbdcopy certtool psktool; do
  command -v $tool >/dev/null || { echo "tls bench: $tool is missing" >&2; exit 1; }
done
if [ -z "${CAIRN:-}" ]; then
  (cd "$REPO" && cargo build --release -q -p cairn-cli)
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi

D=$(mktemp -d /dev/shm/cairn-tlsbench.XXXXXX)
cleanup() {
  local p
  for p in $(cat "$D/pids" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  for p in $(cat "$D/pids" 2>/dev/null); do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$D"
}
trap cleanup EXIT INT TERM

bash "$REPO/tests/interop/tls/make-creds.sh" "$D/creds" >/dev/null

# Two servers: `--tls on` with PSK serves plain and PSK clients from one process and one
# file (the fairest comparison); X.509 needs a second server, on a second file (one
# writer per file).
for f in disk x509; do
  truncate -s "$SIZE" "$D/$f.img"
  # Written once so reads are of real pages.
  dd if=/dev/zero of="$D/$f.img" bs=1M count=$(( $(stat -c %s "$D/$f.img") >> 20 )) \
    conv=notrunc status=none
done

# serve NAME FILE ARGS...: a cairn serve on its own port; prints the port.
serve() {
  local name=$1 file=$2
  shift 2
  "$CAIRN" serve --json --no-control --listen tcp:127.0.0.1:0 "$@" \
    "$file:disk" >"$D/$name.json" 2>"$D/$name.log" &
  echo $! >>"$D/pids"
  for _ in $(seq 100); do
    [ -s "$D/$name.json" ] && [ -z "$(tail -c1 "$D/$name.json")" ] && break
    sleep 0.1
  done
  [ -s "$D/$name.json" ] || { echo "tls bench: cairn serve ($name) did not start: $(cat "$D/$name.log")" >&2; exit 1; }
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"][0]["port"])' "$D/$name.json"
}
P1=$(serve on "$D/disk.img" --tls on --tls-psk "$D/creds/psk/keys.psk")
P2=$(serve x509 "$D/x509.img" --tls-certificates "$D/creds/pki")

head -c "$(numfmt --from=iec "$SIZE")" /dev/urandom >"$D/src.img"
URI_plain="nbd://127.0.0.1:$P1/disk"
URI_psk="nbds://alice@127.0.0.1:$P1/disk?tls-psk-file=$D/creds/psk/keys.psk"
URI_x509="nbds://127.0.0.1:$P2/disk?tls-certificates=$D/creds/pki"

# ticks N: CPU time (user + system, in clock ticks) so far of the Nth server started.
ticks() {
  local pid
  pid=$(sed -n "$1p" "$D/pids")
  awk '{print $14 + $15}' "/proc/$pid/stat"
}

# copy MODE read|write BS QD: one nbdcopy of the whole export; prints MiB/s, the server's
# CPU seconds and the client's CPU seconds.
copy() {
  local uri_var="URI_$1" from to which=1
  [ "$1" = x509 ] && which=2
  if [ "$2" = read ]; then from=${!uri_var} to=null:; else from=$D/src.img to=${!uri_var}; fi
  local t0 t1 c0 c1
  c0=$(ticks $which)
  t0=$(date +%s.%N)
  /usr/bin/time -o "$D/time" -f "%U %S" \
    nbdcopy --connections=1 --requests="$4" --request-size="$(numfmt --from=iec "$3")" \
    "$from" "$to" 2>"$D/err" || { echo "tls bench: nbdcopy $*: $(cat "$D/err")" >&2; return 1; }
  t1=$(date +%s.%N)
  c1=$(ticks $which)
  python3 -c '
import sys
t0, t1, c0, c1, size, hz, cu, cs = map(float, sys.argv[1:9])
print(round(size / 2**20 / (t1 - t0), 1), round((c1 - c0) / hz, 2), round(cu + cs, 2))
' "$t0" "$t1" "$c0" "$c1" "$(numfmt --from=iec "$SIZE")" "$(getconf CLK_TCK)" $(cat "$D/time")
}

WORKLOADS=("write-1M write 1M 8" "read-1M read 1M 8" "write-4k write 4K 32" "read-4k read 4K 32")
: >"$D/results"
for r in $(seq "$ROUNDS"); do
  for w in "${WORKLOADS[@]}"; do
    # shellcheck disable=SC2086
    set -- $w
    for m in plain psk x509; do
      v=$(copy $m "$2" "$3" "$4") || exit 1
      echo "$1 $m $v" | tee -a "$D/results"
    done
  done
done

echo
python3 - "$D/results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, mode, mibs, server, client = line.split()
    rows.setdefault(name, {}).setdefault(mode, []).append((float(mibs), float(server), float(client)))
med = lambda v, i: statistics.median(x[i] for x in v)
print("Throughput, MiB/s (TLS as a ratio of plain):")
print()
print("| workload | plain | TLS PSK | TLS X.509 |")
print("| --- | ---: | ---: | ---: |")
for name, modes in rows.items():
    p = med(modes["plain"], 0)
    cells = [f"{med(modes[m], 0):.0f} ({med(modes[m], 0) / p:.2f})" for m in ("psk", "x509")]
    print(f"| {name} | {p:.0f} | {cells[0]} | {cells[1]} |")
print()
print("CPU seconds for the whole export, server + client (the sum as a ratio of plain):")
print()
print("| workload | plain | TLS PSK | TLS X.509 |")
print("| --- | ---: | ---: | ---: |")
for name, modes in rows.items():
    c = {m: (med(v, 1), med(v, 2)) for m, v in modes.items()}
    p = sum(c["plain"])
    cells = [f"{c[m][0]:.2f} + {c[m][1]:.2f} ({sum(c[m]) / p:.2f})" for m in ("psk", "x509")]
    print(f"| {name} | {c['plain'][0]:.2f} + {c['plain'][1]:.2f} | {cells[0]} | {cells[1]} |")
EOF
echo
echo "(medians of $ROUNDS rounds, export size $SIZE; load average: $(cut -d' ' -f1-3 /proc/loadavg))"
