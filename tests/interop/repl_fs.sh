#!/usr/bin/env bash
# Replication under a real filesystem and a slow replica: `cairn repl` on two nodes in
# their own network namespaces (real TCP over a veth pair), as in repl.sh.
#
# ext4_failover: ext4 on the primary's volume (nbdfuse + a loop device), files written and
# synced, then the primary is killed with SIGKILL while a writer is still going; the
# secondary is promoted, its volume attached the same way: after the journal replay
# (e2fsck -E journal_only) `e2fsck -fn` is clean and every file synced before the kill
# reads back with its checksum.
#
# slow_replica: the secondary's backing disk is an nbdkit export behind the pause filter
# (`--disk nbd+unix://...`); with its disk paused, the primary's writes and flushes still
# complete within --peer-timeout plus slack, the primary drops the peer and counts what it
# misses; once the disk resumes, the primary reconnects and resyncs, and the data areas
# of both backing files are equal.
. "$(dirname "$0")/lib.sh"

TAG=rf$$
IP=([1]=10.233.1.1 [2]=10.233.1.2)
PEER_TIMEOUT=3

. "$INTEROP_DIR/repl_lib.sh"

# attach N URI: nbdfuse exposes URI as $WORK/fuseN/nbd, a loop device on it; sets LOOP.
# Everything is registered for cleanup (lib.sh unwinds loop before fuse before pid).
attach() {
  local fuse=$WORK/fuse$1
  mkdir -p "$fuse"
  nbdfuse "$fuse/nbd" "$2" &
  FUSE_PID[$1]=$!
  register pid "${FUSE_PID[$1]}"
  register fuse "$fuse"
  local i
  for i in $(seq 100); do
    [ -e "$fuse/nbd" ] && break
    sleep 0.1
  done
  [ -e "$fuse/nbd" ] || fail "nbdfuse did not show $fuse/nbd within 10 s"
  LOOP=$(losetup -f --show "$fuse/nbd")
  register loop "$LOOP"
}

# tear_down_dead N MNT LOOP: the filesystem on a volume whose server is gone: lazy
# unmount, detach the loop device (autoclear if still busy), end nbdfuse, unmount FUSE.
# Nothing here may block on I/O that cannot complete.
tear_down_dead() {
  local fuse=$WORK/fuse$1
  umount -l "$2" 2>/dev/null || true
  losetup -d "$3" 2>/dev/null || true
  kill -TERM "${FUSE_PID[$1]}" 2>/dev/null || true
  local i
  for i in $(seq 50); do kill -0 "${FUSE_PID[$1]}" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "${FUSE_PID[$1]}" 2>/dev/null || true
  fusermount3 -uz "$fuse" 2>/dev/null || true
  # The loop device goes once its last user (the lazily unmounted ext4) lets go.
  for i in $(seq 100); do
    losetup "$3" >/dev/null 2>&1 || return 0
    sleep 0.1
  done
  say "warning: $3 is still attached after the teardown: $(losetup "$3")"
}

