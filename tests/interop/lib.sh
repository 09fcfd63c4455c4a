# Shared helpers for the interop tests. Source it from a topic script:
#
#   . "$(dirname "$0")/lib.sh"
#   t_something() { start_cairn "$file"; nbdinfo "$(unix_uri disk)"; ... }
#   run_test something t_something
#   finish
#
# Each test runs in a subshell with `set -e`: the first failing command fails the test.
# Everything a test sets up (servers, nbdfuse, loop devices, mounts) is recorded in a
# registry file and torn down after the test, pass or fail, and again on exit, so nothing
# is left behind even when a test dies half-way.
#
# Results go to $INTEROP_RESULTS (one "PASS|FAIL|SKIP topic/name" line each), which
# scripts/test.sh sums up. A test whose tool is missing is a SKIP with a reason, except
# in CI (CI=true), where every tool must be there and a missing one is a FAIL.
#
# Environment: CAIRN (the binary; default: build and use target/release/cairn),
# KEEP_WORK=1 keeps the temp directories for a post-mortem, VERBOSE=1 shows the output of
# passing tests too.

set -uo pipefail

INTEROP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$INTEROP_DIR/../.." && pwd)
export PATH="${HOME:-/root}/.cargo/bin:$PATH:/usr/sbin:/sbin"
TOPIC=$(basename "$0" .sh)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cairn-$TOPIC.XXXXXX")
# Big scratch data lives in RAM so the tests measure cairn, not the disk.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  SHM=$(mktemp -d "/dev/shm/cairn-$TOPIC.XXXXXX")
else
  SHM=$WORK/shm
  mkdir -p "$SHM"
fi
REGISTRY=$WORK/registry
: >"$REGISTRY"
RESULTS=${INTEROP_RESULTS:-$WORK/results}
LOCAL_RESULTS=$WORK/local-results
: >"$LOCAL_RESULTS"
SKIP_CODE=77

say() { printf '%s\n' "$*"; }

# --- the binary ------------------------------------------------------------------------

if [ -z "${CAIRN:-}" ]; then
  say "building cairn (release) ..."
  (cd "$REPO" && cargo build --release -q -p cairn-cli) || {
    say "FAIL: cannot build cairn"
    exit 1
  }
  CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn
fi
[ -x "$CAIRN" ] || { say "FAIL: $CAIRN is not an executable"; exit 1; }
CAIRN=$(realpath "$CAIRN")
# Tools that drop files in the current directory (fio's verify state) drop them here.
cd "$WORK" || exit 1

# --- cleanup ---------------------------------------------------------------------------

# register KIND VALUE: remember something to undo. KIND: pid, fuse, loop, mount, netns,
# dir (removed with everything in it: data a test's servers keep, e.g. etcd's).
register() { printf '%s %s\n' "$1" "$2" >>"$REGISTRY"; }

# descendants PID: the PIDs of PID's children, grandchildren, ... (a registered PID may
# be a subshell, e.g. `some_function &`, whose real work runs in a child).
descendants() {
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

# stop_tree PID: SIGTERM to PID and its descendants, SIGKILL after 5 s.
stop_tree() {
  local pids p
  pids="$1 $(descendants "$1")"
  for p in $pids; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    any_alive $pids || return 0
    sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null; done
  return 0
}

any_alive() {
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# Undoes everything registered, newest first: a mount before its loop device, a loop
# device before the nbdfuse file under it, nbdfuse before the server it talks to.
cleanup_resources() {
  local kind value
  [ -s "$REGISTRY" ] || return 0
  while read -r kind value; do
    case $kind in
      mount) mountpoint -q "$value" 2>/dev/null && { umount "$value" 2>/dev/null || umount -l "$value"; } ;;
      loop) losetup -d "$value" 2>/dev/null ;;
      fuse) mountpoint -q "$value" 2>/dev/null && { fusermount3 -u "$value" 2>/dev/null || fusermount3 -uz "$value" 2>/dev/null; } ;;
      pid) stop_tree "$value" ;;
      netns) ip netns del "$value" 2>/dev/null ;;
      dir) rm -rf "$value" ;;
    esac
  done < <(tac "$REGISTRY")
  : >"$REGISTRY"
}

on_exit() {
  cleanup_resources
  if [ "${KEEP_WORK:-0}" = 1 ]; then
    say "(kept $WORK and $SHM)"
  else
    rm -rf "$WORK" "$SHM"
  fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# --- assertions ------------------------------------------------------------------------

fail() { say "FAIL: $*" >&2; exit 1; }

# skip REASON: a tool or kernel feature is missing. In CI that is a failure.
skip() {
  if [ "${CI:-}" = true ]; then
    say "FAIL: $* (CI=true: every tool must be installed; run scripts/install-deps.sh)" >&2
    exit 1
  fi
  say "SKIP: $*" >&2
  exit $SKIP_CODE
}

need_tool() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || skip "$t is not installed (scripts/install-deps.sh installs it)"
  done
}

