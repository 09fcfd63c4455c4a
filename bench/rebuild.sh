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
#   --preallocate-spare   the spare is a file with every page already allocated
#                (fallocate), as a disk has every block: the rebuild's time then leaves
#                out tmpfs allocating and zeroing the pages it writes (default: sparse)
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
PREALLOC=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) SIZE=128M; RUNTIME=2; LEVELS=6 ;;
    --levels) LEVELS=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --chunk) CHUNK=$2; shift ;;
    --runtime) RUNTIME=$2; shift ;;
    --mins) MINS=$2; shift ;;
    --json) JSON_OUT=$2; shift ;;
    --preallocate-spare) PREALLOC=1 ;;
    -h | --help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

def worker_sched(pid):
    """(run ns, runqueue-wait ns) of the server's md-background thread, from schedstat:
    its CPU time, and the time it was ready to run but waited for a CPU."""
    base = f"/proc/{pid}/task"
    try:
        for tid in os.listdir(base):
            try:
                if open(f"{base}/{tid}/comm").read().strip() == "md-background":
                    run, wait, _ = open(f"{base}/{tid}/schedstat").read().split()
                    return [int(tid), int(run), int(wait)]
            except OSError:
                pass
    except OSError:
        pass
    return None

def watch(sock, array, member, out, timeout, pid):
    """Samples the array's background job (and the worker thread's schedstat) every
    20 ms until the rebuild onto `member` ends (state other than running) or `timeout`
    passes; one JSON line per sample."""
    end = time.time() + float(timeout)
    with open(out, "w") as f:
        while time.time() < end:
            t = time.time()
            try:
                bg = get(sock, "/v1/arrays/" + array).get("background")
            except (OSError, ValueError) as e:
                bg = {"error": str(e)}
            f.write(json.dumps({"t": t, "bg": bg, "sched": worker_sched(pid)}) + "\n")
            f.flush()
            if bg and str(bg.get("member") or "").endswith(member) and bg.get("state") != "running":
                return 0 if bg.get("state") == "finished" else 1
            time.sleep(0.02)
    return 2

def reads(sock, export):
    return get(sock, "/v1/stats")["nodes"]["export:" + export]["stats"]["read"]["ops"]

def wait_reads(sock, export, n, timeout):
    """Returns once the export has served `n` more reads (a client is reading steadily)."""
    start = reads(sock, export)
    end = time.time() + float(timeout)
    while time.time() < end:
        if reads(sock, export) >= start + int(n):
            return 0
        time.sleep(0.01)
    return 1

def lat(log, t0=None, t1=None):
    """p50/p99/p99.9 and mean completion latency (µs) of the requests in fio's per-request
    log (Unix ms, ns) that completed in [t0, t1] (Unix seconds; default all)."""
    v = []
    lo = float(t0) * 1000 if t0 is not None else float("-inf")
    hi = float(t1) * 1000 if t1 is not None else float("inf")
    first = last = None
    try:
        for line in open(log):
            f = line.split(",")
            t = int(f[0])
            if lo <= t <= hi:
                v.append(int(f[1]))
                first = t if first is None else first
                last = t
    except OSError:
        return None
    if not v:
        return None
    v.sort()
    pct = lambda q: v[min(len(v) - 1, int(q * len(v)))] / 1000
    span = max((last - first) / 1000, 1e-3)
    return {"requests": len(v), "seconds": span, "iops": len(v) / span, "p50_us": pct(0.5),
            "p99_us": pct(0.99), "p999_us": pct(0.999), "mean_us": sum(v) / len(v) / 1000}