t_ext4_failover() {
  need_fuse
  need_tool losetup mount umount mkfs.ext4 e2fsck sha256sum
  SIZE=96M nodes_up
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)" >/dev/null
  wait_peer 1 Established
  wait_peer 2 Established

  attach 1 "$(client_uri 1)"
  local loop1=$LOOP mnt=$WORK/mnt
  mkdir -p "$mnt"
  timeout -k 5 60 mkfs.ext4 -q -F "$loop1"
  timeout -k 5 30 mount "$loop1" "$mnt"
  register mount "$mnt"
  # Synced: big and small files, directories, a rename; sums kept outside.
  mkdir -p "$mnt/synced/deep/er" "$mnt/late"
  local i
  for i in 1 2 3 4; do random_file "$mnt/synced/big$i.bin" 3M; done
  for i in $(seq 60); do head -c $((RANDOM % 20000 + i)) /dev/urandom >"$mnt/synced/deep/er/s$i"; done
  mv "$mnt/synced/big4.bin" "$mnt/synced/deep/big4.bin"
  timeout -k 5 60 sync -f "$mnt" || fail "sync of the filesystem on node 1 failed or hung"
  (cd "$mnt" && find synced -type f -print0 | sort -z | xargs -0 sha256sum) >"$WORK/sums"
  say "synced $(wc -l <"$WORK/sums") files, $(du -sm "$mnt/synced" | cut -f1) MiB"
  # A writer still going when the primary dies: files rewritten over and over (64 names,
  # 16 MiB at most, so it cannot fill the filesystem), an fsync now and then.
  (
    n=0
    while :; do
      n=$((n + 1))
      head -c $((256 * 1024 + RANDOM)) /dev/urandom >"$mnt/late/f$((n % 64))" || exit 0
      [ $((n % 8)) = 0 ] && { sync -f "$mnt" || exit 0; }
    done
  ) >/dev/null 2>&1 &
  local wpid=$!
  register pid "$wpid"
  sleep 1.5
  kill -0 "$wpid" 2>/dev/null || fail "the writer stopped before the kill"
  kill -KILL "${NPID[1]}"
  wait "${NPID[1]}" 2>/dev/null || true
  say "node 1 killed under the writer"
  # The writer is killed too; its I/O fails (EIO from nbdfuse) rather than hangs.
  kill -KILL "$wpid" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$wpid" 2>/dev/null && say "warning: the writer is stuck: $(cat /proc/"$wpid"/stack 2>/dev/null | head -3)"
  tear_down_dead 1 "$mnt" "$loop1"

  # Node 2 takes over: its volume holds a filesystem with at most a journal to replay.
  timeout -k 5 30 "$CAIRN" repl primary home --control "$(ctl 2)"
  expect_eq "$(status_json 2 | jq -r .role)" Primary "node 2's role"
  attach 2 "$(client_uri 2)"
  local loop2=$LOOP rc=0
  timeout -k 5 60 e2fsck -y -E journal_only "$loop2" >"$WORK/replay.out" 2>&1 || rc=$?
  say "journal replay: exit $rc: $(tr '\n' ' ' <"$WORK/replay.out")"
  [ "$rc" -le 1 ] || fail "e2fsck -E journal_only exited $rc"
  rc=0
  timeout -k 5 60 e2fsck -fn "$loop2" >"$WORK/fsck.out" 2>&1 || rc=$?
  [ "$rc" = 0 ] || fail "e2fsck -fn on node 2 after the failover exited $rc: $(tail -20 "$WORK/fsck.out")"
  say "e2fsck -fn clean: $(tail -1 "$WORK/fsck.out")"
  timeout -k 5 30 mount "$loop2" "$mnt"
  register mount "$mnt"
  (cd "$mnt" && timeout -k 5 60 sha256sum --quiet -c "$WORK/sums") ||
    fail "files synced before the kill differ on node 2"
  say "all $(wc -l <"$WORK/sums") synced files intact on node 2"
  # The new primary keeps serving: write and read back through it.
  random_file "$mnt/after.bin" 2M
  sha256sum "$mnt/after.bin" >"$WORK/after.sum"
  timeout -k 5 30 umount "$mnt"
  losetup -d "$loop2"
  fusermount3 -u "$WORK/fuse2"
  # The old primary comes back as secondary and is resynced from node 2.
  node_up 1
  wait_peer 2 Established 400
  expect_eq "$(status_json 1 | jq -r .disk)" UpToDate "node 1's disk after the resync"
  "$CAIRN" repl secondary home --control "$(ctl 2)" >/dev/null
  cmp -n "$(status_json 2 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" ||
    fail "the replicas differ after node 1's resync"
}

# pause_ctl CMD: p or r to nbdkit's pause filter; waits for its P or R.
pause_ctl() {
  timeout -k 2 30 /usr/bin/python3 - "$WORK/pause.sock" "$1" <<'EOF' || fail "pause filter: no answer to $1"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode())
want = sys.argv[2].upper().encode()
while True:
    c = s.recv(1)
    if not c:
        sys.exit("pause socket closed")
    if c == want:
        break
EOF
}

now() { date +%s.%N; }

