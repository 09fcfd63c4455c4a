#!/usr/bin/env bash
# Mirrored between machines: `cairn repl` on two nodes in their own network namespaces
# (real TCP over a veth pair). The primary is killed with SIGKILL at random moments while
# a writer logs every acknowledged write (acked_writes.py); the secondary is promoted and
# holds every acknowledged write; the old primary comes back as secondary and is resynced
# from the bitmap and its activity log only. A partition with writes on both sides is
# detected as split brain on both nodes and resolved with --discard-my-data. The same
# failovers again under fio verify (failover_fio): after each kill, fio --verify_only
# through the promoted node finds every write fio saw acknowledged.
#
# CAIRN_REPL_KILLS (default 2) kills per run, in failover and again in failover_fio;
# CAIRN_REPL_KILLS=50 is the long mode. CAIRN_REPL_SPLITS (default 3) partitions.
# CAIRN_SEED replays a run's random choices. CAIRN_REPL_FIO_CORRUPT=1 shows that
# failover_fio's check bites (below).
. "$(dirname "$0")/lib.sh"

KILLS=${CAIRN_REPL_KILLS:-2}
SPLITS=${CAIRN_REPL_SPLITS:-3}
SEED=${CAIRN_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
say "repl: seed $SEED, $KILLS kills, $SPLITS partitions (replay: CAIRN_SEED=$SEED)"
ORACLE=$INTEROP_DIR/acked_writes.py
TAG=rp$$
IP=([1]=10.232.1.1 [2]=10.232.1.2)

. "$INTEROP_DIR/repl_lib.sh"

t_failover() {
  nodes_up
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --control "$(ctl 2)" && fail "blank data became primary without --force"
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  wait_peer 2 Established
  local k p=1 s=2 bs=4096 blocks size
  size=$(nbdinfo --size "$(client_uri 1)")
  blocks=$((size / bs))
  RANDOM=$((SEED % 32768))
  for k in $(seq 1 "$KILLS"); do
    local seed=$((SEED + k))
    rm -f "$WORK/log"
    py "$ORACLE" write "$(client_uri $p)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
    local wpid=$!
    register pid "$wpid"
    for n in $(seq 100); do [ -s "$WORK/log" ] && break; sleep 0.05; done
    # Drawn here, not inside $(...): bash reseeds RANDOM in subshells, and the replay
    # (CAIRN_SEED) must repeat the delays.
    local ms=$((100 + RANDOM % 800))
    sleep "$(printf '0.%03d' "$ms")"
    node_kill $p
    wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
    [ -s "$WORK/log" ] || fail "no write was acknowledged before the kill"
    say "kill $k of node $p: $(cat "$WORK/writer.out")"
    # The peer takes over and holds every acknowledged write.
    "$CAIRN" repl primary home --control "$(ctl $s)"
    py "$ORACLE" check "$(client_uri $s)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
      fail "after kill $k (seed $seed) node $s lacks acknowledged writes: $(cat "$WORK/check.out")"
    say "  node $s promoted: $(cat "$WORK/check.out")"
    if [ "$k" = 1 ]; then
      # The oracle can fail: an acknowledged block overwritten is found.
      local b
      b=$(head -1 "$WORK/log")
      py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(bytes(4096), int(sys.argv[2]) * 4096); h.shutdown()' \
        "$(client_uri $s)" "$b"
      py "$ORACLE" check "$(client_uri $s)" "$seed" "$bs" "$WORK/log" >/dev/null 2>&1 &&
        fail "the oracle missed an overwritten block"
    fi
    # The old primary comes back as secondary: only its activity log (4 extents of
    # 4 MiB at most) and what the new primary wrote since are resynced.
    node_up $p
    wait_peer $s Established
    local resynced
    resynced=$(status_json $s | jq -r '[.events[] | select(.kind == "resync-started")] | last | .message')
    say "  node $p back: $resynced"
    local bytes
    bytes=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' <<<"$resynced")
    [ -n "$bytes" ] || fail "no resync to node $p was reported"
    [ "$bytes" -le $(((16 << 20) + (1 << 20))) ] ||
      fail "resynced $bytes bytes: more than the activity log (4 x 4 MiB) and the new primary's writes"
    expect_eq "$(status_json $p | jq -r .disk)" UpToDate "node $p's disk after the resync"
    expect_eq "$(status_json $p | jq -r .crashed_primary)" false "crashed-primary flag cleared"
    local tmp=$p
    p=$s
    s=$tmp
  done
  # Both replicas hold the same bytes (the data area of each backing file).
  "$CAIRN" repl secondary home --control "$(ctl $p)"
  local data
  data=$(status_json 1 | jq -r .data_size)
  cmp -n "$data" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

# An idle primary (no client I/O at all) sees its peer go: killed, the data connection's
# end is seen at once; partitioned (no FIN), the ping it sends every 10 s gets no answer
# within the peer timeout. Then it reconnects by itself.
t_idle_peer_loss() {
  nodes_up
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  node_kill 2
  peer_gone_within 1 30 || fail "3 s after its peer was killed the idle primary still says: $(status_text 1)"
  say "killed peer seen by the idle primary within $GONE_AFTER s: $(peer_field 1 last_error)"
  node_up 2
  wait_peer 1 Established
  link_down
  local start=$SECONDS
  peer_gone_within 1 250 || { link_up; fail "25 s into a partition the idle primary still says: $(status_text 1)"; }
  say "partition seen by the idle primary after $((SECONDS - start)) s (ping every 10 s, peer timeout $PEER_TIMEOUT s): $(peer_field 1 last_error)"
  link_up
  wait_peer 1 Established 300
  node_down 2
  node_down 1
}

# t_secondary_sees_loss: the secondary's status tells the truth about its primary, which is
# what an operator reads before promoting it: a killed primary is seen gone within 3 s (its
# data connections end), a partitioned idle one within 25 s (the peer server's TCP
# keepalive probes after 5 s of silence; an idle primary pings every 10 s). Both times the
# pair comes back by itself.
t_secondary_sees_loss() {
  nodes_up
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  wait_peer 2 Established
  node_kill 1
  peer_gone_within 2 30 || fail "3 s after its primary was killed the secondary still says: $(status_text 2)"
  say "killed primary seen by the secondary within $GONE_AFTER s: $(peer_field 2 last_error)"
  node_up 1
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established 300
  wait_peer 2 Established
  link_down
  local start=$SECONDS
  peer_gone_within 2 250 || { link_up; fail "25 s into a partition the secondary still says: $(status_text 2)"; }
  say "partition seen by the secondary after $((SECONDS - start)) s: $(peer_field 2 last_error)"
  link_up
  wait_peer 1 Established 300
  wait_peer 2 Established 300
  node_down 2
  node_down 1
}

# --- failover under fio verify ------------------------------------------------------------
#
# t_failover_fio: the same failovers as t_failover, checked by fio's own verification
# instead of the acknowledged-writes oracle (the mechanics are crash.sh's; its header says
# more). Each kill:
#   1. fio (nbd engine, 1-2 jobs on their own connections, 4k-64k random writes with
#      crc32c headers, --do_verify=0 --verify_state_save=1, --randrepeat=0 and a randseed
#      from SEED) writes through the primary, paced to take 3 s for the volume;
#   2. 0.3-1 s after the primary's disk took fio's first write, kill -9 of the primary:
#      fio fails on the dead connection and, on its way out, writes what it issued and
#      what completed to local-failover-N-verify.state in $WORK (a fio that leaves no
#      state cannot be checked: reported, not counted, at most 2 x KILLS attempts);
#   3. the secondary is promoted, and fio runs the same job with --verify_only
#      --verify_state_load=1 through it: exit 0, no error, and exactly the bytes each job
#      saw acknowledged read back and checked;
#   4. the old primary returns as secondary, is resynced (Established, UpToDate), and the
#      roles alternate. At the end the replicas' data areas are equal.
# CAIRN_REPL_FIO_CORRUPT=1: on the first kill that can be checked, 512 bytes of zeros go
# into the first block fio wrote (--write_iolog), through the new primary, and
# --verify_only must fail there ("crc32c: verify failed ...").

# ff_fio OUT EXTRA...: fio's job FF_ARGS through FF_URI with EXTRA; JSON to OUT.json.
ff_fio() {
  local out=$1
  shift
  fio_nbd failover "$FF_URI" "$out" "${FF_ARGS[@]}" "$@"
}

# ff_details: what a failure report needs.
ff_details() {
  say "--- kill attempt $IT, seed $SEED, fio: ${FF_ARGS[*]}"
  say "--- write run (exit $WSTATUS):"
  tail -5 "$WORK/w.err" 2>/dev/null
  say "--- verify run:"
  tail -20 "$WORK/v.err" 2>/dev/null
  tail -20 "$WORK/v.stdout" 2>/dev/null
  say "--- node logs:"
  tail -5 "$WORK/n1.log" "$WORK/n2.log"
}

# ff_wait_write I: waits (30 s at most) until node I's backing file changes: fio's first
# write has reached the primary (an idle pair writes nothing to its disks).
ff_wait_write() {
  local n
  for n in $(seq 600); do
    [ "$(stat -c %y "${DISK[$1]}")" != "$FF_MTIME" ] && return 0
    kill -0 "$FIO_PID" 2>/dev/null || { ff_details; fail "fio ended before writing anything (attempt $IT)"; }
    sleep 0.05
  done
  ff_details
  fail "fio wrote nothing within 30 s (attempt $IT)"
}

# ff_unregister PID: a process seen dead leaves the registry (its number may be reused).
ff_unregister() { sed -i "/^pid $1\$/d" "$REGISTRY"; }

t_failover_fio() {
  need_tool fio
  # corrupt: 1 until a checkable kill has had its planted corruption caught.
  local corrupt=0 caught=""
  if [ "${CAIRN_REPL_FIO_CORRUPT:-0}" = 1 ]; then need_tool nbdsh; corrupt=1; fi
  nodes_up
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  wait_peer 2 Established
  local p=1 s=2 size per ms delay jobs fseed written verified vstatus off i missing extra
  local counted=0 uncheckable=0 mid=0
  size=$(nbdinfo --size "$(client_uri 1)")
  RNG=$((SEED * 7919 + 11))
  say "NOTE: seed $SEED, $KILLS kills"
  IT=0
  while [ "$counted" -lt "$KILLS" ]; do
    IT=$((IT + 1))
    [ "$IT" -le $((KILLS * 2)) ] ||
      fail "only $counted of $KILLS kills could be checked in $((IT - 1)) attempts ($uncheckable without a verify state from fio)"
    rng 701
    ms=$((300 + R))
    delay=0.$(printf %03d "$ms")
    [ "$ms" -lt 1000 ] || delay=1.000
    rng 2
    jobs=$((1 + R))
    rng 2147483647
    fseed=$R
    extra=()
    if [ "$corrupt" = 1 ]; then
      jobs=1
      extra=(--write_iolog="$WORK/w.iolog")
    fi
    per=$((size / jobs / 65536 * 65536))
    # --iodepth=1, the write run too: the volume's NBD server may answer a connection's
    # requests out of order (up to threads_per_connection of them run at once on the
    # server's pool), and the check "bytes verified = bytes written" below needs the
    # writes fio saw complete to be exactly those before the first one that failed.
    # fio's state keeps the number of writes issued and the last iodepth that completed;
    # --verify_only checks every write before that window and, inside it, stops at the
    # first write not listed as completed. With several writes in flight answered out of
    # order, a later one acknowledged while an earlier one was lost stops the check
    # short of the bytes fio counted as written. At depth 1 nothing overtakes. With two
    # jobs, two writes are still in flight at once, each on its own connection.
    FF_ARGS=(--rw=randwrite --bsrange=4k-64k --iodepth=1 --numjobs="$jobs"
      --size="$per" --offset_increment="$per" --randrepeat=0 --randseed="$fseed"
      --verify=crc32c --rate=$((size / 3 / jobs)))
    FF_URI=$(client_uri $p)
    rm -f "$WORK"/local-failover-*-verify.state "$WORK/w.iolog" "$WORK"/[wv].json
    FF_MTIME=$(stat -c %y "${DISK[$p]}")
    WSTATUS=running
    ff_fio "$WORK/w" --do_verify=0 --verify_state_save=1 "${extra[@]}" &
    FIO_PID=$!
    register pid "$FIO_PID"
    ff_wait_write $p
    sleep "$delay"
    node_kill $p
    ff_unregister "${NPID[$p]}"
    WSTATUS=0
    wait "$FIO_PID" || WSTATUS=$?
    ff_unregister "$FIO_PID"
    # The peer takes over whether or not this kill can be checked.
    "$CAIRN" repl primary home --control "$(ctl $s)"
    local checkable=1
    # fio puts messages about the dead connection into its --output file ahead of the
    # JSON: keep the JSON alone.
    if [ -s "$WORK/w.json" ] && sed -n '/^{/,$p' "$WORK/w.json" >"$WORK/w.clean.json" &&
      jq -e .jobs "$WORK/w.clean.json" >/dev/null 2>&1; then
      mv "$WORK/w.clean.json" "$WORK/w.json"
      for i in $(seq 0 $((jobs - 1))); do
        [ -s "$WORK/local-failover-$i-verify.state" ] || checkable=0
      done
      [ "$checkable" = 1 ] ||
        say "kill attempt $IT: fio left no verify state (fio exit $WSTATUS: $(tail -1 "$WORK/w.err")); not counted"
    else
      checkable=0
      say "kill attempt $IT: fio's JSON is unreadable ($(head -c 200 "$WORK/w.json" 2>/dev/null | tr '\n' ' ')); not counted"
    fi
    if [ "$checkable" = 0 ]; then
      uncheckable=$((uncheckable + 1))
    else
      counted=$((counted + 1))
      written=$(jq '[.jobs[].write.io_bytes] | add' "$WORK/w.json")
      # A kill at most 1 s after the first write, at a third of the volume a second.
      if [ "$written" -lt $((per * jobs)) ]; then
        mid=$((mid + 1))
        [ "$WSTATUS" != 0 ] || { ff_details; fail "fio wrote $written of $((per * jobs)) bytes, yet exited 0"; }
      fi
      FF_URI=$(client_uri $s)
      if [ "$corrupt" = 1 ]; then
        off=$(awk '$3 == "write" { print $4; exit }' "$WORK/w.iolog")
        [ -n "$off" ] || fail "no write in fio's iolog"
        nbdsh -u "$FF_URI" -c "h.pwrite(bytes(512), $off + 512)"
        say "corrupted 512 bytes at $((off + 512)) on node $s, inside the first block fio wrote"
      fi
      # --iodepth=1 and --verify_fatal=1: fio 3.33 stops a state-loaded verification by
      # the count of verify reads completed, not issued (deeper, it reads past the window
      # and "finds" writes the kill cut off), and at depth 1 a failed verify exits 0
      # without --verify_fatal (see crash.sh).
      vstatus=0
      ff_fio "$WORK/v" --verify_only --verify_state_load=1 --verify_state_save=0 --do_verify=1 \
        --iodepth=1 --verify_fatal=1 || vstatus=$?
      if [ "$corrupt" = 1 ]; then
        corrupt=0
        caught=" (kill 1's planted corruption caught)"
        [ "$vstatus" != 0 ] && grep -q 'verify' "$WORK/v.err" ||
          { ff_details; fail "fio --verify_only did not notice the corrupted block (exit $vstatus)"; }
        say "kill $counted of node $p after ${delay}s (randseed $fseed): wrote $written bytes; on node $s fio noticed the corruption (exit $vstatus): $(grep -m1 verify "$WORK/v.err")"
      else
        fio_verified "$WORK/w" "$WORK/v" "$vstatus" "through node $s after kill $counted" ff_details
        verified=$VERIFIED
        say "kill $counted of node $p after ${delay}s ($jobs job(s), randseed $fseed): wrote $written of $((per * jobs)) bytes (fio exit $WSTATUS); node $s promoted, verified $verified, 0 errors"
      fi
    fi
    # The old primary comes back as secondary and is resynced.
    node_up $p
    wait_peer $s Established
    expect_eq "$(status_json $p | jq -r .disk)" UpToDate "node $p's disk after the resync"
    local tmp=$p
    p=$s
    s=$tmp
  done
  "$CAIRN" repl secondary home --control "$(ctl $p)"
  local data
  data=$(status_json 1 | jq -r .data_size)
  cmp -n "$data" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
  say "NOTE: seed $SEED: $KILLS kills checked by fio --verify_only ($mid while fio was writing; $uncheckable more without a verify state from fio), 0 verify errors$caught, replicas equal"
}

t_split_brain() {
  nodes_up
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 2 Established
  local k
  for k in $(seq 1 "$SPLITS"); do
    link_down
    # Both sides write while apart: the primary, and the other node made primary.
    py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"A" * 65536, 0); h.flush(); h.shutdown()' "$(client_uri 1)"
    wait_peer 1 Off 100
    "$CAIRN" repl primary home --control "$(ctl 2)"
    py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"B" * 8192, 1 << 20); h.flush(); h.shutdown()' "$(client_uri 2)"
    "$CAIRN" repl secondary home --control "$(ctl 2)"
    link_up
    # Detected on both sides, and refused: nothing is synced either way.
    wait_peer 1 SplitBrain
    wait_peer 2 SplitBrain
    "$CAIRN" repl status home --control "$(ctl 1)" | grep -q "split brain" ||
      fail "node 1's status does not say split brain"
    say "partition $k: split brain seen by both nodes"
    # The operator discards b's changes.
    "$CAIRN" repl connect home --discard-my-data --control "$(ctl 2)"
    "$CAIRN" repl connect home --control "$(ctl 1)"
    wait_peer 1 Established
    wait_peer 2 Established
  done
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  local data
  data=$(status_json 1 | jq -r .data_size)
  cmp -n "$data" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ after the resolution"
}