def rebuild(samples, member, t_add, t_fe=None):
    """Duration from the add to the first sample that shows the rebuild finished, the
    member bytes, and (under fio) the speed from the add to the end of fio or of the
    rebuild, whichever came first."""
    rows = [json.loads(l) for l in open(samples)]
    mine = [r for r in rows if r["bg"] and str(r["bg"].get("member") or "").endswith(member)]
    if not mine:
        return {"state": "never started"}
    last = mine[-1]["bg"]
    res = {"state": last.get("state"), "total_bytes": last.get("total_bytes"),
           "worked_bytes": last.get("worked_bytes"), "done_bytes": last.get("done_bytes")}
    t_add = float(t_add)
    if last.get("state") == "finished":
        t_end = next(r["t"] for r in mine if r["bg"].get("state") == "finished")
        res["seconds"] = t_end - t_add
        res["t_end"] = t_end
    # The worker thread starts at the add, so its totals are the rebuild's (up to the
    # last sample, at most 20 ms before the end).
    sched = [r["sched"] for r in mine if r.get("sched")]
    if sched:
        tid = sched[-1][0]
        run, wait = max((x[1], x[2]) for x in sched if x[0] == tid)
        res["worker_cpu_s"] = run / 1e9
        res["worker_runqueue_wait_s"] = wait / 1e9
    if t_fe is not None:
        upto = min(float(t_fe), res.get("t_end", float("inf")))
        before = [r for r in mine if r["t"] <= upto]
        if before:
            r = before[-1]
            res["fg_bytes_per_sec"] = r["bg"]["done_bytes"] / max(r["t"] - t_add, 1e-9)
        res["fg_seconds"] = upto - t_add
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
        print("| anchor (a filled member file, in /dev/shm) | GB/s | GB/s per CPU s |")
        print("|---|---:|---:|")
        for a in anchors:
            print(f"| {a['what']} | {g(a['gbps'], 2)} | {g(a.get('gbps_per_cpu_s'), 2)} |")
        print()
    levels = list(dict.fromkeys(r["level"] for r in recs if "level" in r))
    print("Rebuild speed (member bytes rebuilt per second; array = array bytes per second; "
          "CPU = the md-background thread's CPU time, wait = its time ready but not running):")
    print()
    print("| level | client I/O | speed-limit-min KiB/s | seconds | member GB/s | array GB/s "
          "| worker CPU s | waited for a CPU s | member GB/s per CPU s | rebuild MB/s while fio ran |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        for r in recs:
            if r.get("level") != lv or r["kind"] != "rebuild":
                continue
            b = r["rebuild"]
            s = b.get("seconds")
            cpu = b.get("worker_cpu_s")
            fg = b.get("fg_bytes_per_sec")
            state = "" if b.get("state") == "finished" else f" **{b.get('state')}**"
            io = "none" if r["tag"] == "idle" else "fio randread 4k QD1"
            print(f"| RAID{lv} | {io}{state} | {g(r['min_kib'])} | {g(s, 2)} "
                  f"| {g(b['total_bytes'] / s / 1e9 if s else None, 2)} | {g(r['array_bytes'] / s / 1e9 if s else None, 2)} "
                  f"| {g(cpu, 2)} | {g(b.get('worker_runqueue_wait_s'), 2)} "
                  f"| {g(b['total_bytes'] / cpu / 1e9 if cpu else None, 2)} "
                  f"| {g(fg / 1e6, 1) if fg is not None else '—'} |")
    print()
    print("Foreground fio (4k random reads, iodepth 1) idle and while a rebuild ran (completion "
          "latency; during a rebuild only the reads that completed while it ran count; the base "
          "of the ratio is the mean p99 of the two idle runs):")
    print()
    print("| level | rebuild | speed-limit-min KiB/s | rebuild MB/s meanwhile | reads | IOPS | p50 µs | p99 µs | p99.9 µs | p99 / idle p99 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        mine = [r for r in recs if r.get("level") == lv]
        idle = [r for r in mine if r["kind"] == "latency" and r["fio"]]
        base = sum(r["fio"]["p99_us"] for r in idle) / len(idle) if idle else None
        for r in mine:
            f = r.get("fio")
            if r["kind"] not in ("latency", "rebuild") or (r["kind"] == "rebuild" and r["tag"] == "idle"):
                continue
            f = f or {}
            p99 = f.get("p99_us")
            if r["kind"] == "latency":
                head = f"| RAID{lv} | none ({r['tag'].split(', ')[1]}) | | "
            else:
                fg = r["rebuild"].get("fg_bytes_per_sec")
                head = f"| RAID{lv} | running | {g(r['min_kib'])} | {g(fg / 1e6, 1) if fg is not None else '—'} "
            print(head + f"| {g(f.get('requests'))} | {g(f.get('iops'))} | {g(f.get('p50_us'))} | {g(p99)} "
                  f"| {g(f.get('p999_us'))} | {g(p99 / base, 2) if p99 and base else '—'} |")
    checks = [r for r in recs if r["kind"] == "check"]
    if checks:
        print()
        print("md check after the rebuilds: " + ", ".join(
            f"RAID{r['level']} " + ("failed" if not r["report"] else
                                    f"{r['report'].get('mismatch_sectors')} mismatched sectors")
            for r in checks))
    bad = [r for r in recs if r["kind"] == "rebuild" and r["rebuild"].get("state") != "finished"]
    if bad:
        print()
        print("rebuilds that did not finish: " + ", ".join(f"RAID{r['level']} {r['tag']}" for r in bad))
        return 1
    return 0

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "watch":
        sys.exit(watch(*sys.argv[2:8]))
    if cmd == "wait-reads":
        sys.exit(wait_reads(*sys.argv[2:6]))
    if cmd == "lat":
        print(json.dumps(lat(*sys.argv[2:5])))
    if cmd == "rebuild":
        print(json.dumps(rebuild(*sys.argv[2:6])))
    if cmd == "anchor":
        what, n, real, user, sys_ = sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:7])
        print(json.dumps({"kind": "anchor", "what": what, "gbps": n / real / 1e9,
                          "gbps_per_cpu_s": n / max(user + sys_, 1e-3) / 1e9}))
    if cmd == "last-io":
        t = None
        for line in open(sys.argv[2]):
            t = line.split(",", 1)[0]
        print(int(t) / 1000 if t else "")
    if cmd == "line":
        r = json.loads(sys.argv[2])
        s = r.get("seconds")
        speed = f"{s:.2f} s, {r['total_bytes'] / s / 1e9:.2f} GB/s of member bytes" if s else "no time"
        f = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
        fg = f", fio during it: p50 {f['p50_us']:.0f} µs p99 {f['p99_us']:.0f} µs over {f['requests']} reads" if f else ""
        print(f"  {sys.argv[3]:<22} {r.get('state')}, {speed}{fg}")
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