# nbdkit_disk2 FILTER-ARGS...: node 2's disk becomes an nbdkit export (file plugin, the
# filters given) of its file, served in node 2's namespace; sets DISK[2] to its URI.
nbdkit_disk2() {
  local filters=() params=() a
  for a in "$@"; do
    case $a in --filter=*) filters+=("$a") ;; *) params+=("$a") ;; esac
  done
  # A socket left by the previous test's nbdkit would pass for this one's.
  rm -f "$WORK/disk2.sock" "$WORK/pause.sock"
  ip netns exec "${NS[2]}" nbdkit -f -U "$WORK/disk2.sock" "${filters[@]}" file "$SHM/n2.img" \
    "${params[@]}" >"$WORK/nbdkit.log" 2>&1 &
  register pid $!
  local n
  for n in $(seq 100); do [ -S "$WORK/disk2.sock" ] && break; sleep 0.1; done
  [ -S "$WORK/disk2.sock" ] || fail "nbdkit did not start: $(cat "$WORK/nbdkit.log")"
  DISK[2]="nbd+unix:///disk?socket=$WORK/disk2.sock"
}

t_slow_replica() {
  need_tool nbdkit
  [ -e "$(nbdkit --dump-config | sed -n 's/^filterdir=//p')/nbdkit-pause-filter.so" ] ||
    skip "nbdkit's pause filter is missing"
  PEER_TIMEOUT=2
  SIZE=32M nodes_up
  # Node 2's disk is an nbdkit export of its file, behind the pause filter, in its namespace.
  nbdkit_disk2 --filter=pause pause-control="$WORK/pause.sock"
  local n
  for n in $(seq 100); do [ -S "$WORK/pause.sock" ] && break; sleep 0.1; done
  [ -S "$WORK/pause.sock" ] || fail "nbdkit has no pause socket: $(cat "$WORK/nbdkit.log")"
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)" >/dev/null
  wait_peer 1 Established
  local data
  data=$(status_json 1 | jq -r .data_size)

  # A writer on node 1: 64 KiB writes at random offsets, a flush every 8th, each timed.
  /usr/bin/python3 - "$(client_uri 1)" "$WORK/stop" "$WORK/lat" >"$WORK/writer.out" 2>&1 <<'EOF' &
import nbd, os, random, sys, time
uri, stop, out = sys.argv[1:4]
h = nbd.NBD()
h.connect_uri(uri)
blocks = h.get_size() // 65536
buf = os.urandom(65536)
rows = []
i = 0
while not os.path.exists(stop):
    t = time.time()
    h.pwrite(buf, random.randrange(blocks) * 65536)
    if i % 8 == 7:
        h.flush()
    rows.append((t, time.time() - t))
    i += 1
    time.sleep(0.01)
h.flush()
h.shutdown()
with open(out, "w") as f:
    for t, d in rows:
        f.write(f"{t:.3f} {d:.3f}\n")
print(f"{len(rows)} writes")
EOF
  local wpid=$!
  register pid "$wpid"
  sleep 1
  # Node 2's disk stops answering: node 1 must drop it within the peer timeout.
  local paused resumed dropped
  pause_ctl p
  paused=$(now)
  for n in $(seq $(((PEER_TIMEOUT + 6) * 10))); do
    [ "$(peer_field 1 connection)" != Connected ] && break
    sleep 0.1
  done
  dropped=$(now)
  [ "$(peer_field 1 connection)" != Connected ] ||
    fail "node 1 still holds node 2 $((PEER_TIMEOUT + 6)) s after its disk paused: $(status_text 1)"
  say "node 2 dropped $(py -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$paused" "$dropped") s after its disk paused: $(peer_field 1 last_error)"
  # Writes go on while node 2 is away, counted out of sync.
  sleep 3
  local oos
  oos=$(peer_field 1 out_of_sync_bytes)
  [ "$oos" -gt 0 ] || fail "node 1 counts nothing out of sync with a paused peer: $(status_text 1)"
  expect_contains "Off Connecting StandAlone" "$(peer_field 1 replication)" "node 2's replication state while paused"
  say "while paused: $(peer_field 1 connection)/$(peer_field 1 replication), $oos bytes out of sync"
  kill -0 "$wpid" 2>/dev/null || fail "the writer died: $(cat "$WORK/writer.out")"
  pause_ctl r
  resumed=$(now)
  # Node 1 reconnects by itself and resyncs.
  for n in $(seq 300); do
    [ "$(peer_field 1 replication)" = Established ] && [ "$(peer_field 1 out_of_sync_bytes)" = 0 ] && break
    sleep 0.1
  done
  [ "$(peer_field 1 replication)" = Established ] ||
    fail "node 1 did not resync node 2 within 30 s of its disk resuming: $(status_text 1)"
  say "resynced $(py -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$resumed" "$(now)") s after the resume: $(status_json 1 | jq -r '[.events[] | select(.kind == "resync-done")] | last | .message')"
  sleep 1
  touch "$WORK/stop"
  timeout -k 2 30 tail --pid="$wpid" -f /dev/null || fail "the writer hangs after the resync"
  wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
  # Every write and flush completed in bounded time, and some while node 2 was paused.
  py - "$WORK/lat" "$paused" "$resumed" "$PEER_TIMEOUT" <<'EOF' >"$WORK/lat.out" || fail "$(cat "$WORK/lat.out")"
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
paused, resumed, limit = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]) + 2.0
worst = max(rows, key=lambda r: r[1])
during = [r for r in rows if paused + float(sys.argv[4]) + 1 < r[0] < resumed]
print(f"{len(rows)} writes, the slowest {worst[1]:.2f} s at {worst[0] - paused:+.1f} s from the pause, "
      f"{len(during)} started and completed while node 2 was away")
