#!/usr/bin/env bash
# Quorum through a real three-member etcd. Nodes a and b and a witness c each run an etcd
# member in a network namespace of their own, the three on one switch (repl_lib.sh,
# SWITCH=1); `cairn repl up --etcd --auto-failover` runs on a and b, each talking to the
# member beside it first and the two others after it (node a as one comma-separated
# --etcd, node b as --etcd repeated). Cutting a namespace's link cuts its node and its
# member together.
#
# partition: the primary's namespace is cut while a writer logs every acknowledged write
# with its time (in some rounds while its member leads etcd, in others while the witness
# does). Its member loses quorum, its lease runs out, and it acknowledges nothing after
# that; the other node, with the majority, takes the lease through etcd, is promoted by
# itself, holds every acknowledged write, and marks the cut node outdated before its own
# first write. Healed, the old primary reads in etcd that the new one holds the lease and
# steps down by itself (a `demoted` event; its frozen writes fail, its client does not
# hang), then is resynced from the new primary's and its own bitmaps and verifies
# equal; nobody runs `cairn repl secondary`. Roles alternate: node a freezes I/O when its lease is lost, node b refuses it
# (--on-lease-loss freeze / error). At the end the data areas are equal.
# no_takeover: the same cut with nobody to take over; the other node promoted by hand
# after the heal resyncs the blocks the cut one wrote without acknowledging them.
# witness: c is cut alone, while it follows and while it leads: no role changes (a
# majority is a quorum, not all members), the primary keeps its lease and serves. Then
# the primary's own member stops: the primary goes on to the next member of its list,
# its lease never lapses and writes go on.
#
# CAIRN_REPL_ETCD_ROUNDS (default 2) partitions; CAIRN_REPL_ETCD_ROUNDS=10 is the long
# mode. CAIRN_SEED replays a run's random choices (cut moments, writer contents).
. "$(dirname "$0")/lib.sh"

ROUNDS=${CAIRN_REPL_ETCD_ROUNDS:-2}
SEED=${CAIRN_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
say "repl_etcd: seed $SEED, $ROUNDS partitions (replay: CAIRN_SEED=$SEED)"
ORACLE=$INTEROP_DIR/acked_writes.py
TAG=re$$
IP=([1]=10.233.1.1 [2]=10.233.1.2 [3]=10.233.1.3)
# The primary lease's TTL (seconds). A primary stops I/O at its last keepalive's send time
# + TTL - TTL/10 (cairn_cluster::lease), so nothing is acknowledged later than
# TTL * 0.9 after its link was cut.
TTL=2
ON_LOSS=([1]=freeze [2]=error)

. "$INTEROP_DIR/repl_lib.sh"

# etcd_args I: node I's --etcd, every member with its own first: node 1 as a
# comma-separated list, node 2 as the flag repeated (the two ways the CLI takes).
etcd_args() {
  if [ "$1" = 1 ]; then
    echo "--etcd $(etcd_urls 1)"
  else
    etcd_urls "$1" | tr ',' '\n' | sed 's/^/--etcd /' | tr '\n' ' '
  fi
}

# etcd_node_up I: node I with every etcd member, its own first, automatic failover.
etcd_node_up() {
  # shellcheck disable=SC2046
  node_up "$1" $(etcd_args "$1") --etcd-ttl "$TTL" --auto-failover \
    --on-lease-loss "${ON_LOSS[$1]}"
}

events() { status_json "$1" | jq -r '[.events[].kind] | join(" ")'; }
now() { date +%s.%N; }

# wait_event I KIND [TENTHS]: node I has an event of KIND.
wait_event() {
  local n
  for n in $(seq "${3:-100}"); do
    case " $(events "$1") " in *" $2 "*) return 0 ;; esac
    sleep 0.1
  done
  fail "node $1 has no $2 event: $(status_text "$1")"
}

# ack_times LOG FROM: "COUNT LAST" of the stamped acknowledgements in LOG, LAST in
# seconds after FROM (negative: before).
ack_times() {
  py - "$1" "$2" <<'EOF'
import sys
t = [float(l.split()[1]) for l in open(sys.argv[1]) if l.strip()]
print(len(t), f"{max(t) - float(sys.argv[2]):.3f}")
EOF
}