need_root() { [ "$(id -u)" -eq 0 ] || skip "needs root (loop devices and mount)"; }

need_fuse() {
  [ -c /dev/fuse ] || skip "/dev/fuse is missing (FUSE is not available here)"
  need_tool nbdfuse fusermount3
}

expect_eq() { # ACTUAL EXPECTED WHAT
  [ "$1" = "$2" ] || fail "$3: got '$1', expected '$2'"
}

expect_contains() { # HAYSTACK NEEDLE WHAT
  case $1 in *"$2"*) ;; *) fail "$3: '$2' not found in: $1" ;; esac
}

# expect_status WANT CMD...: runs CMD and checks its exit status.
expect_status() {
  local want=$1 got=0
  shift
  "$@" || got=$?
  [ "$got" = "$want" ] || fail "'$*' exited $got, expected $want"
}

# nbdsh runs the system python, which has the nbd module; a pyenv python first in PATH
# does not. Two minutes at most: a hung server must fail the test, not hang it.
nbdsh() { PATH=/usr/bin:$PATH timeout 120 nbdsh "$@"; }

# py: the JSON and byte fiddling the tests need, without jq.
py() { /usr/bin/python3 "$@"; }

# --- cairn -----------------------------------------------------------------------------

# start_cairn [SERVE-ARGS...] FILE...: serves on a Unix socket in $WORK and a free TCP port
# on 127.0.0.1, waits until it listens, and sets CAIRN_PID, CAIRN_SOCK, CAIRN_PORT,
# CAIRN_JSON (the announcement), CAIRN_LOG (its stderr).
CAIRN_N=0
start_cairn() {
  CAIRN_N=$((CAIRN_N + 1))
  CAIRN_SOCK=$WORK/cairn$CAIRN_N.sock
  CAIRN_JSON=$WORK/cairn$CAIRN_N.json
  CAIRN_LOG=$WORK/cairn$CAIRN_N.log
  # Each test is a subshell, so CAIRN_N starts again at 1 in $WORK: a previous test's
  # announcement must not pass for this one's before the new server truncates it.
  rm -f "$CAIRN_JSON" "$CAIRN_LOG"
  # CAIRN_WRAP (e.g. "ip netns exec NS") runs the server inside something; it must exec.
  ${CAIRN_WRAP:-} "$CAIRN" serve --json --listen "unix:$CAIRN_SOCK" --listen tcp:127.0.0.1:0 "$@" \
    >"$CAIRN_JSON" 2>"$CAIRN_LOG" &
  CAIRN_PID=$!
  register pid "$CAIRN_PID"
  local i
  # The announcement is one line: wait for its newline, not just its first bytes.
  for i in $(seq 100); do
    [ -s "$CAIRN_JSON" ] && [ -z "$(tail -c1 "$CAIRN_JSON")" ] && break
    kill -0 "$CAIRN_PID" 2>/dev/null || fail "cairn serve $* exited at start: $(cat "$CAIRN_LOG")"
    sleep 0.1
  done
  [ -s "$CAIRN_JSON" ] && [ -z "$(tail -c1 "$CAIRN_JSON")" ] ||
    fail "cairn serve $* did not announce itself within 10 s"
  CAIRN_PORT=$(py -c 'import json,sys; j=json.load(open(sys.argv[1]));
print([l["port"] for l in j["listen"] if l["type"]=="tcp"][0])' "$CAIRN_JSON")
}

unix_uri() { printf 'nbd+unix:///%s?socket=%s' "$1" "$CAIRN_SOCK"; }
tcp_uri() { printf 'nbd://127.0.0.1:%s/%s' "$CAIRN_PORT" "$1"; }

# stop_cairn [SIGNAL]: signals the server (default TERM; 0 sends nothing) and waits; sets CAIRN_STATUS and
# CAIRN_STOP_SECONDS. Fails the test if it does not exit within 30 s.
stop_cairn() {
  local sig=${1:-TERM} start i
  start=$(date +%s.%N)
  [ "$sig" = 0 ] || kill "-$sig" "$CAIRN_PID"
  for i in $(seq 300); do
    kill -0 "$CAIRN_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$CAIRN_PID" 2>/dev/null && fail "cairn did not exit within 30 s of SIG$sig"
  CAIRN_STATUS=0
  wait "$CAIRN_PID" || CAIRN_STATUS=$?
  CAIRN_STOP_SECONDS=$(py -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" \
    "$start" "$(date +%s.%N)")
}

# random_file PATH SIZE: SIZE bytes of random data (fast: AES-CTR keystream if openssl
# is there, /dev/urandom otherwise).
random_file() {
  local bytes
  bytes=$(numfmt --from=iec "$2")
  if command -v openssl >/dev/null 2>&1; then
    head -c "$bytes" < <(openssl enc -aes-128-ctr -nosalt -pass "pass:$RANDOM$RANDOM" \
      </dev/zero 2>/dev/null) >"$1"
  else
    head -c "$bytes" /dev/urandom >"$1"
  fi
  [ "$(stat -c %s "$1")" = "$bytes" ] || fail "could not make $2 of random data in $1"
}

# --- seeded choices and fio under a server that may die -----------------------------------

# rng N: sets R to a number in [0, N) from RNG (seed it from the run's SEED first): a
# 64-bit LCG in bash arithmetic, the same on every bash; not $RANDOM, which bash reseeds
# in subshells such as $(...), so a replay would not repeat it.
rng() {
  RNG=$((RNG * 6364136223846793005 + 1442695040888963407))
  R=$((((RNG >> 33) & 0x7fffffff) % $1))
}

# fio_nbd NAME URI OUT ARGS...: fio's nbd engine on URI, JSON to OUT.json, stdout to
# OUT.stdout, stderr to OUT.err. A fio whose server died can spin printing errors (seen
# with fio 3.33): its stderr is capped (a full pipe ends it with SIGPIPE) and timeout
# kills it for sure, so it can neither outlive the test nor fill the disk.
fio_nbd() {
  local name=$1 uri=$2 out=$3
  shift 3
  timeout -k 5 120 fio --name="$name" --ioengine=nbd --uri="$uri" "$@" \
    --output-format=json --output="$out.json" >"$out.stdout" 2> >(head -c 1000000 >"$out.err")
}

# fio_verified W V STATUS LABEL DETAILS: the checks of a `fio --verify_only` run (JSON in
# V.json, stderr in V.err, exit STATUS) against the write run it replays (W.json, already
# cleaned): exit 0, no verify message, 0 errors, and exactly the bytes each job wrote
# read back, more than none (each connection's replies in order: the writes fio saw
# complete are those before the first failed one). Sets VERIFIED (bytes). DETAILS is
# called before a failure.
fio_verified() {
  local w=$1 v=$2 status=$3 label=$4 details=$5
  if [ "$status" != 0 ] || grep -qiE 'verify|bad magic|crc32c' "$v.err"; then
    "$details"
    fail "fio --verify_only $label failed (exit $status)"
  fi
  sed -n '/^{/,$p' "$v.json" >"$v.clean.json" && mv "$v.clean.json" "$v.json"
  expect_eq "$(jq '[.jobs[].error] | add' "$v.json")" 0 "fio errors in --verify_only ($label)"
  VERIFIED=$(jq '[.jobs[].read.io_bytes] | add' "$v.json")
  expect_eq "$(jq -c '[.jobs[].read.io_bytes]' "$v.json")" \
    "$(jq -c '[.jobs[].write.io_bytes]' "$w.json")" "bytes verified vs written, per job ($label)"
  [ "$VERIFIED" -gt 0 ] || { "$details"; fail "fio verified nothing ($label)"; }
}

# --- running tests ---------------------------------------------------------------------

# run_test NAME FUNCTION: runs FUNCTION in a subshell with set -e, records the result,
# shows the test's output only when it did not pass.
# CAIRN_TESTS="name name2" runs only those tests of a topic (while working on one); CI
# never sets it.
run_test() {
  local name=$1 fn=$2 log=$WORK/test-$1.log status start secs
  if [ -n "${CAIRN_TESTS:-}" ] && [[ " $CAIRN_TESTS " != *" $name "* ]]; then
    return 0
  fi
  start=$(date +%s)
  (
    set -e
    "$fn"
  ) >"$log" 2>&1
  status=$?
  cleanup_resources
  secs=$(($(date +%s) - start))
  case $status in
    0)
      say "PASS $TOPIC/$name (${secs}s)"
      [ "${VERBOSE:-0}" = 1 ] && sed 's/^/    | /' "$log"
      echo "PASS $TOPIC/$name" >>"$LOCAL_RESULTS"
      ;;
    "$SKIP_CODE")
      say "SKIP $TOPIC/$name: $(grep -m1 '^SKIP:' "$log" | sed 's/^SKIP: //')"
      say "     !!!!! SKIPPED, NOT TESTED !!!!!"
      echo "SKIP $TOPIC/$name" >>"$LOCAL_RESULTS"
      ;;
    *)
      say "FAIL $TOPIC/$name (${secs}s, status $status); its output:"
      sed 's/^/    | /' "$log" | tail -n 60
      echo "FAIL $TOPIC/$name" >>"$LOCAL_RESULTS"
      ;;
  esac
  # Informational lines a test wants in the summary (timings, versions).
  grep '^NOTE:' "$log" | sed "s|^NOTE:|     note $TOPIC/$name:|" || true
}

