#!/usr/bin/env bash
# RAID10 LV over 8 PVs against a striped LV over 4 PVs, both served by one `cairn serve
# --lvm`, 4k random read and 4k random write at QD32 through fio's nbd engine, each
# workload on both LVs in turn (read on A, B; write on A, B) so drift in the machine's
# speed spreads evenly. PVs are files in /dev/shm.
#
# Usage: bench/lvraid.sh [--runtime SECONDS] [--size LV-SIZE]   (defaults 10 s, 512M)
# Prints one line per run (LV, workload, IOPS, MiB/s) and the raid10/striped ratios.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
export PATH="${HOME:-/root}/.cargo/bin:$PATH:/usr/sbin:/sbin"
RUNTIME=10
SIZE=512M
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) RUNTIME=$2; shift ;;
    --size) SIZE=$2; shift ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "lvraid bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
command -v fio >/dev/null || { echo "lvraid bench: fio is not installed" >&2; exit 1; }
(cd "$REPO" && cargo build --release -q -p cairn-cli)
CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
D=$(mktemp -d /dev/shm/cairn-lvraid-bench.XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT

lv_mib=$(($(numfmt --from=iec "$SIZE") >> 20))
# Each PV: its share of the LV (raid10: LV / 4 stripes, striped: LV / 4) plus room for
# the metadata LV and the label.
pv_mib=$((lv_mib / 4 + 16))
r=() s=()
for i in 0 1 2 3 4 5 6 7; do r+=("$D/r$i.img"); done
for i in 0 1 2 3; do s+=("$D/s$i.img"); done
truncate -s "${pv_mib}M" "${r[@]}" "${s[@]}"
rdevs=$(IFS=,; echo "${r[*]}")
sdevs=$(IFS=,; echo "${s[*]}")
"$CAIRN" lvm vgcreate vgr "${r[@]}" >/dev/null
"$CAIRN" lvm vgcreate vgs "${s[@]}" >/dev/null
"$CAIRN" lvm lvcreate --type raid10 -m 1 -i 4 -I 64k --nosync -n r10 -L "${lv_mib}M" --devices "$rdevs" vgr >/dev/null
"$CAIRN" lvm lvcreate -i 4 -I 64k -n str -L "${lv_mib}M" --devices "$sdevs" vgs >/dev/null
"$CAIRN" serve --listen "unix:$D/sock" --lvm "$rdevs,$sdevs" >"$D/serve.out" 2>"$D/serve.err" &
PID=$!
for _ in $(seq 100); do [ -S "$D/sock" ] && break; sleep 0.1; done
[ -S "$D/sock" ] || { cat "$D/serve.err" >&2; exit 1; }

run() { # LV RW -> "iops mib/s"
  fio --output-format=json --ioengine=nbd --uri="nbd+unix:///$1?socket=$D/sock" \
    --name=b --rw="$2" --bs=4k --iodepth=32 --time_based --runtime="$RUNTIME" --ramp_time=1 \
    --size="${lv_mib}M" --output="$D/fio.json" 2>"$D/fio.err" || { cat "$D/fio.err" "$D/serve.err" >&2; exit 1; }
  /usr/bin/python3 - "$D/fio.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
k = "read" if "read" in sys.argv[2] else "write"
print(f'{j[k]["iops"]:.0f} {j[k]["bw"] / 1024:.1f}')
PY
}

declare -A res
for rw in randread randwrite; do
  for lv in vgr/r10 vgs/str; do
    res[$lv $rw]=$(run "$lv" "$rw")
    printf '%-8s %-9s %8s IOPS %7s MiB/s\n' "$lv" "$rw" ${res[$lv $rw]}
  done
done
for rw in randread randwrite; do
  a=${res[vgr/r10 $rw]%% *}
  b=${res[vgs/str $rw]%% *}
  /usr/bin/python3 -c "import sys; print(f'ratio raid10/striped {sys.argv[1]}: {int(sys.argv[2])/max(1,int(sys.argv[3])):.2f}x')" "$rw" "$a" "$b"
done