t_protocol_a() {
  need_tool nbdcopy
  SIZE=32M nodes_up
  node_up 1 --protocol A
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  random_file "$WORK/data" 24M
  nbdcopy "$WORK/data" "$(client_uri 1)"
  # A clean stop drains what is still on its way to the peer.
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  expect_eq "$(status_json 1 | jq -r '.peers[0].out_of_sync_bytes')" 0 "out of sync after protocol A writes"
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
  cmp -n $((24 << 20)) "$WORK/data" "$SHM/n2.img" || fail "the peer lacks the data"
}

# Three nodes on loopback (the protocol, not the network, is under test here): the
# primary loses one peer and keeps the other; the one that stayed is still in sync
# afterwards (it took the primary's new generation), the one that left is resynced from
# the bitmap alone.
t_three_nodes() {
  need_tool nbdcopy
  local n base=$((20000 + RANDOM % 20000))
  for n in a b c; do
    "$CAIRN" repl create-md --max-peers 2 --size 64M "$SHM/3$n.img" >/dev/null
  done
  up3() { # NAME PORT PEER PEERPORT PEER PEERPORT
    "$CAIRN" repl up home --disk "$SHM/3$1.img" --node "$1" --listen "tcp:127.0.0.1:$2" \
      --peer "$3=nbd://127.0.0.1:$4/home" --peer "$5=nbd://127.0.0.1:$6/home" --peer-timeout 2 \
      --client-listen "unix:$WORK/3$1.nbd" --control "$WORK/3$1.sock" >>"$WORK/3$1.log" 2>&1 &
    register pid $!
    eval "P3$1=$!"
    for n in $(seq 100); do [ -S "$WORK/3$1.sock" ] && return 0; sleep 0.1; done
    fail "node $1 did not start: $(cat "$WORK/3$1.log")"
  }
  up3 a $base b $((base + 1)) c $((base + 2))
  up3 b $((base + 1)) a $base c $((base + 2))
  up3 c $((base + 2)) a $base b $((base + 1))
  st() { "$CAIRN" --json repl status home --control "$WORK/3$1.sock"; }
  wait3() { # NODE PEER-INDEX STATE
    for n in $(seq 200); do
      [ "$(st "$1" | jq -r ".peers[$2].replication")" = "$3" ] && return 0
      sleep 0.1
    done
    fail "node $1 peer $2 is not $3: $("$CAIRN" repl status home --control "$WORK/3$1.sock")"
  }
  "$CAIRN" repl primary home --force --control "$WORK/3a.sock"
  wait3 a 0 Established
  wait3 a 1 Established
  random_file "$WORK/s1" 8M
  nbdcopy "$WORK/s1" "nbd+unix:///home?socket=$WORK/3a.nbd"
  # shellcheck disable=SC2154
  kill -KILL "$P3c"
  random_file "$WORK/s2" 8M
  nbdcopy "$WORK/s2" "nbd+unix:///home?socket=$WORK/3a.nbd"
  expect_eq "$(st a | jq -r '.peers[0].replication')" Established "b after c left"
  up3 c $((base + 2)) a $base b $((base + 1))
  wait3 a 1 Established
  local msg
  msg=$(st a | jq -r '[.events[] | select(.kind == "resync-started")] | last | .message')
  say "c back: $msg"
  expect_contains "$msg" "bitmap resync to c" "c resynced from the bitmap"
  expect_eq "$(st a | jq -r '.peers[0].out_of_sync_bytes')" 0 "b out of sync"
  "$CAIRN" repl secondary home --control "$WORK/3a.sock"
  # b never left: the next handshake finds it in sync (no resync at all).
  "$CAIRN" repl primary home --control "$WORK/3a.sock"
  wait3 a 0 Established
  wait3 a 1 Established
  # Resyncs: the initial full ones of b and c, c's return; none after the new promotion.
  expect_eq "$(st a | jq '[.events[] | select(.kind == "resync-started")] | length')" 3 \
    "resyncs started"
  "$CAIRN" repl secondary home --control "$WORK/3a.sock"
  local data
  data=$(st a | jq -r .data_size)
  cmp -n "$data" "$SHM/3a.img" "$SHM/3b.img" || fail "a and b differ"
  cmp -n "$data" "$SHM/3a.img" "$SHM/3c.img" || fail "a and c differ"
}

