#!/usr/bin/env bash
# Rebuild speed, and foreground latency during a rebuild against idle, for cairn's md
# RAID on members in /dev/shm. Per level (RAID6, RAID5, RAID10 on 4 members, RAID1 on 2;
# members of SIZE, CHUNK chunks), one `cairn serve --md` with a control socket:
#
#   1. fill the whole array with fio (1 MiB sequential writes of fio's random buffers),
#      so the rebuild reads real data, not holes;
#   2. idle latency: fio 4k random reads, iodepth 1, RUNTIME seconds -> p50, p99;
#   3. idle rebuild: `cairn md fail` the member in role 1, `cairn md remove` it, then
#      `cairn md add` a fresh sparse spare, with speed limits min = max = 10000000 KiB/s;
#      the time from the add to the job's state "finished" gives the rebuild speed
#      (member bytes rebuilt per second, and array bytes per second);
#   4. the same rebuild while the fio of step 2 runs, once per --speed-limit-min in MINS
#      (restarting the server with that minimum, max 10000000): p50/p99 during the
#      rebuild, and the rebuild speed meanwhile (done_bytes sampled every 20 ms);
#   5. idle latency again (drift check).
#
# A fresh spare each time makes every rebuild a full one (a re-added member would only
# rebuild what the write-intent bitmap marks). Anchors in the same run: reading a
# filled member file with dd (to /dev/null) and copying it within /dev/shm, each twice.
#
# Usage: bench/rebuild.sh [--quick] [--levels "6 5 10 1"] [--size SIZE] [--chunk CHUNK]
#                         [--runtime SECONDS] [--mins "1000 100000 10000000"] [--json FILE]
#   --quick      smoke run: 128M members, 2 s fio runs, RAID6 only
#   --levels     md levels to run, in order (default "6 5 10 1")
#   --size       member size (default 1G)
#   --chunk      chunk size for RAID5/6/10 (default 512K)
#   --runtime    seconds of each fio latency run (default 10)
#   --mins       --speed-limit-min values (KiB/s) for the rebuilds under fio
#   --json FILE  also write the results as JSON to FILE (always in the results directory)
#   CAIRN=PATH   the cairn binary (default: build it, release)
#
# Writes the raw fio JSON, progress samples, server logs, machine details, results.json
# and the table to bench/results/DATE-rebuild/. Kills what it started and removes its
# scratch directory in /dev/shm on every exit.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
export PATH="${HOME:-/root}/.cargo/bin:$PATH:/usr/sbin:/sbin"

LEVELS="6 5 10 1"
SIZE=1G
CHUNK=512K
RUNTIME=10
HIGH=10000000
MINS="1000 100000 $HIGH"
JSON_OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) SIZE=128M; RUNTIME=2; LEVELS=6 ;;
    --levels) LEVELS=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --chunk) CHUNK=$2; shift ;;
    --runtime) RUNTIME=$2; shift ;;
    --mins) MINS=$2; shift ;;
    --json) JSON_OUT=$2; shift ;;
    -h | --help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rebuild: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in fio python3 nbdinfo dd; do
  command -v $tool >/dev/null || { echo "rebuild: $tool is missing; run scripts/install-deps.sh" >&2; exit 1; }
done
if [ -z "${CAIRN:-}" ]; then
  echo "rebuild: building cairn (release) ..."
  (cd "$REPO" && cargo build --release -q -p cairn-cli)
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi

OUT=$REPO/bench/results/$(date +%Y%m%d-%H%M%S)-rebuild
mkdir -p "$OUT"
SCRATCH=$(mktemp -d /dev/shm/cairn-rebuild.XXXXXX)
SERVER_PID=
PIDS=()
cleanup() {
  local p
  for p in $SERVER_PID "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in $SERVER_PID "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }

# The helper: watches a rebuild through the control socket, and turns the run's records
# into the table and JSON.
HELPER=$SCRATCH/helper.py
cat >"$HELPER" <<'EOF'
import http.client, json, os, socket, sys, time

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("cairn", timeout=5)
        self.path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)

def get(sock, route):
    c = Unix(sock)
    c.request("GET", route)
    r = c.getresponse()
    body = r.read()
    c.close()
    return json.loads(body)