t_partition() {
  SWITCH=1 SIZE=64M nodes_up
  etcd3_up
  etcd_node_up 1
  etcd_node_up 2
  repl 1 primary --force >/dev/null
  wait_peer 1 Established
  wait_peer 2 Established
  local bs=4096 blocks k p=1 s=2 n
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  RANDOM=$((SEED % 32768))
  for k in $(seq 1 "$ROUNDS"); do
    local seed=$((SEED + k)) wpid t_cut t_up
    # The cut member leads etcd in rounds 1, 4, 5, 8, ... (the majority elects another
    # leader, which keeps every lease for one more TTL) and follows in the others (the
    # witness leads): with the roles alternating, each lease-loss mode meets both.
    case $((k % 4)) in 0 | 1) etcd_lead $p ;; *) etcd_lead 3 ;; esac
    say "partition $k (seed $seed): node $p (${NAME[$p]}) primary, on lease loss ${ON_LOSS[$p]}; etcd leader m$(etcd_leader)"
    expect_eq "$(etcd_get $s /cairn/repl/home/primary | cut -d' ' -f1)" "${NAME[$p]}" "the lease holder in etcd"
    rm -f "$WORK/log"
    py "$ORACLE" write "$(client_uri $p)" "$seed" "$blocks" "$bs" 32 "$WORK/log" stamp \
      >"$WORK/writer.out" 2>&1 &
    wpid=$!
    register pid "$wpid"
    for n in $(seq 200); do [ -s "$WORK/log" ] && break; sleep 0.05; done
    [ -s "$WORK/log" ] || fail "no write acknowledged within 10 s: $(cat "$WORK/writer.out")"
    # Drawn outside $(...): bash reseeds RANDOM in subshells; the replay repeats it.
    local ms=$((200 + RANDOM % 600))
    sleep "$(printf '0.%03d' "$ms")"
    kill -0 "$wpid" 2>/dev/null || fail "the writer finished before the cut: $(cat "$WORK/writer.out")"
    # The primary's namespace is cut off: its node and its etcd member, from both others.
    isolate $p
    t_cut=$(now)
    # The other node, with the majority, takes the lease once it ran out in etcd.
    wait_role $s Primary 400
    t_up=$(now)
    say "  node $s promoted $(py -c "print(f'{$t_up - $t_cut:.1f}')") s after the cut: $(last_event $s failover)"
    expect_contains "$(last_event $s failover)" "no primary held the lease" "node $s's failover event"
    expect_eq "$(etcd_get $s /cairn/repl/home/primary | cut -d' ' -f1)" "${NAME[$s]}" "the lease holder in etcd"
    etcd_healthy $p && fail "node $p's etcd member still has a quorum while cut off"
    # The cut node: still primary, its lease lost, I/O frozen or refused.
    wait_event $p lease-lost
    expect_eq "$(status_json $p | jq -r .role)" Primary "node $p's role while cut off"
    expect_eq "$(status_json $p | jq -r .quorum)" "primary lease lost: I/O $([ "${ON_LOSS[$p]}" = freeze ] && echo frozen || echo refused)" \
      "node $p's lease while cut off"
    say "  node $p: $(last_event $p lease-lost)"
    # Nothing acknowledged after its lease could have run out ...
    local acked last
    read -r acked last < <(ack_times "$WORK/log" "$t_cut")
    say "  node $p acknowledged $acked writes, the last ${last} s after the cut (its lease ran out by $(py -c "print($TTL * 0.9)") s)"
    py -c "import sys; sys.exit(not $last <= $TTL * 0.9)" ||
      fail "node $p acknowledged a write $last s after the cut, after its lease ran out"
    # ... and every write it acknowledged is on the new primary.
    py "$ORACLE" check "$(client_uri $s)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
      fail "node $s lacks writes node $p acknowledged: $(cat "$WORK/check.out")"
    say "  node $s: $(cat "$WORK/check.out")"
    # The new primary writes while the other is away: it marks it outdated in etcd first.
    py -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite((sys.argv[2].encode() * (1 << 20))[: 1 << 20], int(sys.argv[3]) << 20); h.flush(); h.shutdown()' \
      "$(client_uri $s)" "S$k" $((RANDOM % 60))
    expect_contains "$(etcd_keys $s /cairn/repl/home/outdated/)" "/cairn/repl/home/outdated/${NAME[$p]}" \
      "node $p marked outdated in etcd"
    # Healed: the old primary reads in etcd that the new one holds the lease and steps
    # down by itself (nobody runs `cairn repl secondary`); the new primary waits for
    # that and does not overwrite it while it says primary.
    expect_eq "$(status_json $p | jq -r .role)" Primary "node $p's role before the heal"
    rejoin $p
    local t_heal
    t_heal=$(now)
    etcd_healthy $p 100 || fail "node $p's etcd member did not rejoin: $(tail -5 "$WORK/etcd$p.log")"
    wait_role $p Secondary 150
    say "  node $p secondary by itself $(py -c "print(f'{$(now) - $t_heal:.1f}')") s after the heal: $(last_event $p demoted)"
    expect_contains "$(last_event $p demoted)" "by itself (automatic failover): ${NAME[$s]} holds the primary lease" \
      "node $p's demoted event"
    # Its frozen (or refused) writes failed and its client was let go: nothing hangs.
    for n in $(seq 100); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$wpid" 2>/dev/null && fail "the writer on node $p still waits after it stepped down"
    wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
    say "  writer: $(cat "$WORK/writer.out")"
    # Resynced from the new primary: its writes and the blocks the old one wrote without
    # acknowledging them (its own bitmap), not the whole disk.
    wait_peer $s Established 300
    wait_peer $p Established
    expect_eq "$(status_json $p | jq -r .disk)" UpToDate "node $p's disk after the resync"
    local resynced
    resynced=$(last_event $s resync-started)
    say "  node $p back: $resynced"
    expect_contains "$resynced" "bitmap resync to ${NAME[$p]}" "the resync of node $p"
    for n in $(seq 50); do
      [ -z "$(etcd_keys $s /cairn/repl/home/outdated/)" ] && break
      sleep 0.1
    done
    expect_eq "$(etcd_keys $s /cairn/repl/home/outdated/)" "" "outdated marks after the resync"
    repl $s verify --wait >/dev/null
    expect_eq "$(status_json $s | jq -r '.peers[0].verify.out_of_sync_blocks')" 0 \
      "blocks out of sync (verify on node $s)"
    local tmp=$p
    p=$s
    s=$tmp
  done
  repl $p secondary >/dev/null
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