# fio 4k random reads, iodepth 1, RUNTIME seconds; NAME.fio.json in the results, and a
# per-request completion log (Unix-time milliseconds, nanoseconds) in the scratch
# directory, so that percentiles can be taken over the time a rebuild ran.
latency() { # NAME
  timeout $((RUNTIME + 120)) fio --name=lat --ioengine=nbd --uri="$URI" --rw=randread --bs=4k \
    --iodepth=1 --size="$ARRAY_BYTES" --time_based=1 --runtime="$RUNTIME" --randrepeat=1 \
    --norandommap=1 --write_lat_log="$SCRATCH/$1" --log_avg_msec=0 --log_unix_epoch=1 \
    --output-format=json --output="$OUT/$1.fio.json" >"$OUT/$1.fio.err" 2>&1 ||
    echo "rebuild: fio failed (see $OUT/$1.fio.err)" >&2
  rm -f "$SCRATCH/$1_lat.1.log" "$SCRATCH/$1_slat.1.log"
}
# The percentiles of NAME's log, all of it or [T0, T1] (Unix seconds), then drops the log.
lat_summary() { # NAME [T0 T1]
  python3 "$HELPER" lat "$SCRATCH/$1_clat.1.log" "${@:2}"
  rm -f "$SCRATCH/$1_clat.1.log"
}