# finish: appends this script's results to $INTEROP_RESULTS, prints its tally, and exits
# non-zero if anything failed.
finish() {
  cat "$LOCAL_RESULTS" >>"$RESULTS"
  local p f s
  p=$(grep -c '^PASS' "$LOCAL_RESULTS")
  f=$(grep -c '^FAIL' "$LOCAL_RESULTS")
  s=$(grep -c '^SKIP' "$LOCAL_RESULTS")
  say "$TOPIC: $p passed, $f failed, $s skipped"
  [ "$f" -eq 0 ]
}

# --- md ----------------------------------------------------------------------------------

# bitmap_x MEMBER: mdadm -X on a read-only loop device over MEMBER (mdadm 4.2 reads a
# plain file as an external bitmap), as KEY=value lines in $WORK/x.env.
bitmap_x() {
  local l
  l=$(losetup -r -f --show "$1") || fail "losetup -r $1"
  register loop "$l"
  mdadm -X "$l" >"$WORK/x.txt" 2>&1 || fail "mdadm -X $1: $(cat "$WORK/x.txt")"
  losetup -d "$l"
  py - "$WORK/x.txt" >"$WORK/x.env" <<'EOF2'
import re, sys
f = {}
for line in open(sys.argv[1]):
    if " : " in line:
        k, v = line.split(" : ", 1)
        f[k.strip()] = v.strip()
m = re.match(r"(\d+) bits \(chunks\), (\d+) dirty", f["Bitmap"])
print(f"X_UUID={f['UUID']}\nX_EVENTS={f['Events']}\nX_CLEARED={f['Events Cleared']}")
print(f"X_CHUNK='{f['Chunksize']}'\nX_SYNC={f['Sync Size'].split()[0]}\nX_STATE={f['State']}")
print(f"X_BITS={m.group(1)}\nX_DIRTY={m.group(2)}\nX_MAGIC={f['Magic']}")
EOF2
  # shellcheck disable=SC1091
  . "$WORK/x.env"
}