def watch(sock, array, member, out, timeout):
    """Samples the array's background job every 20 ms until the rebuild onto `member`
    ends (state other than running) or `timeout` passes; one JSON line per sample."""
    end = time.time() + float(timeout)
    with open(out, "w") as f:
        while time.time() < end:
            t = time.time()
            try:
                bg = get(sock, "/v1/arrays/" + array).get("background")
            except (OSError, ValueError) as e:
                bg = {"error": str(e)}
            f.write(json.dumps({"t": t, "bg": bg}) + "\n")
            f.flush()
            if bg and str(bg.get("member") or "").endswith(member) and bg.get("state") != "running":
                return 0 if bg.get("state") == "finished" else 1
            time.sleep(0.02)
    return 2

def fio(path):
    try:
        text = open(path).read()
        job = json.loads(text[text.index("{"):])["jobs"][0]
        r = job["read"]
        p = r["clat_ns"]["percentile"]
        return {"iops": r["iops"], "p50_us": p["50.000000"] / 1000, "p99_us": p["99.000000"] / 1000,
                "p999_us": p["99.900000"] / 1000, "mean_us": r["clat_ns"]["mean"] / 1000}
    except (OSError, ValueError, KeyError, IndexError):
        return None

def rebuild(samples, member, t_add, t_fs=None, t_fe=None):
    """Duration from the add to the first sample that shows the rebuild finished, the
    member bytes, and (under fio) the speed over the samples inside the fio run."""
    rows = [json.loads(l) for l in open(samples)]
    mine = [r for r in rows if r["bg"] and str(r["bg"].get("member") or "").endswith(member)]
    if not mine:
        return {"state": "never started"}
    last = mine[-1]["bg"]
    res = {"state": last.get("state"), "total_bytes": last.get("total_bytes"),
           "worked_bytes": last.get("worked_bytes"), "done_bytes": last.get("done_bytes")}
    if last.get("state") == "finished":
        t_end = next(r["t"] for r in mine if r["bg"].get("state") == "finished")
        res["seconds"] = t_end - t_add
        res["t_end"] = t_end
    if t_fs is not None:
        inside = [r for r in mine if t_fs <= r["t"] <= t_fe and r["bg"].get("state") == "running"]
        if len(inside) >= 2:
            a, b = inside[0], inside[-1]
            res["fg_bytes_per_sec"] = (b["bg"]["done_bytes"] - a["bg"]["done_bytes"]) / max(b["t"] - a["t"], 1e-9)
        t_end = res.get("t_end", float("inf"))
        res["fio_covered"] = max(0.0, min(1.0, (t_end - t_fs) / (t_fe - t_fs)))
    return res