SPARE_N=0
# Fails the member in role 1, removes it, adds a fresh sparse spare and waits for the
# rebuild onto it to finish. With "fio", the latency job starts first and the spare is
# added once the server has answered 2000 of its reads (fio is reading steadily); the latency
# figures are taken over the requests that completed while the rebuild ran.
rebuild_once() { # LEVEL TAG MIN_KIB fio|idle
  local lv=$1 tag=$2 min=$3 mode=$4 old=${MEMBERS[1]} spare samples t_add t_fe= watcher fio= rc=0 i
  SPARE_N=$((SPARE_N + 1))
  spare=$SCRATCH/spare$SPARE_N.img
  samples=$OUT/raid$lv-$tag.samples.jsonl
  "$CAIRN" md fail bench "$(basename "$old")" --control "$CTL" >>"$OUT/manage.log"
  "$CAIRN" md remove bench "$(basename "$old")" --control "$CTL" >>"$OUT/manage.log"
  rm -f "$old"
  truncate -s "$SIZE" "$spare"
  if [ "$PREALLOC" = 1 ]; then fallocate -l "$SIZE" "$spare"; fi
  python3 "$HELPER" watch "$CTL" bench "$(basename "$spare")" "$samples" 1200 "$SERVER_PID" &
  watcher=$!
  PIDS+=("$watcher")
  for i in $(seq 100); do [ -s "$samples" ] && break; sleep 0.05; done
  if [ "$mode" = fio ]; then
    latency "raid$lv-$tag" &
    fio=$!
    PIDS+=("$fio")
    python3 "$HELPER" wait-reads "$CTL" bench 2000 30 ||
      { echo "rebuild: RAID$lv $tag: fio did not start reading (see $OUT/raid$lv-$tag.fio.err)" >&2; exit 1; }
  fi
  t_add=$(now)
  "$CAIRN" md add bench "$spare" --control "$CTL" >>"$OUT/manage.log"
  MEMBERS[1]=$spare
  if [ -n "$fio" ]; then
    wait "$fio"
    # fio's last completion, not its exit: writing its logs takes a while, and the
    # rebuild runs at full speed meanwhile.
    t_fe=$(python3 "$HELPER" last-io "$SCRATCH/raid$lv-$tag""_clat.1.log")
    [ -n "$t_fe" ] || t_fe=$(now)
  fi
  wait "$watcher" || rc=$?
  [ $rc = 0 ] || echo "rebuild: RAID$lv $tag: the rebuild did not finish (watcher exit $rc, see $samples)" >&2
  local res f=null
  res=$(python3 "$HELPER" rebuild "$samples" "$(basename "$spare")" "$t_add" $t_fe)
  if [ "$mode" = fio ]; then
    f=$(lat_summary "raid$lv-$tag" "$t_add" "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(min(r.get("t_end", 1e18), float(sys.argv[2])))' "$res" "$t_fe")")
  fi
  record "{\"kind\":\"rebuild\",\"level\":$lv,\"tag\":\"$tag\",\"min_kib\":$min,\"array_bytes\":$ARRAY_BYTES,\"rebuild\":$res,\"fio\":$f}"
  python3 "$HELPER" line "$res" "RAID$lv $tag" "$f"
}

# dd of FILE to /dev/null and to a new file in /dev/shm, twice each: GB/s of wall time
# and per CPU second (user + system), the same two measures as the rebuild's.
anchor() { # FILE
  local i bytes t TIMEFORMAT='%R %U %S'
  bytes=$(stat -c %s "$1")
  for i in 1 2; do
    t=$({ time dd if="$1" of=/dev/null bs=1M 2>/dev/null; } 2>&1)
    record "$(python3 "$HELPER" anchor "read (dd bs=1M to /dev/null), run $i" "$bytes" $t)"
    t=$({ time dd if="$1" of="$SCRATCH/copy.img" bs=1M 2>/dev/null; } 2>&1)
    rm -f "$SCRATCH/copy.img"
    record "$(python3 "$HELPER" anchor "copy (dd bs=1M to a new file in /dev/shm), run $i" "$bytes" $t)"
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
  latency "raid$lv-idle1"
  record "{\"kind\":\"latency\",\"level\":$lv,\"tag\":\"idle, before\",\"fio\":$(lat_summary "raid$lv-idle1")}"
  rebuild_once "$lv" idle "$HIGH" idle
  for min in $MINS; do
    stop_server
    start_server "$min" "raid$lv-min$min"
    rebuild_once "$lv" "fio-min$min" "$min" fio
  done
  # The rebuilt member must hold the right data: a scrub compares parity/copies.
  "$CAIRN" --json md check bench --wait --control "$CTL" >"$OUT/raid$lv-check.json" ||
    echo "rebuild: RAID$lv: md check failed (see $OUT/raid$lv-check.json)" >&2
  record "{\"kind\":\"check\",\"level\":$lv,\"report\":$(cat "$OUT/raid$lv-check.json" 2>/dev/null || echo null)}"
  latency "raid$lv-idle2"
  record "{\"kind\":\"latency\",\"level\":$lv,\"tag\":\"idle, after\",\"fio\":$(lat_summary "raid$lv-idle2")}"
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
