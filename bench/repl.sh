#!/usr/bin/env bash
# Replication cost, side by side in one run (issue 17's figures): two `cairn repl` nodes
# on loopback, one primary, against `cairn serve` of the same kind of backing file
# (unreplicated), all on /dev/shm. fio's nbd engine, one connection each.
#
#   bench/repl.sh [--runtime SECONDS] [--size SIZE]
#
# Prints: 4k random write QD32 IOPS and the ratio replicated/unreplicated; 4k QD1
# write+fsync latency (mean) and the difference; 1M sequential write MB/s and ratio; the
# initial full resync's speed (rate controller off).
set -euo pipefail
RUNTIME=8
SIZE=1G
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    *) echo "usage: bench/repl.sh [--runtime SECONDS] [--size SIZE]" >&2; exit 2 ;;
  esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
CAIRN=${CAIRN:-$REPO/target/release/cairn}
[ -x "$CAIRN" ] || (cd "$REPO" && cargo build --release -p cairn-cli)
W=$(mktemp -d /dev/shm/cairn-bench-repl.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

for n in a b; do "$CAIRN" repl create-md --size "$SIZE" "$W/$n.img" >/dev/null; done
up() { # NAME PORT PEER PEERPORT
  "$CAIRN" repl up home --disk "$W/$1.img" --node "$1" --listen "tcp:127.0.0.1:$2" \
    --peer "$3=nbd://127.0.0.1:$4/home" --client-listen "unix:$W/$1.nbd" --control "$W/$1.sock" \
    >"$W/$1.log" 2>&1 &
  PIDS+=($!)
}
up a 17891 b 17892
up b 17892 a 17891
for i in $(seq 100); do [ -S "$W/a.sock" ] && [ -S "$W/b.sock" ] && break; sleep 0.1; done
"$CAIRN" repl primary home --force --control "$W/a.sock" >/dev/null
for i in $(seq 600); do
  s=$("$CAIRN" --json repl status home --control "$W/a.sock" | jq -r '.peers[0].replication')
  [ "$s" = Established ] && break
  sleep 0.1
done
[ "$s" = Established ] || { echo "the initial sync did not finish" >&2; exit 1; }
RESYNC=$("$CAIRN" --json repl status home --control "$W/a.sock" | jq -r '[.events[] | select(.kind == "resync-done")] | last | .message')

# The unreplicated anchor: the same data size on one file.
DATA=$("$CAIRN" --json repl status home --control "$W/a.sock" | jq -r .data_size)
truncate -s "$DATA" "$W/plain.img"
"$CAIRN" serve --no-control --listen "unix:$W/plain.sock" "$W/plain.img:home" >"$W/plain.log" 2>&1 &
PIDS+=($!)
for i in $(seq 100); do [ -S "$W/plain.sock" ] && break; sleep 0.1; done

fio_run() { # URI NAME ARGS...
  local uri=$1 name=$2
  shift 2
  # fio prints a line of its own on stdout before the JSON: read the JSON from a file.
  fio --name="$name" --ioengine=nbd --uri="$uri" --size="$DATA" --runtime="$RUNTIME" \
    --time_based --output-format=json --output="$W/$name.json" "$@" >/dev/null 2>&1
  cat "$W/$name.json"
}
# The link's own cost: an NBD server that throws the data away (nbdkit's null plugin)
# over TCP on the same loopback, as the peers speak to each other: its QD1 write+fsync
# latency is one round trip, its 1M throughput the link's capacity as this machine's two
# cores see it.
nbdkit -f -i 127.0.0.1 -p 17893 null size="$DATA" >"$W/null.log" 2>&1 &
PIDS+=($!)
for i in $(seq 100); do nbdinfo --size nbd://127.0.0.1:17893 >/dev/null 2>&1 && break; sleep 0.1; done
null="nbd://127.0.0.1:17893"
repl="nbd+unix:///home?socket=$W/a.nbd"
plain="nbd+unix:///home?socket=$W/plain.sock"
iops() { jq '.jobs[0].write.iops | floor'; }
lat() { jq '(.jobs[0].write.clat_ns.mean + .jobs[0].sync.lat_ns.mean) / 1000 | floor'; }
bw() { jq '.jobs[0].write.bw_bytes / 1000000 | floor'; }
r4=$(fio_run "$repl" r4 --rw=randwrite --bs=4k --iodepth=32 | iops)
p4=$(fio_run "$plain" p4 --rw=randwrite --bs=4k --iodepth=32 | iops)
rl=$(fio_run "$repl" rl --rw=randwrite --bs=4k --iodepth=1 --fsync=1 | lat)
pl=$(fio_run "$plain" pl --rw=randwrite --bs=4k --iodepth=1 --fsync=1 | lat)
rs=$(fio_run "$repl" rs --rw=write --bs=1M --iodepth=8 | bw)
ps=$(fio_run "$plain" ps --rw=write --bs=1M --iodepth=8 | bw)
nl=$(fio_run "$null" nl --rw=randwrite --bs=4k --iodepth=1 --fsync=1 | lat)
ns=$(fio_run "$null" ns --rw=write --bs=1M --iodepth=8 | bw)
link=$((ns < ps ? ns : ps))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
printf '%-36s %12s %12s %8s\n' "job (loopback, /dev/shm)" replicated unreplicated ratio
printf '%-36s %12s %12s %8s\n' "4k randwrite QD32 (IOPS)" "$r4" "$p4" "$(ratio "$r4" "$p4")"
printf '%-36s %12s %12s %8s\n' "4k write+fsync QD1 (us, mean)" "$rl" "$pl" "+$((rl - pl))"
printf '%-36s %12s %12s %8s\n' "1M seq write QD8 (MB/s)" "$rs" "$ps" "$(ratio "$rs" "$ps")"
echo "link anchors (nbdkit null over TCP on the same loopback): QD1 write+fsync ${nl} us (one round trip), 1M QD8 ${ns} MB/s"
echo "goals: QD1 replicated <= unreplicated + round trip + 10% = $(awk -v p="$pl" -v n="$nl" 'BEGIN { printf "%d", (p + n) * 1.1 }') us: $rl us;" \
  "1M >= 0.9 x min(local, link) = $((link * 9 / 10)) MB/s: $rs MB/s"
echo "initial full resync: $RESYNC"