# ack_gap FROM: sets GAP (the longest time between two acknowledged writes of the
# writer's log, from FROM on) and LAST (the last one, seconds after FROM).
ack_gap() {
  kill -0 "$WPID" 2>/dev/null || fail "the writer stopped: $(cat "$WORK/writer.out")"
  read -r GAP LAST < <(py - "$WORK/wlog" "$1" <<'EOF'
import sys
cut = float(sys.argv[2])
t = [cut] + [x for x in (float(l.split()[1]) for l in open(sys.argv[1]) if l.strip()) if x > cut]
print(f"{max(b - a for a, b in zip(t, t[1:] or t)):.2f}", f"{t[-1] - cut:.1f}")
EOF
  )
}

# witness_cut: cuts the witness off for three TTLs (a lease that depended on it would
# have run out twice over) while the writer runs; sets GAP and LAST (ack_gap).
witness_cut() {
  local t_cut
  isolate 3
  t_cut=$(now)
  sleep $((3 * TTL))
  etcd_healthy 1 50 || fail "a and b's members have no quorum without the witness"
  [ "$(etcd_leader)" != 3 ] || fail "the cut witness still leads"
  ack_gap "$t_cut"
  expect_eq "$(status_json 1 | jq -r .role)" Primary "node 1's role"
  expect_eq "$(status_json 2 | jq -r .role)" Secondary "node 2's role"
  expect_contains "$(status_json 1 | jq -r .quorum)" "primary lease held" "node 1's lease"
  expect_eq "$(peer_field 1 replication)" Established "node 1's peer"
  expect_eq "$(peer_field 2 replication)" Established "node 2's peer"
  case " $(events 2) " in *" failover "* | *" promoted "*) fail "node 2 took over: $(events 2)" ;; esac
  # Writes went on being acknowledged until the end.
  py -c "import sys; sys.exit(not $LAST >= $((3 * TTL)) - 1)" ||
    fail "the last write was acknowledged $LAST s after the cut"
  rejoin 3
  etcd_healthy 3 100 || fail "the witness's member did not rejoin: $(tail -5 "$WORK/etcd3.log")"
}