if worst[1] > limit:
    sys.exit(f"FAIL: a write took {worst[1]:.2f} s (limit {limit:.1f} s: the peer timeout + 2 s)")
if not during:
    sys.exit("FAIL: no write completed while node 2's disk was paused")
EOF
  say "$(cat "$WORK/lat.out")"
  "$CAIRN" repl secondary home --control "$(ctl 1)" >/dev/null
  cmp -n "$data" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ after the resync"
}

# A replica that is slow but answers within the peer timeout stays connected: node 2's
# disk delays every write by 0.8 s (nbdkit delay filter), --peer-timeout is 3 s, and
# writes come after idle gaps shorter and longer than the timeout. Gaps of 2.2-3 s after
# the last reply are the ones that sent a write just before the data connection's idle
# read timed out, which dropped the peer after a fraction of the timeout (fixed in the
# NBD client's pipeline reader: the timeout counts from the oldest request's sending).
t_slow_but_alive() {
  need_tool nbdkit
  [ -e "$(nbdkit --dump-config | sed -n 's/^filterdir=//p')/nbdkit-delay-filter.so" ] ||
    skip "nbdkit's delay filter is missing"
  PEER_TIMEOUT=3
  SIZE=8M nodes_up
  nbdkit_disk2 --filter=delay delay-write=800ms
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)" >/dev/null
  wait_peer 1 Established 600
  timeout -k 2 60 /usr/bin/python3 - "$(client_uri 1)" >"$WORK/writer.out" 2>&1 <<'EOF' ||
import nbd, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
gaps = [2.5, 0.3, 5.6, 1.0, 2.6, 2.4, 0.1]
worst = 0.0
for i, gap in enumerate(gaps):
    time.sleep(gap)
    t = time.monotonic()
    h.pwrite(bytes([i + 1]) * 4096, i * 65536)
    worst = max(worst, time.monotonic() - t)
h.shutdown()
print(f"{len(gaps)} writes, the slowest {worst:.2f} s")
EOF
    fail "the writer failed: $(cat "$WORK/writer.out")"
  say "$(cat "$WORK/writer.out")"
  local drops
  drops=$(status_json 1 | jq -r '[.events[] | select(.kind == "disconnect") | .message] | join("; ")')
  [ -z "$drops" ] || fail "node 2 answered every write within 0.8 s, yet node 1 dropped it ($PEER_TIMEOUT s peer timeout): $drops"
  expect_eq "$(peer_field 1 replication)" Established "node 2's replication state"
  "$CAIRN" repl secondary home --control "$(ctl 1)" >/dev/null
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

run_test ext4_failover t_ext4_failover
run_test slow_replica t_slow_replica
run_test slow_but_alive t_slow_but_alive
finish