# `cairn status` shows replicated resources (no `cairn serve` running), and --metrics
# serves their gauges.
t_status() {
  need_tool curl jq
  mkdir -m 700 -p "$WORK/xdg"
  "$CAIRN" repl create-md --size 16M "$SHM/st.img" >/dev/null
  XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" repl up home --disk "$SHM/st.img" --node a \
    --listen tcp:127.0.0.1:0 --peer b=nbd://127.0.0.1:9/home --metrics "unix:$WORK/m.sock" \
    >"$WORK/st.log" 2>&1 &
  register pid $!
  local n
  for n in $(seq 100); do [ -S "$WORK/xdg/cairn/repl-home.sock" ] && break; sleep 0.1; done
  XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" repl primary home --force
  local text
  text=$(XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" status)
  expect_contains "$text" "replicated resources" "cairn status names them"
  expect_contains "$text" "home on a: Primary" "cairn status shows the resource"
  expect_contains "$text" "peer b" "cairn status shows the peer"
  expect_eq "$(XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" --json status | jq -r '.replicated[0].role')" Primary "status --json"
  local m
  m=$(curl -s --unix-socket "$WORK/m.sock" http://cairn/metrics)
  expect_contains "$m" 'cairn_repl_primary{resource="home",node="a"} 1' "metrics: role"
  expect_contains "$m" 'cairn_repl_peer_connected{resource="home",node="a",peer="b"} 0' "metrics: peer"
  XDG_RUNTIME_DIR=$WORK/xdg "$CAIRN" repl down home
}

# `cairn serve`'s control API lists the resources running beside it (GET /v1/replication):
# each node's runtime directory ($XDG_RUNTIME_DIR/cairn) holds its resource's control
# socket, where a `cairn serve` started with the same runtime directory finds it. A
# resource whose process is stopped is an error entry within seconds, not a hung API.
t_api() {
  need_tool curl jq
  SIZE=16M nodes_up
  mkdir -m 700 "$WORK/run1" "$WORK/run2"
  # Each node's control socket where `cairn repl up` puts it when not told.
  ctl() { echo "$WORK/run$1/cairn/repl-home.sock"; }
  XDG_RUNTIME_DIR=$WORK/run1 node_up 1
  XDG_RUNTIME_DIR=$WORK/run2 node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  truncate -s 1M "$SHM/plain.img"
  XDG_RUNTIME_DIR=$WORK/run1 start_cairn "$SHM/plain.img" --metrics "unix:$WORK/serve-m.sock"
  local s=$WORK/run1/cairn/control.sock v code m
  expect_eq "$(jq -r .control "$CAIRN_JSON")" "$s" "cairn serve's control socket"
  expect_contains "$(curl -s --unix-socket "$s" http://cairn/v1)" "GET /v1/replication/NAME" "the routes"
  v=$(curl -s --max-time 10 --unix-socket "$s" http://cairn/v1/replication)
  expect_eq "$(jq -r '.resources | length' <<<"$v")" 1 "resources listed: $v"
  expect_eq "$(jq -r '.resources[0] | [.resource, .node, .role, .disk] | join(" ")' <<<"$v")" \
    "home a Primary UpToDate" "the resource and its role"
  expect_eq "$(jq -r '.resources[0].peers[0] | [.name, .connection, .replication] | join(" ")' <<<"$v")" \
    "b Connected Established" "its peer's state"
  # Exactly what `cairn --json repl status` prints.
  expect_eq "$(jq -S '.resources[0]' <<<"$v")" "$(status_json 1 | jq -S .)" "the status as repl status has it"
  # cairn serve's /metrics carries the resource's gauges beside its own.
  m=$(curl -s --max-time 10 --unix-socket "$WORK/serve-m.sock" http://cairn/metrics)
  expect_contains "$m" 'cairn_repl_primary{resource="home",node="a"} 1' "serve's metrics: the role"
  expect_contains "$m" 'cairn_repl_peer_in_sync{resource="home",node="a",peer="b"} 1' "serve's metrics: the peer"
  expect_contains "$m" 'cairn_export_size_bytes{export="plain"}' "serve's metrics: its own export"
  expect_eq "$(grep -c '^# TYPE cairn_repl_primary gauge$' <<<"$m")" 1 "one TYPE line"
  code=$(curl -s -o "$WORK/one.json" -w '%{http_code}' --unix-socket "$s" http://cairn/v1/replication/home)
  expect_eq "$code" 200 "GET /v1/replication/home"
  expect_eq "$(jq -r .role "$WORK/one.json")" Primary "one resource's role"
  code=$(curl -s -o "$WORK/nope.json" -w '%{http_code}' --unix-socket "$s" http://cairn/v1/replication/nope)
  expect_eq "$code" 404 "GET /v1/replication/nope"
  expect_eq "$(jq -r .error "$WORK/nope.json")" \
    'no replicated resource named "nope" runs here; resources with a control socket here: home' "404 JSON"
  # A stopped process: listed with an error, the API answers within its 2 s wait.
  kill -STOP "${NPID[1]}"
  local start=$SECONDS
  v=$(curl -s --max-time 10 --unix-socket "$s" http://cairn/v1/replication) || { kill -CONT "${NPID[1]}"; fail "no answer"; }
  kill -CONT "${NPID[1]}"
  [ $((SECONDS - start)) -le 5 ] || fail "the API took $((SECONDS - start)) s with a stopped resource"
  expect_eq "$(jq -r '.resources[0].resource' <<<"$v")" home "the stopped resource's entry: $v"
  expect_contains "$(jq -r '.resources[0].error' <<<"$v")" "resource home does not answer on $(ctl 1) within 2 s" \
    "the stopped resource's error"
  # Killed: its socket file stays, and the resource is gone from the list.
  node_kill 1
  [ -S "$(ctl 1)" ] || fail "the killed node's socket file is gone; the test needs it"
  expect_eq "$(curl -s --unix-socket "$s" http://cairn/v1/replication | jq -c .resources)" "[]" "a killed resource"
  stop_cairn
  node_down 2
}

# Replication over TLS (PSK): the data connection and the handshake go through STARTTLS;
# a node with the wrong key is refused and says so.
t_tls() {
  need_tool psktool nbdcopy
  SIZE=32M nodes_up
  psktool -u repl -p "$WORK/keys.psk" >/dev/null 2>&1
  psktool -u repl -p "$WORK/wrong.psk" >/dev/null 2>&1
  PEER_SCHEME=nbds PEER_QUERY="?tls-psk-file=$WORK/keys.psk&tls-username=repl" \
    node_up 1 --tls-psk "$WORK/keys.psk"
  PEER_SCHEME=nbds PEER_QUERY="?tls-psk-file=$WORK/keys.psk&tls-username=repl" \
    node_up 2 --tls-psk "$WORK/keys.psk"
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  random_file "$WORK/data" 8M
  nbdcopy "$WORK/data" "$(client_uri 1)"
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  cmp -n $((8 << 20)) "$WORK/data" "$SHM/n2.img" || fail "the peer lacks the data sent over TLS"
  # A plaintext client gets nothing from a TLS-required replication listener.
  ip netns exec "${NS[1]}" nbdinfo --list "nbd://${IP[2]}:7789" >"$WORK/plain.out" 2>&1 &&
    fail "the replication listener answered in plaintext: $(cat "$WORK/plain.out")"
  # The wrong key: node 1 restarted with it cannot connect and says why.
  "$CAIRN" repl down home --control "$(ctl 1)"
  wait "${NPID[1]}" 2>/dev/null || true
  PEER_SCHEME=nbds PEER_QUERY="?tls-psk-file=$WORK/wrong.psk&tls-username=repl" \
    node_up 1 --tls-psk "$WORK/wrong.psk"
  "$CAIRN" repl primary home --control "$(ctl 1)"
  local n e=""
  for n in $(seq 100); do
    e=$(status_json 1 | jq -r '.peers[0].last_error // ""')
    [ -n "$e" ] && break
    sleep 0.1
  done
  expect_contains "$e" "TLS" "the wrong key is reported as a TLS failure"
  expect_eq "$(status_json 1 | jq -r '.peers[0].connection')" Connecting "not connected with the wrong key"
}

# --split-brain discard-zero-changes: the side that changed nothing while apart takes the
# other's data, without the operator.
t_split_brain_policy() {
  nodes_up
  node_up 1 --split-brain discard-zero-changes
  node_up 2 --split-brain discard-zero-changes
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 2 Established
  link_down
  py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"A" * 65536, 0); h.flush(); h.shutdown()' "$(client_uri 1)"
  "$CAIRN" repl primary home --control "$(ctl 2)"
  "$CAIRN" repl secondary home --control "$(ctl 2)"
  link_up
  wait_peer 1 Established
  expect_contains "$(status_json 1 | jq -r '[.events[] | select(.kind == "split-brain")] | last | .message')" \
    "resolved" "the split brain was resolved by the policy"
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

# The resource from a config file (DRBD's resource-file shape): both nodes read the same
# file and pick themselves by --node.
t_config() {
  need_tool nbdcopy
  SIZE=32M nodes_up
  cat >"$WORK/repl.toml" <<EOF
[[resource]]
name = "home"
protocol = "C"
split_brain = "disconnect"
peer_timeout = 3
insecure_no_tls = true
resync_rate = 100
resync_min_rate = 16

[[resource.node]]
name = "a"
address = "${IP[1]}:7789"
disk = "$SHM/n1.img"

[[resource.node]]
name = "b"
address = "${IP[2]}:7789"
disk = "$SHM/n2.img"
EOF
  local i
  for i in 1 2; do
    ip netns exec "${NS[$i]}" "$CAIRN" repl up home --config "$WORK/repl.toml" --node "${NAME[$i]}" \
      --client-listen "unix:$WORK/n$i.nbd" --control "$(ctl "$i")" >>"$WORK/n$i.log" 2>&1 &
    NPID[$i]=$!
    register pid "${NPID[$i]}"
  done
  for i in $(seq 100); do [ -S "$(ctl 1)" ] && [ -S "$(ctl 2)" ] && break; sleep 0.1; done
  expect_eq "$(status_json 1 | jq -r '.resync_limits | "\(.min_bytes_per_sec) \(.max_bytes_per_sec)"')" \
    "$((16 << 20)) $((100 << 20))" "the rate limits from the file"
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  random_file "$WORK/data" 4M
  nbdcopy "$WORK/data" "$(client_uri 1)"
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  cmp -n $((4 << 20)) "$WORK/data" "$SHM/n2.img" || fail "b lacks the data"
  local out
  out=$("$CAIRN" repl up nope --config "$WORK/repl.toml" --node a 2>&1) && fail "an unknown resource started"
  expect_contains "$out" 'no resource "nope"' "an unknown resource is named"
  out=$("$CAIRN" repl up home --config "$WORK/repl.toml" --node zz 2>&1) && fail "an unknown node started"
  expect_contains "$out" "has no node" "an unknown node is named"
}

# Any cairn stack can be the backing disk: here each node's is an md RAID1 of two files,
# given as the control API's JSON spec.
t_stack() {
  need_tool nbdcopy
  nodes_up
  local i
  for i in 1 2; do
    "$CAIRN" md create --level 1 --raid-devices 2 --size 32M --name "m$i" \
      "$SHM/m$i-0.img" "$SHM/m$i-1.img" >/dev/null
    DISK[$i]="{\"md\": [\"$SHM/m$i-0.img\", \"$SHM/m$i-1.img\"]}"
    "$CAIRN" repl create-md "${DISK[$i]}" >/dev/null
  done
  node_up 1
  node_up 2
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  random_file "$WORK/data" 4M
  nbdcopy "$WORK/data" "$(client_uri 1)"
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  "$CAIRN" repl primary home --control "$(ctl 2)"
  nbdcopy "$(client_uri 2)" "$WORK/back"
  cmp -n $((4 << 20)) "$WORK/back" "$WORK/data" || fail "node 2's RAID1 does not hold what node 1 wrote"
  "$CAIRN" repl secondary home --control "$(ctl 2)"
  for i in 1 2; do "$CAIRN" repl down home --control "$(ctl "$i")" >/dev/null; done
  sleep 1
  # Both arrays were stopped cleanly: mdadm says so.
  need_tool mdadm
  for i in 1 2; do
    mdadm --examine "$SHM/m$i-0.img" | grep -q "State : clean" || fail "array $i not clean: $(mdadm --examine "$SHM/m$i-0.img")"
  done
  DISK=()
}

# wait_json I FILTER VALUE [TENTHS]: node I's status --json gives VALUE for the jq FILTER.
wait_json() {
  local n v
  for n in $(seq "${4:-100}"); do
    v=$(status_json "$1" | jq -r "$2")
    [ "$v" = "$3" ] && return 0
    sleep 0.1
  done
  fail "node $1: $2 is $v, not $3: $(status_text "$1")"
}

# app_writer I: random 4 KiB writes to node I's volume until killed; sets WPID.
app_writer() {
  py -c 'import nbd, os, random, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
blocks = h.get_size() // 4096
while True: h.pwrite(os.urandom(4096), random.randrange(blocks) * 4096)' "$(client_uri "$1")" \
    >"$WORK/writer.out" 2>&1 &
  WPID=$!
  register pid "$WPID"
}
stop_writer() {
  stop_tree "$WPID"
  wait "$WPID" 2>/dev/null || true
}

# The rate controller: resync and verify run at --resync-rate (3 MiB/s here) while the
# application is idle and at --resync-min-rate (1 MiB/s) while it writes. A full sync
# under a writer reports itself throttled at the minimum (status --json, the text, the
# metrics); the writer stopped, unthrottled at the maximum; it completes and the replicas
# are equal. The same for an online verify. Only states are checked, never a speed.
t_rate() {
  need_tool curl
  SIZE=32M nodes_up
  node_up 1 --resync-rate 3 --resync-min-rate 1 --metrics "unix:$WORK/m1.sock"
  node_up 2
  local min=$((1 << 20)) max=$((3 << 20)) m r
  expect_eq "$(status_json 1 | jq -r '.resync_limits | "\(.min_bytes_per_sec) \(.max_bytes_per_sec)"')" \
    "$min $max" "the rate limits in status"
  metrics() { curl -s --unix-socket "$WORK/m1.sock" http://cairn/metrics; }
  local g='{resource="home",node="a",peer="b"}'
  repl 1 primary --force >/dev/null
  app_writer 1
  # 1. The full sync, under the writer: throttled, at the minimum.
  wait_json 1 '.peers[0].resync.throttled' true
  r=$(status_json 1 | jq -c '.peers[0].resync')
  say "resync under a writer: $r"
  expect_eq "$(jq -r .target_bytes_per_sec <<<"$r")" $min "the throttled resync's target"
  expect_contains "$(status_text 1)" "(held at 1 MiB/s: application I/O)" "status text of the throttled resync"
  m=$(metrics)
  expect_contains "$m" "cairn_repl_peer_resync_throttled$g 1" "metrics: the resync throttled"
  expect_contains "$m" "cairn_repl_peer_resync_target_bytes_per_second$g $min" "metrics: the throttled target"
  # The writer stops: the maximum, while the resync still runs (32 MiB at 3 MiB/s).
  stop_writer
  wait_json 1 '.peers[0].resync.throttled' false
  r=$(status_json 1 | jq -c '.peers[0].resync')
  say "resync, the writer stopped: $r"
  expect_eq "$(jq -r .target_bytes_per_sec <<<"$r")" $max "the idle resync's target"
  expect_contains "$(status_text 1)" "(rate limit 3 MiB/s)" "status text of the idle resync"
  m=$(metrics)
  expect_contains "$m" "cairn_repl_peer_resync_throttled$g 0" "metrics: the resync not throttled"
  expect_contains "$m" "cairn_repl_peer_resync_target_bytes_per_second$g $max" "metrics: the idle target"
  wait_peer 1 Established 600
  say "  $(last_event 1 resync-done)"
  wait_peer 2 Established
  # 2. An online verify, paced the same way.
  app_writer 1
  repl 1 verify >/dev/null
  wait_json 1 '.peers[0].verify | "\(.running) \(.throttled)"' "true true"
  expect_eq "$(status_json 1 | jq -r '.peers[0].verify.target_bytes_per_sec')" $min "the throttled verify's target"
  expect_contains "$(metrics)" "cairn_repl_peer_verify_throttled$g 1" "metrics: the verify throttled"
  stop_writer
  wait_json 1 '.peers[0].verify | "\(.running) \(.throttled)"' "true false"
  expect_eq "$(status_json 1 | jq -r '.peers[0].verify.target_bytes_per_sec')" $max "the idle verify's target"
  wait_json 1 '.peers[0].verify.running' false 600
  r=$(status_json 1 | jq -c '.peers[0].verify')
  say "verify: $r"
  expect_eq "$(jq -r '"\(.out_of_sync_blocks) \(.error)"' <<<"$r")" "0 null" "the verify's result"
  # The replicas are equal.
  repl 1 secondary >/dev/null
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

t_refusals() {
  need_tool jq
  truncate -s 4K "$SHM/tiny.img"
  local out
  out=$("$CAIRN" repl create-md "$SHM/tiny.img" 2>&1) && fail "create-md on 4 KiB succeeded"
  expect_contains "$out" "room" "too small a disk is named"
  truncate -s 16M "$SHM/plain.img"
  out=$("$CAIRN" repl up home --disk "$SHM/plain.img" --node a --peer b=nbd://127.0.0.1:1/home \
    --control "$WORK/x.sock" --client-listen "unix:$WORK/x.nbd" --listen tcp:127.0.0.1:0 2>&1) &&
    fail "up on a disk without metadata succeeded"
  expect_contains "$out" "create-md" "the missing metadata is named with its fix"
  "$CAIRN" repl create-md "$SHM/plain.img" >/dev/null
  out=$("$CAIRN" repl create-md "$SHM/plain.img" 2>&1) && fail "create-md twice succeeded"
  expect_contains "$out" "already" "existing metadata is not overwritten"
  "$CAIRN" repl create-md --force --resource work "$SHM/plain.img" >/dev/null
  out=$("$CAIRN" repl up home --disk "$SHM/plain.img" --node a --peer b=nbd://127.0.0.1:1/home \
    --control "$WORK/x.sock" --client-listen "unix:$WORK/x.nbd" --listen tcp:127.0.0.1:0 2>&1) &&
    fail "up of another resource's disk succeeded"
  expect_contains "$out" "another replicated resource" "another resource's disk is refused"
  out=$("$CAIRN" repl status home --control "$WORK/none.sock" 2>&1) && fail "status of nothing succeeded"
  expect_contains "$out" "cairn repl up" "status says what is not running"
}

# etcd in a third namespace, reached by each node over its own veth pair; the A-B link
# can then be cut while both still reach etcd.
etcd_up() {
  need_tool etcd curl
  E=${TAG}e
  ip netns add "$E" || fail "ip netns add $E"
  register netns "$E"
  ip -n "$E" link set lo up
  local i
  for i in 1 2; do
    ip link add "${TAG}e$i" netns "${NS[$i]}" type veth peer name "${TAG}f$i" netns "$E" ||
      fail "veth to etcd"
    ip -n "${NS[$i]}" addr add "10.232.$((i + 1)).1/24" dev "${TAG}e$i"
    ip -n "$E" addr add "10.232.$((i + 1)).2/24" dev "${TAG}f$i"
    ip -n "${NS[$i]}" link set "${TAG}e$i" up
    ip -n "$E" link set "${TAG}f$i" up
  done
  ip netns exec "$E" etcd --name t --data-dir "$WORK/etcd" \
    --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls http://10.232.2.2:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster t=http://127.0.0.1:2380 >"$WORK/etcd.log" 2>&1 &
  register pid $!
  for i in $(seq 100); do
    ip netns exec "${NS[1]}" curl -s -m 1 http://10.232.2.2:2379/health | grep -q true && return 0
    sleep 0.1
  done
  fail "etcd did not start: $(tail -5 "$WORK/etcd.log")"
}
etcd_args() { echo --etcd "http://10.232.$(($1 + 1)).2:2379" --etcd-ttl 2 --auto-failover; }

data_sum() { nbdcopy "$(client_uri "$1")" - | md5sum | cut -d' ' -f1; }

t_etcd_failover() {
  SIZE=32M nodes_up
  etcd_up
  need_tool nbdcopy
  # shellcheck disable=SC2046
  node_up 1 $(etcd_args 1)
  # shellcheck disable=SC2046
  node_up 2 $(etcd_args 2)
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  # A second primary is refused while the lease is held.
  local out
  out=$("$CAIRN" repl primary home --control "$(ctl 2)" 2>&1) && fail "two primaries under etcd"
  expect_contains "$out" "primary elsewhere" "the lease holder is named"
  local bs=4096 blocks seed=$((SEED + 100))
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  # 1. The primary dies: the secondary takes over by itself once the lease runs out.
  rm -f "$WORK/log"
  py "$ORACLE" write "$(client_uri 1)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
  local wpid=$!
  register pid "$wpid"
  for n in $(seq 100); do [ -s "$WORK/log" ] && break; sleep 0.05; done
  sleep 0.3
  node_kill 1
  wait "$wpid" || true
  wait_role 2 Primary 150
  say "node 2 took over by itself: $(status_json 2 | jq -r '[.events[] | select(.kind == "failover")] | last | .message')"
  py "$ORACLE" check "$(client_uri 2)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
    fail "after the failover node 2 lacks acknowledged writes: $(cat "$WORK/check.out")"
  say "  $(cat "$WORK/check.out")"
  # shellcheck disable=SC2046
  node_up 1 $(etcd_args 1)
  wait_peer 2 Established
  # 2. The primary is paused past its lease: the other node takes over, and the paused
  # one, resumed, writes nothing (frozen; the new primary's epoch fences it anyway), reads
  # in etcd that node 1 holds the lease and steps down by itself (--auto-failover).
  py -c 'import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
i = 0
while True:
    h.pwrite(bytes([i % 251]) * 4096, (i % 64) * 4096); i += 1' "$(client_uri 2)" >/dev/null 2>&1 &
  local zpid=$!
  register pid "$zpid"
  sleep 0.5
  kill -STOP "${NPID[2]}"
  wait_role 1 Primary 150
  local before after
  before=$(data_sum 1)
  kill -CONT "${NPID[2]}"
  sleep 2
  after=$(data_sum 1)
  expect_eq "$after" "$before" "node 1's data after the paused primary woke"
  wait_role 2 Secondary 100
  expect_contains "$(last_event 2 demoted)" "by itself (automatic failover): a holds the primary lease" \
    "the old primary's demoted event"
  say "  node 2 resumed: $(last_event 2 demoted)"
  # Its writer's frozen write failed and its connection ended: it does not hang.
  for n in $(seq 50); do kill -0 "$zpid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$zpid" 2>/dev/null && fail "the paused primary's writer still waits after it stepped down"
  wait_peer 1 Established
  # 3. Partition: the primary goes on alone and marks the other outdated in etcd; when
  # the primary then dies, the outdated node does not take over.
  link_down
  py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"P" * 65536, 0); h.flush(); h.shutdown()' "$(client_uri 1)"
  expect_contains "$(status_json 1 | jq -r '[.events[].kind] | join(" ")')" outdated "node 2 marked outdated"
  node_kill 1
  sleep 6
  expect_eq "$(status_json 2 | jq -r .role)" Secondary "the outdated node's role after the primary died"
  out=$("$CAIRN" repl primary home --control "$(ctl 2)" 2>&1) && fail "an outdated node became primary"
  expect_contains "$out" "outdated" "the refusal names the outdated mark"
  link_up
  # shellcheck disable=SC2046
  node_up 1 $(etcd_args 1)
  "$CAIRN" repl primary home --control "$(ctl 1)"
  wait_peer 1 Established
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

# External metadata (DRBD's meta-disk): each node's disk file is all data, the metadata
# on a file of its own that create-md makes at the size it needs.
t_external_meta() {
  need_tool nbdcopy
  EXTERNAL_META=1 SIZE=32M nodes_up
  local i out
  for i in 1 2; do
    # One page of bitmap, one of activity log, the superblock.
    expect_eq "$(stat -c %s "$SHM/n$i.meta")" 12288 "node $i's metadata file size"
  done
  EXTERNAL_META=1 node_up 1
  EXTERNAL_META=1 node_up 2
  expect_eq "$(status_json 1 | jq -r .data_size)" $((32 << 20)) "the data size (the whole disk)"
  "$CAIRN" repl primary home --force --control "$(ctl 1)"
  wait_peer 1 Established
  wait_peer 2 Established
  random_file "$WORK/data" 32M
  nbdcopy "$WORK/data" "$(client_uri 1)"
  "$CAIRN" repl secondary home --control "$(ctl 1)"
  for i in $(seq 100); do
    [ "$(status_json 1 | jq -r '.peers[0].out_of_sync_bytes')" = 0 ] && break
    sleep 0.1
  done
  expect_eq "$(status_json 1 | jq -r '.peers[0].out_of_sync_bytes')" 0 "out of sync"
  cmp "$SHM/n1.img" "$SHM/n2.img" || fail "the data files differ"
  cmp "$WORK/data" "$SHM/n2.img" || fail "the peer's data file is not what was written"
  # Stopped cleanly, both come back from their metadata files: the same generation, so
  # node b becomes primary without --force and nothing is resynced; the fencing epoch
  # goes on from the one recorded.
  local e1
  e1=$(status_json 1 | jq -r .epoch)
  for i in 1 2; do
    "$CAIRN" repl down home --control "$(ctl "$i")"
    wait "${NPID[$i]}" || fail "node $i did not stop cleanly: $(tail -5 "$WORK/n$i.log")"
  done
  EXTERNAL_META=1 node_up 1
  EXTERNAL_META=1 node_up 2
  expect_eq "$(status_json 2 | jq -r .disk)" Consistent "node 2's disk after the restart"
  "$CAIRN" repl primary home --control "$(ctl 2)"
  wait_peer 2 Established
  wait_peer 1 Established
  expect_eq "$(status_json 1 | jq -r .disk)" UpToDate "node 1's disk, connected again"
  expect_eq "$(status_json 2 | jq '[.events[] | select(.kind == "resync-started")] | length')" 0 \
    "resyncs after the restart"
  local e2
  e2=$(status_json 2 | jq -r .epoch)
  [ "$e2" -gt "$e1" ] || fail "fencing epoch $e2 after the restart, not above the $e1 before it"
  "$CAIRN" repl secondary home --control "$(ctl 2)"
  for i in 1 2; do
    "$CAIRN" repl down home --control "$(ctl "$i")"
    wait "${NPID[$i]}" || true
  done
  cmp "$SHM/n1.img" "$SHM/n2.img" || fail "the data files differ after the restart"
  # Refusals: the metadata file as a plain disk, a data disk that shrank, no metadata.
  local up=("$CAIRN" repl up home --node a --peer b=nbd://127.0.0.1:1/home --control "$WORK/x.sock"
    --client-listen "unix:$WORK/x.nbd" --listen tcp:127.0.0.1:0)
  out=$("${up[@]}" --disk "$SHM/n1.meta" 2>&1) && fail "up on a metadata file as its disk succeeded"
  expect_contains "$out" "--meta-disk" "a metadata file given as --disk is named"
  cp "$SHM/n1.img" "$SHM/shrunk.img"
  truncate -s 31M "$SHM/shrunk.img"
  out=$("${up[@]}" --disk "$SHM/shrunk.img" --meta-disk "$SHM/n1.meta" 2>&1) &&
    fail "up on a shrunk data disk succeeded"
  expect_contains "$out" "the data device has $((31 << 20)) bytes, but its external metadata records $((32 << 20))" \
    "the shrunk data disk is refused with its sizes"
  truncate -s 1M "$SHM/empty.meta"
  out=$("${up[@]}" --disk "$SHM/n1.img" --meta-disk "$SHM/empty.meta" 2>&1) &&
    fail "up on an empty metadata file succeeded"
  expect_contains "$out" "create-md DISK --meta-disk META" "the missing metadata is named with its fix"
  truncate -s 4K "$SHM/small.meta"
  out=$("$CAIRN" repl create-md "$SHM/n1.img" --meta-disk "$SHM/small.meta" 2>&1) &&
    fail "create-md on too small a metadata file succeeded"
  expect_contains "$out" "at least 12288 bytes" "too small a metadata file is named with the size it needs"
}

# write_while_the_disk_fails SEED BLOCKS BS FAIL: acked_writes.py writes every block of
# node 1's volume (log in $WORK/log); after 500 acknowledgements FAIL is created, which
# makes node 1's error-filter disk fail; every write must still be acknowledged.
write_while_the_disk_fails() {
  local seed=$1 blocks=$2 bs=$3 fail=$4 wpid before=0 n
  rm -f "$WORK/log"
  py "$ORACLE" write "$(client_uri 1)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
  wpid=$!
  register pid "$wpid"
  for n in $(seq 200); do
    [ -f "$WORK/log" ] && before=$(wc -l <"$WORK/log")
    [ "$before" -ge 500 ] && break
    sleep 0.05
  done
  touch "$fail"
  [ "$before" -lt $((blocks / 2)) ] || fail "the writer was almost done before the disk failed ($before of $blocks)"
  wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
  expect_contains "$(cat "$WORK/writer.out")" "all $blocks writes acknowledged" \
    "every write acknowledged although the primary's disk failed"
}

# The primary's disk fails (nbdkit's error filter, EIO on every request while a file
# exists) under a writer: the primary detaches it and goes on diskless through its peer,
# so every write is acknowledged and reads back; after a failover a new disk is attached
# on the now secondary node (`attach --disk`) and resynced in full.
t_detach() {
  need_tool nbdkit
  nodes_up
  local fail=$WORK/d1.fail n
  error_disk 1 d1 error=EIO error-rate=100% error-file="$fail"
  node_up 1
  node_up 2
  repl 1 primary --force
  wait_peer 1 Established
  wait_peer 2 Established
  local bs=4096 blocks seed=$((SEED + 100))
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  write_while_the_disk_fails "$seed" "$blocks" "$bs" "$fail"
  expect_eq "$(status_json 1 | jq -r .disk)" Diskless "the primary's disk state"
  expect_contains "$(last_event 1 disk-failed)" "the local disk failed" "the disk-failed event"
  expect_contains "$(last_event 1 detached)" "diskless primary" "the detached event"
  expect_contains "$(status_text 1)" "disk Diskless" "the status line"
  # Reads go to the peer: every acknowledged write reads back from the diskless primary.
  py "$ORACLE" check "$(client_uri 1)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
    fail "the diskless primary reads wrong data: $(cat "$WORK/check.out")"
  local out
  # Failover, by hand: the peer holds every acknowledged write.
  repl 1 secondary
  repl 2 primary
  py "$ORACLE" check "$(client_uri 2)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
    fail "the new primary lacks acknowledged writes: $(cat "$WORK/check.out")"
  out=$(repl 1 primary 2>&1) && fail "a diskless node became primary"
  expect_contains "$out" "diskless" "promoting a diskless node is refused"
  # A new disk in its place: a full resync from the new primary.
  "$CAIRN" repl create-md --size "${SIZE:-64M}" "$SHM/n1new.img" >/dev/null
  "$CAIRN" repl create-md --size 32M "$SHM/n1small.img" >/dev/null
  out=$(repl 1 attach --disk "$SHM/n1small.img" 2>&1) && fail "attach of a smaller disk succeeded"
  expect_contains "$out" "data size" "a disk of another size is refused with the reason"
  repl 1 attach --disk "$SHM/n1new.img"
  py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"C" * 4096, 0); h.flush(); h.shutdown()' "$(client_uri 2)"
  wait_peer 2 Established
  expect_contains "$(last_event 2 resync-started)" "full resync" "the attached disk is resynced in full"
  for n in $(seq 100); do [ "$(status_json 1 | jq -r .disk)" = UpToDate ] && break; sleep 0.1; done
  expect_eq "$(status_json 1 | jq -r .disk)" UpToDate "the attached disk after the resync"
  repl 2 secondary
  local data
  data=$(status_json 1 | jq -r .data_size)
  cmp -n "$data" "$SHM/n1new.img" "$SHM/n2.img" || fail "the replicas differ after the attach"
}

# The primary's disk fails under a writer (as in `detach`), is healed, and is attached
# again on the primary itself while a second writer goes on: the primary fills it from
# its peer while it serves, the peer shown as the source of a full resync. Once
# UpToDate, every acknowledged write of both writers reads back from the primary, and
# still does after the peer is killed: from the primary's own disk.
t_primary_attach() {
  need_tool nbdkit
  nodes_up
  local fail=$WORK/p1.fail n
  error_disk 1 p1 error=EIO error-rate=100% error-file="$fail"
  # Under the writer the pull keeps to 4 MiB/s: the writer finishes first.
  node_up 1 --resync-rate 64 --resync-min-rate 4
  node_up 2
  repl 1 primary --force
  wait_peer 1 Established
  wait_peer 2 Established
  local bs=4096 blocks seed=$((SEED + 200)) seed2=$((SEED + 201))
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  local half=$((blocks / 2))
  rm -f "$WORK/log2"
  write_while_the_disk_fails "$seed" "$blocks" "$bs" "$fail"
  local wpid
  expect_eq "$(status_json 1 | jq -r .disk)" Diskless "the primary's disk state after the failure"
  # Healed, and attached on the primary while a second writer rewrites the first half.
  rm -f "$fail"
  py "$ORACLE" write "$(client_uri 1)" "$seed2" "$half" "$bs" 32 "$WORK/log2" >"$WORK/writer2.out" 2>&1 &
  wpid=$!
  register pid "$wpid"
  for n in $(seq 200); do [ -s "$WORK/log2" ] && break; sleep 0.05; done
  local out
  out=$(repl 1 attach 2>&1) || fail "attach on the diskless primary failed: $out"
  expect_contains "$out" "filled from" "attach on a primary says where the disk is filled from"
  local st
  st=$(status_json 1)
  expect_eq "$(jq -r .disk <<<"$st")" Inconsistent "the primary's disk while it is filled"
  expect_eq "$(jq -r .role <<<"$st")" Primary "the role while the disk is filled"
  expect_eq "$(jq -r '.peers[0].replication' <<<"$st")" SyncTarget "the peer's state seen from the filling primary"
  expect_eq "$(jq -r '.peers[0].resync.full' <<<"$st")" true "the fill is a full resync"
  expect_contains "$(status_text 1)" "full resync [" "the progress bar while the disk is filled"
  expect_contains "$(last_event 1 resync-started)" "full resync from" "the resync-started event"
  wait "$wpid" || fail "the second writer failed: $(cat "$WORK/writer2.out")"
  expect_contains "$(cat "$WORK/writer2.out")" "all $half writes acknowledged" \
    "every write during the fill acknowledged"
  for n in $(seq 600); do [ "$(status_json 1 | jq -r .disk)" = UpToDate ] && break; sleep 0.1; done
  expect_eq "$(status_json 1 | jq -r .disk)" UpToDate "the primary's disk after the fill: $(status_text 1)"
  expect_contains "$(last_event 1 resync-done)" "resync from" "the resync-done event"
  expect_eq "$(status_json 1 | jq -r '.peers[0].replication')" Established "the peer after the fill"
  # The first writer's blocks the second did not rewrite, and all of the second's.
  awk -v h="$half" '$1 >= h' "$WORK/log" >"$WORK/log1b"
  local uri
  uri=$(client_uri 1)
  py "$ORACLE" check "$uri" "$seed" "$bs" "$WORK/log1b" >"$WORK/check.out" 2>&1 ||
    fail "the filled primary lacks the first writer's writes: $(cat "$WORK/check.out")"
  py "$ORACLE" check "$uri" "$seed2" "$bs" "$WORK/log2" >"$WORK/check.out" 2>&1 ||
    fail "the filled primary lacks writes made during the fill: $(cat "$WORK/check.out")"
  # The peer goes away: every byte is served from the primary's own disk.
  node_kill 2
  py "$ORACLE" check "$uri" "$seed" "$bs" "$WORK/log1b" >"$WORK/check.out" 2>&1 ||
    fail "without its peer the primary lacks the first writer's writes: $(cat "$WORK/check.out")"
  py "$ORACLE" check "$uri" "$seed2" "$bs" "$WORK/log2" >"$WORK/check.out" 2>&1 ||
    fail "without its peer the primary lacks writes made during the fill: $(cat "$WORK/check.out")"
  say "after the fill, alone: $(cat "$WORK/check.out")"
  local data
  data=$(status_json 1 | jq -r .data_size)
  cmp -n "$data" "$SHM/n1.img" "$SHM/n2.img" || fail "the filled disk differs from the peer's"
  repl 1 secondary
}

# The primary's disk fails every read (nbdkit's error filter, while a file exists) during
# its initial full resync: the resync's read detaches it, as an application's would; the
# resync stops and the peer, not at fault, stays connected and Inconsistent. With
# `--on-no-data suspend-io` a client's write is then held (nothing holds the data), shown
# in status, and fails when the node is made secondary.
t_detach_resync() {
  need_tool nbdkit
  nodes_up
  local fail=$WORK/dr1.fail n
  rm -f "$fail"
  error_disk 1 dr1 error-pread=EIO error-pread-rate=100% error-pread-file="$fail"
  node_up 1 --on-no-data suspend-io
  node_up 2
  touch "$fail"
  repl 1 primary --force
  for n in $(seq 200); do
    [ -n "$(last_event 1 resync-stopped)" ] && break
    sleep 0.1
  done
  expect_eq "$(status_json 1 | jq -r .disk)" Diskless "the primary's disk state"
  expect_contains "$(last_event 1 disk-failed)" "the local disk failed" "the disk-failed event"
  expect_contains "$(last_event 1 resync-stopped)" "stays connected but Inconsistent" \
    "the resync-stopped event"
  expect_eq "$(status_json 1 | jq '[.events[] | select(.kind == "disconnect")] | length')" 0 \
    "peers dropped"
  expect_eq "$(peer_field 1 connection)/$(peer_field 1 replication)" Connected/Off \
    "the resync target's state on the primary"
  expect_contains "$(status_text 1)" "last error: resync to b stopped" "the peer's last error"
  expect_eq "$(status_json 2 | jq -r .disk)" Inconsistent "the resync target's disk"
  # No replica holds the data: a write is held, not answered.
  py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"H" * 4096, 0); h.flush(); h.shutdown()' \
    "$(client_uri 1)" >"$WORK/held.out" 2>&1 &
  local wpid=$!
  register pid "$wpid"
  for n in $(seq 100); do
    [ "$(status_json 1 | jq -r '.io_suspended // ""')" != "" ] && break
    sleep 0.1
  done
  expect_contains "$(status_text 1)" "I/O suspended: this node is diskless" "the status line"
  expect_contains "$(last_event 1 io-suspended)" "no up-to-date peer" "the io-suspended event"
  sleep 1
  kill -0 "$wpid" 2>/dev/null || fail "the held write was answered: $(cat "$WORK/held.out")"
  repl 1 secondary
  if wait "$wpid"; then fail "the held write succeeded"; fi
  expect_contains "$(last_event 1 io-failed)" "no longer primary" "the io-failed event"
}

# `--on-no-data suspend-io` with a peer that comes back: a diskless primary (detached by
# hand) whose peer is disconnected holds a client's write; connected again (nothing to
# copy), the peer takes it and the client gets its answer.
t_no_data_resume() {
  nodes_up
  node_up 1 --on-no-data suspend-io
  node_up 2
  repl 1 primary --force
  wait_peer 1 Established
  wait_peer 2 Established
  repl 1 detach
  expect_eq "$(status_json 1 | jq -r .disk)" Diskless "the primary's disk after detach"
  repl 1 disconnect
  py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1]); h.pwrite(b"R" * 4096, 8192); h.flush(); h.shutdown()' \
    "$(client_uri 1)" >"$WORK/held.out" 2>&1 &
  local wpid=$! n
  register pid "$wpid"
  for n in $(seq 100); do
    [ "$(status_json 1 | jq -r '.io_suspended // ""')" != "" ] && break
    sleep 0.1
  done
  expect_contains "$(status_text 1)" "I/O suspended" "the status line"
  sleep 1
  kill -0 "$wpid" 2>/dev/null || fail "the held write was answered: $(cat "$WORK/held.out")"
  repl 1 connect
  wait_peer 1 Established
  wait "$wpid" || fail "the held write failed: $(cat "$WORK/held.out")"
  expect_contains "$(last_event 1 io-resumed)" "go on" "the io-resumed event"
  expect_eq "$(status_json 1 | jq -r '.io_suspended // "none"')" none "io_suspended after the peer came back"
  expect_eq "$(dd if="$SHM/n2.img" bs=4096 skip=2 count=1 status=none | tr -d R | wc -c)" 0 \
    "the held write on the peer's disk"
  repl 1 secondary
}

run_test idle_peer_loss t_idle_peer_loss
run_test secondary_sees_loss t_secondary_sees_loss
run_test refusals t_refusals
run_test status t_status
run_test api t_api
run_test rate t_rate
run_test failover t_failover
run_test failover_fio t_failover_fio
run_test split_brain t_split_brain
run_test protocol_a t_protocol_a
run_test three_nodes t_three_nodes
run_test tls t_tls
run_test split_brain_policy t_split_brain_policy
run_test config t_config
run_test stack t_stack
run_test etcd_failover t_etcd_failover
run_test external_meta t_external_meta
run_test detach t_detach
run_test primary_attach t_primary_attach
run_test detach_resync t_detach_resync
run_test no_data_resume t_no_data_resume
finish
