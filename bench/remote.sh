#!/usr/bin/env bash
# Remote members: the network-disk experiment users report, reproduced. An md array over
# MEMBERS remote NBD exports whose every read and write takes DELAY (nbdkit's memory
# plugin behind its delay filter, over TCP on loopback), served by `cairn serve`; fio's
# nbd engine writes 4k at random
#   - with one job and fsync=1 (each write waits for its flush): bounded by latency, the
#     goal is about 1 / (2 x DELAY), not member-after-member round trips;
#   - with 16 jobs x QD8: the goal is >= 0.8 x the members' combined capacity, where a
#     member's capacity is what the same fio load gets from one member directly, and the
#     array's use of it is counted (member operations per second, from cairn's metrics).
#
# Usage: bench/remote.sh [--level 5] [--members 5] [--delay 1ms] [--runtime 10]
#                        [--write-hole log|none]   md create's (default log: a partial-stripe
#                        write is then 3 member round trips, reads, log, writes; none: 2)
#   CAIRN=path/to/cairn     binary (default: target/release/cairn, built)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
LEVEL=5 MEMBERS=5 DELAY=1ms RUNTIME=10 WRITE_HOLE=log
while [ $# -gt 0 ]; do
  case $1 in
    --level) LEVEL=$2; shift ;;
    --members) MEMBERS=$2; shift ;;
    --delay) DELAY=$2; shift ;;
    --runtime) RUNTIME=$2; shift ;;
    --write-hole) WRITE_HOLE=$2; shift ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "remote: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in nbdkit fio curl python3; do
  command -v $tool >/dev/null || { echo "remote: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
if [ -z "${CAIRN:-}" ]; then
  (cd "$REPO" && cargo build --release -q -p cairn-cli)
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi

D=$(mktemp -d /tmp/cairn-remote-bench.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$D"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
URIS=()
for i in $(seq "$MEMBERS"); do
  port=$(free_port)
  nbdkit -f -i 127.0.0.1 -p "$port" --threads 128 --filter=delay memory 1G \
    rdelay="$DELAY" wdelay="$DELAY" 2>>"$D/nbdkit.log" &
  PIDS+=($!)
  URIS+=("nbd://127.0.0.1:$port/")
done
for u in "${URIS[@]}"; do
  for _ in $(seq 100); do nbdinfo --size "$u" >/dev/null 2>&1 && break; sleep 0.1; done
done

iops() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(round(sum(x["write"]["iops"] for x in j["jobs"])))' "$1"; }
fio_write() { # URI OUT JOBS DEPTH [EXTRA...]
  local uri=$1 out=$2 jobs=$3 depth=$4
  shift 4
  fio --output-format=json --output="$out" --name=w --ioengine=nbd --uri="$uri" \
    --rw=randwrite --bs=4k --size=256M --numjobs="$jobs" --iodepth="$depth" \
    --group_reporting=0 --time_based --runtime="$RUNTIME" "$@" >/dev/null
}

echo "remote: $MEMBERS members at $DELAY per operation; RAID$LEVEL (write hole: $WRITE_HOLE); fio 4k random writes, ${RUNTIME}s each" >&2
# The members' combined capacity: 16 jobs x QD8 spread over all of them at once, directly
# (on a small machine the members' servers, cairn and fio share the CPUs; measuring the
# members together counts that in).
per=$(((16 + MEMBERS - 1) / MEMBERS))
args=()
for u in "${URIS[@]}"; do args+=(--name=m --uri="$u" --numjobs="$per"); done
fio --output-format=json --output="$D/member.json" --ioengine=nbd --rw=randwrite --bs=4k \
  --size=256M --iodepth=8 --group_reporting=0 --time_based --runtime="$RUNTIME" "${args[@]}" >/dev/null
member=$(iops "$D/member.json")
# One member's own round trip for a 4k write at QD1 (the delay plus TCP and nbdkit).
fio_write "${URIS[0]}" "$D/rtt.json" 1 1
rtt_iops=$(iops "$D/rtt.json")

"$CAIRN" md create --level "$LEVEL" --raid-devices "$MEMBERS" --chunk 64K --name rb \
  --write-hole "$WRITE_HOLE" \
  "${URIS[@]}" >/dev/null 2>"$D/create.log" || { cat "$D/create.log" >&2; exit 1; }
mport=$(free_port)
"$CAIRN" serve --no-control --listen "unix:$D/a.sock" --metrics "tcp:127.0.0.1:$mport" \
  ${CAIRN_SERVE_ARGS:-} --md "$(IFS=,; echo "${URIS[*]}"):rb" >/dev/null 2>"$D/serve.log" &
PIDS+=($!)
for _ in $(seq 300); do [ -S "$D/a.sock" ] && break; sleep 0.1; done
[ -S "$D/a.sock" ] || { echo "remote: cairn serve did not start:" >&2; cat "$D/serve.log" >&2; exit 1; }
URI="nbd+unix:///rb?socket=$D/a.sock"
member_ops() {
  curl -s "http://127.0.0.1:$mport/metrics" | grep '^cairn_io_requests_total{' |
    grep 'kind="member"' | grep -E 'op="(read|write)"' | awk '{s += $NF} END {printf "%d\n", s}'
}

q0=$(member_ops)
fio_write "$URI" "$D/qd1.json" 1 1
q1=$(member_ops)
qd1=$(iops "$D/qd1.json")
fio_write "$URI" "$D/one.json" 1 1 --fsync=1
one=$(iops "$D/one.json")
before=$(member_ops)
t0=$(date +%s.%N)
fio_write "$URI" "$D/many.json" 16 8
t1=$(date +%s.%N)
after=$(member_ops)
many=$(iops "$D/many.json")

python3 - "$DELAY" "$MEMBERS" "$member" "$one" "$many" "$before" "$after" "$t0" "$t1" "$qd1" \
  "$q0" "$q1" "$RUNTIME" "$rtt_iops" <<'PY'
import sys
delay, n, member, one, many, before, after, t0, t1, qd1, q0, q1, runtime, rtt_iops = sys.argv[1:]
rtt = 1 / max(int(rtt_iops), 1)
d = float(delay[:-2]) / 1000 if delay.endswith("ms") else float(delay.rstrip("s"))
n, member, one, many = int(n), int(member), int(one), int(many)
ops = (int(after) - int(before)) / (float(t1) - float(t0))
cap = member
print(f"all {n} members at once, 16 jobs x QD8 (combined capacity): {member} IOPS")
qd1_ops = (int(q1) - int(q0)) / max(int(qd1) * float(runtime), 1)
print(f"array, 1 job QD1, no fsync: {qd1} IOPS ({1000/max(int(qd1),1):.2f} ms per write, "
      f"{qd1_ops:.2f} member operations each)")
print(f"one member, 1 job QD1: {rtt_iops} IOPS (round trip {rtt*1000:.2f} ms)")
print(f"array, 1 job fsync=1:  {one} IOPS   (1/(2 x delay) = {1/(2*d):.0f}; ratio {one*2*d:.2f}; "
      f"1/(2 x round trip) = {1/(2*rtt):.0f}; ratio {one*2*rtt:.2f})")
print(f"array, 16 jobs x QD8:  {many} IOPS; member operations {ops:.0f}/s of {cap} combined capacity = {ops/cap:.2f}")
print(f"member operations per array write: {ops/max(many,1):.2f}")
PY