t_witness() {
  SWITCH=1 SIZE=32M nodes_up
  etcd3_up
  etcd_node_up 1
  etcd_node_up 2
  repl 1 primary --force >/dev/null
  wait_peer 1 Established
  wait_peer 2 Established
  # A writer that logs the time of each acknowledged write, for as long as it runs.
  py -c 'import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
f = open(sys.argv[2], "a", buffering=1)
i = 0
while True:
    h.pwrite(bytes([i % 251]) * 4096, (i % 1024) * 4096); i += 1
    f.write(f"{i} {time.time():.6f}\n")' "$(client_uri 1)" "$WORK/wlog" >"$WORK/writer.out" 2>&1 &
  WPID=$!
  register pid "$WPID"
  local n
  for n in $(seq 100); do [ -s "$WORK/wlog" ] && break; sleep 0.05; done
  # 1. The witness follows: a and b's members keep their leader. Nothing at all changes;
  # the primary's keepalives never miss.
  etcd_lead 1
  witness_cut
  say "witness cut while following: the last write $LAST s after the cut, longest gap $GAP s"
  case " $(events 1) " in *" lease-lost "*) fail "node 1 lost its lease: $(last_event 1 lease-lost)" ;; esac
  py -c "import sys; sys.exit(not $GAP < 1)" || fail "writes stalled for $GAP s"
  # 2. The witness leads: a and b's members elect a leader among themselves, which takes
  # etcd's election timeout. The primary's keepalives may miss meanwhile, long enough at a
  # TTL of 2 s for its lease to lapse on its side: its I/O then pauses and goes on when a
  # keepalive gets through (etcd's new leader kept the lease). The roles stay.
  etcd_lead 3
  witness_cut
  say "witness cut while leading: the last write $LAST s after the cut, longest gap $GAP s; node 1's events: $(events 1)"
  case " $(events 1) " in
    *" lease-lost "*) expect_contains "$(events 1)" lease-renewed "node 1's events after a lapse" ;;
  esac
  # 3. Node a's own member, first in its list, stops (while it follows: no election).
  # Node a goes on to the next member of its list; its lease never lapses.
  etcd_lead 2
  local lost t_stop
  lost=$(events 1 | grep -o lease-lost | wc -l)
  kill -KILL "${EPID[1]}"
  t_stop=$(now)
  sleep $((3 * TTL))
  etcd_healthy 2 50 || fail "b's and the witness's members have no quorum without a's"
  ack_gap "$t_stop"
  say "node a's member stopped: the last write $LAST s after, longest gap $GAP s"
  expect_eq "$(status_json 1 | jq -r .role)" Primary "node 1's role"
  expect_contains "$(status_json 1 | jq -r .quorum)" "primary lease held" "node 1's lease without its member"
  expect_eq "$(events 1 | grep -o lease-lost | wc -l)" "$lost" "node 1's lease-lost events without its member"
  py -c "import sys; sys.exit(not $GAP < 1)" || fail "writes stalled for $GAP s"
  py -c "import sys; sys.exit(not $LAST >= $((3 * TTL)) - 1)" ||
    fail "the last write was acknowledged $LAST s after node a's member stopped"
  stop_tree "$WPID"
  repl 1 secondary >/dev/null
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

# A primary cut off with nobody to take over (node b without --auto-failover): it loses
# its lease with writes in flight that reached its own disk and maybe not b's. Healed and
# made secondary, it holds the same generation as b (it acknowledged nothing without b,
# so it took no new one); b promoted by hand finds them in sync by generation and must
# still copy the blocks a wrote without acknowledging them (a's bitmap towards b).
t_no_takeover() {
  SWITCH=1 SIZE=32M nodes_up
  etcd3_up
  etcd_node_up 1
  # shellcheck disable=SC2046
  node_up 2 $(etcd_args 2) --etcd-ttl "$TTL"
  repl 1 primary --force >/dev/null
  wait_peer 1 Established
  wait_peer 2 Established
  local bs=4096 blocks seed=$((SEED + 1000)) n wpid
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  py "$ORACLE" write "$(client_uri 1)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
  wpid=$!
  register pid "$wpid"
  for n in $(seq 200); do [ -s "$WORK/log" ] && break; sleep 0.05; done
  sleep 0.3
  kill -0 "$wpid" 2>/dev/null || fail "the writer finished before the cut: $(cat "$WORK/writer.out")"
  isolate 1
  wait_event 1 lease-lost 150
  wait_peer 1 Off 100
  local oos
  oos=$(peer_field 1 out_of_sync_bytes)
  say "node 1 cut off: $(last_event 1 lease-lost); $oos bytes written without b"
  [ "$oos" -gt 0 ] || fail "node 1 marked nothing out of sync with writes in flight at the cut"
  sleep "$TTL"
  expect_eq "$(status_json 2 | jq -r .role)" Secondary "node 2 (no automatic failover)"
  rejoin 1
  repl 1 secondary >/dev/null
  for n in $(seq 100); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.1; done
  wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
  # a's lease is gone from etcd (run out, or revoked as it stepped down): b takes it.
  for n in $(seq 100); do
    [ -z "$(etcd_get 2 /cairn/repl/home/primary)" ] && break
    sleep 0.1
  done
  repl 2 primary >/dev/null
  wait_peer 2 Established 300
  wait_peer 1 Established
  local resynced
  resynced=$(last_event 2 resync-started)
  say "node 2 promoted by hand: $resynced"
  expect_contains "$resynced" "bitmap resync to a" "node 2's last resync (of node 1's unacknowledged writes)"
  py "$ORACLE" check "$(client_uri 2)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
    fail "node 2 lacks writes node 1 acknowledged: $(cat "$WORK/check.out")"
  say "  $(cat "$WORK/check.out")"
  repl 2 verify --wait >/dev/null
  expect_eq "$(status_json 2 | jq -r '.peers[0].verify.out_of_sync_blocks')" 0 "blocks out of sync (verify)"
  repl 2 secondary >/dev/null
  cmp -n "$(status_json 1 | jq -r .data_size)" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ"
}

run_test witness t_witness
run_test no_takeover t_no_takeover
run_test partition t_partition
finish