# --- a kernel block device on an export ---------------------------------------------------

# attach_export URI: nbdfuse exposes the export as a file, a loop device makes it a block
# device; sets LOOP. detach_export undoes both (cleanup does it too if a test fails).
attach_export() {
  local uri=$1 fuse=$WORK/fuse
  mkdir -p "$fuse"
  nbdfuse "$fuse/nbd" "$uri" &
  register pid $!
  register fuse "$fuse"
  local i
  for i in $(seq 100); do
    [ -e "$fuse/nbd" ] && break
    sleep 0.1
  done
  [ -e "$fuse/nbd" ] || fail "nbdfuse did not show $fuse/nbd within 10 s"
  # The loop device's sector is the export's minimum block (4096 on LUKS2 with 4K
  # sectors), so the kernel never sends nbdfuse a write the export would refuse.
  local bs
  bs=$(nbdinfo --json "$uri" | py -c 'import json,sys
print(json.load(sys.stdin)["exports"][0].get("block_size_minimum", 512))')
  [ "$bs" -ge 512 ] 2>/dev/null || bs=512
  LOOP=$(losetup -f --show -b "$bs" "$fuse/nbd")
  register loop "$LOOP"
  say "export $uri is $LOOP"
}

detach_export() {
  losetup -d "$LOOP"
  fusermount3 -u "$WORK/fuse"
}

# ns_star N OCTET LETTER ARRAY: a hub namespace ${TAG}h (its name in H) and N namespaces
# ${TAG}LETTER1..N (their names in ARRAY[1..N]), each joined to the hub by a veth pair:
# the hub at 10.OCTET.i.1, namespace i at 10.OCTET.i.2 (/24). All removed at cleanup.
ns_star() {
  local -n star=$4
  need_root
  need_tool ip
  H=${TAG}h
  ip netns add "$H" || fail "ip netns add $H"
  register netns "$H"
  ip -n "$H" link set lo up
  star=()
  local i m
  for i in $(seq 1 "$1"); do
    m=${TAG}$3$i
    ip netns add "$m" || fail "ip netns add $m"
    register netns "$m"
    star[i]=$m
    ip -n "$m" link set lo up
    ip link add "${TAG}a$i" netns "$H" type veth peer name "${TAG}b$i" netns "$m" ||
      fail "veth pair $i"
    ip -n "$H" addr add "10.$2.$i.1/24" dev "${TAG}a$i"
    ip -n "$H" link set "${TAG}a$i" up
    ip -n "$m" addr add "10.$2.$i.2/24" dev "${TAG}b$i"
    ip -n "$m" link set "${TAG}b$i" up
  done
}