def report(records, out_json, machine):
    recs = [json.loads(l) for l in open(records)]
    doc = {"machine": open(machine).read(), "records": recs}
    for p in out_json:
        with open(p, "w") as f:
            json.dump(doc, f, indent=1)
    g = lambda v, d=0: "—" if v is None else f"{v:,.{d}f}"
    print("```")
    print(doc["machine"].rstrip())
    print("```")
    print()
    anchors = [r for r in recs if r["kind"] == "anchor"]
    if anchors:
        print("| anchor (1 member file, dd bs=1M) | GB/s |")
        print("|---|---:|")
        for a in anchors:
            print(f"| {a['what']} | {g(a['gbps'], 2)} |")
        print()
    print("| level | rebuild | speed-limit-min KiB/s | seconds | member GB/s | array GB/s | rebuild MB/s during fio | fio covered | p50 µs | p99 µs | p99 / idle p99 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lv in dict.fromkeys(r["level"] for r in recs if "level" in r):
        mine = [r for r in recs if r.get("level") == lv]
        idle = [r for r in mine if r["kind"] == "latency" and r["fio"]]
        base = idle[0]["fio"]["p99_us"] if idle else None
        for r in mine:
            if r["kind"] == "latency":
                f = r["fio"] or {}
                print(f"| {lv} | none ({r['tag']}) | | | | | | | {g(f.get('p50_us'))} | {g(f.get('p99_us'))} | "
                      f"{g(f.get('p99_us') / base, 2) if f.get('p99_us') and base else '—'} |")
            elif r["kind"] == "rebuild":
                b = r["rebuild"]
                s = b.get("seconds")
                mgb = b["total_bytes"] / s / 1e9 if s else None
                agb = r["array_bytes"] / s / 1e9 if s else None
                f = r.get("fio") or {}
                fg = b.get("fg_bytes_per_sec")
                cov = b.get("fio_covered")
                state = "" if b.get("state") == "finished" else f" **{b.get('state')}**"
                print(f"| {lv} | {r['tag']}{state} | {g(r['min_kib'])} | {g(s, 2)} | {g(mgb, 2)} | {g(agb, 2)} | "
                      f"{g(fg / 1e6, 1) if fg is not None else '—'} | {g(cov * 100) + ' %' if cov is not None else '—'} | "
                      f"{g(f.get('p50_us'))} | {g(f.get('p99_us'))} | "
                      f"{g(f.get('p99_us') / base, 2) if f.get('p99_us') and base else '—'} |")
    bad = [r for r in recs if r["kind"] == "rebuild" and r["rebuild"].get("state") != "finished"]
    if bad:
        print()
        print("rebuilds that did not finish: " + ", ".join(f"RAID{r['level']} {r['tag']}" for r in bad))
        return 1
    return 0

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "watch":
        sys.exit(watch(*sys.argv[2:7]))
    if cmd == "fio":
        print(json.dumps(fio(sys.argv[2])))
    if cmd == "rebuild":
        a = sys.argv[2:]
        t = [float(x) for x in a[2:]]
        print(json.dumps(rebuild(a[0], a[1], *t)))
    if cmd == "report":
        sys.exit(report(sys.argv[2], sys.argv[4:], sys.argv[3]))
EOF

RECORDS=$OUT/records.jsonl
: >"$RECORDS"
record() { echo "$1" >>"$RECORDS"; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "cairn: $("$CAIRN" --version | cut -d' ' -f2) ($(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo "fio: $(fio --version)"
  echo "settings: levels=$LEVELS member size=$SIZE chunk=$CHUNK fio runtime=${RUNTIME}s mins=$MINS max=$HIGH KiB/s"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"

SOCK=$SCRATCH/nbd.sock
CTL=$SCRATCH/control.sock
URI="nbd+unix:///bench?socket=$SOCK"
MEMBERS=()
start_server() { # MIN_KIB TAG
  local list
  list=$(IFS=,; echo "${MEMBERS[*]}")
  "$CAIRN" serve -v --listen "unix:$SOCK" --control "$CTL" \
    --speed-limit-min "$1" --speed-limit-max "$HIGH" --md "$list:bench" >>"$OUT/serve-$2.log" 2>&1 &
  SERVER_PID=$!
  local i
  for i in $(seq 100); do
    nbdinfo --size "$URI" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "rebuild: cairn serve did not start; its log:" >&2
  cat "$OUT/serve-$2.log" >&2
  exit 1
}
stop_server() {
  kill "$SERVER_PID"
  wait "$SERVER_PID" || { echo "rebuild: cairn serve exited $? on SIGTERM (see $OUT)" >&2; exit 1; }
  SERVER_PID=
}

latency() { # OUTPUT-JSON
  timeout $((RUNTIME + 120)) fio --name=lat --ioengine=nbd --uri="$URI" --rw=randread --bs=4k \
    --iodepth=1 --size="$ARRAY_BYTES" --time_based=1 --runtime="$RUNTIME" --randrepeat=1 \
    --norandommap=1 --output-format=json --output="$1" >"$1.err" 2>&1 ||
    echo "rebuild: fio failed (see $1.err)" >&2
}

SPARE_N=0
# Fails the member in role 1, removes it, adds a fresh sparse spare and waits for the
# rebuild onto it to finish; with "fio", runs the latency job meanwhile.
rebuild_once() { # LEVEL TAG MIN_KIB fio|idle
  local lv=$1 tag=$2 min=$3 mode=$4 old=${MEMBERS[1]} spare samples t_add t_fs= t_fe= watcher rc=0
  SPARE_N=$((SPARE_N + 1))
  spare=$SCRATCH/spare$SPARE_N.img
  samples=$OUT/raid$lv-$tag.samples.jsonl
  "$CAIRN" md fail bench "$(basename "$old")" --control "$CTL" >>"$OUT/manage.log"
  "$CAIRN" md remove bench "$(basename "$old")" --control "$CTL" >>"$OUT/manage.log"
  rm -f "$old"
  truncate -s "$SIZE" "$spare"
  python3 "$HELPER" watch "$CTL" bench "$(basename "$spare")" "$samples" 900 &
  watcher=$!
  PIDS+=("$watcher")
  t_add=$(now)
  "$CAIRN" md add bench "$spare" --control "$CTL" >>"$OUT/manage.log"
  MEMBERS[1]=$spare
  if [ "$mode" = fio ]; then
    t_fs=$(now)
    latency "$OUT/raid$lv-$tag.fio.json"
    t_fe=$(now)
  fi
  wait "$watcher" || rc=$?
  [ $rc = 0 ] || echo "rebuild: RAID$lv $tag: the rebuild did not finish (watcher exit $rc, see $samples)" >&2
  local res f=null
  res=$(python3 "$HELPER" rebuild "$samples" "$(basename "$spare")" "$t_add" $t_fs $t_fe)
  [ "$mode" = fio ] && f=$(python3 "$HELPER" fio "$OUT/raid$lv-$tag.fio.json")
  record "{\"kind\":\"rebuild\",\"level\":$lv,\"tag\":\"$tag\",\"min_kib\":$min,\"array_bytes\":$ARRAY_BYTES,\"rebuild\":$res,\"fio\":$f}"
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); s=r.get("seconds")
print(f"  RAID{sys.argv[2]} {sys.argv[3]:<14} {r.get(\"state\")}, " + (f"{s:.2f} s, {r[\"total_bytes\"]/s/1e9:.2f} GB/s of member bytes" if s else "no time"))' "$res" "$lv" "$tag"
}

anchor() { # FILE
  local i rate
  for i in 1 2; do
    rate=$(LC_ALL=C dd if="$1" of=/dev/null bs=1M 2>&1 | sed -n 's/.* copied, \([0-9.]*\) s.*/\1/p')
    record "{\"kind\":\"anchor\",\"what\":\"read (dd to /dev/null), run $i\",\"gbps\":$(python3 -c "print($(stat -c %s "$1") / $rate / 1e9)")}"
    rate=$(LC_ALL=C dd if="$1" of="$SCRATCH/copy.img" bs=1M 2>&1 | sed -n 's/.* copied, \([0-9.]*\) s.*/\1/p')
    rm -f "$SCRATCH/copy.img"
    record "{\"kind\":\"anchor\",\"what\":\"copy within /dev/shm (dd to a new file), run $i\",\"gbps\":$(python3 -c "print($(stat -c %s "$1") / $rate / 1e9)")}"
  done
}

FIRST=1
for lv in $LEVELS; do
  n=4
  chunk=(--chunk "$CHUNK")
  case $lv in
    1) n=2; chunk=() ;;
    5 | 6 | 10) ;;
    *) echo "rebuild: level $lv has no redundancy to rebuild" >&2; exit 2 ;;
  esac
  MEMBERS=()
  for i in $(seq 0 $((n - 1))); do MEMBERS+=("$SCRATCH/raid$lv-m$i.img"); done
  echo "rebuild: RAID$lv, $n x $SIZE members${chunk:+, $CHUNK chunk}"
  "$CAIRN" md create --level "$lv" "${chunk[@]}" --raid-devices "$n" --size "$SIZE" --name bench \
    "${MEMBERS[@]}" >"$OUT/raid$lv-create.txt"
  start_server "$HIGH" "raid$lv-idle"
  ARRAY_BYTES=$(nbdinfo --size "$URI")
  echo "  filling $ARRAY_BYTES bytes"
  fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size="$ARRAY_BYTES" \
    --output="$OUT/raid$lv-fill.txt" >/dev/null
  if [ $FIRST = 1 ]; then
    anchor "${MEMBERS[0]}"
    FIRST=0
  fi
  latency "$OUT/raid$lv-idle1.fio.json"
  record "{\"kind\":\"latency\",\"level\":$lv,\"tag\":\"idle, before\",\"fio\":$(python3 "$HELPER" fio "$OUT/raid$lv-idle1.fio.json")}"
  rebuild_once "$lv" idle "$HIGH" idle
  for min in $MINS; do
    stop_server
    start_server "$min" "raid$lv-min$min"
    rebuild_once "$lv" "fio-min$min" "$min" fio
  done
  latency "$OUT/raid$lv-idle2.fio.json"
  record "{\"kind\":\"latency\",\"level\":$lv,\"tag\":\"idle, after\",\"fio\":$(python3 "$HELPER" fio "$OUT/raid$lv-idle2.fio.json")}"
  stop_server
  rm -f "${MEMBERS[@]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"

json_args=("$OUT/results.json")
[ -n "$JSON_OUT" ] && json_args+=("$JSON_OUT")
rc=0
python3 "$HELPER" report "$RECORDS" "$OUT/machine.txt" "${json_args[@]}" | tee "$OUT/table.md" || rc=$?
echo "rebuild: raw results in $OUT"
exit $rc
