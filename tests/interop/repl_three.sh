#!/usr/bin/env bash
# Three data nodes: a, b and c each run `cairn repl up` (two peers each, --max-peers 2) in
# a network namespace of its own, the three on one bridge (repl_lib.sh's switch), real TCP.
#
# failover: each namespace also runs a member of a three-member etcd, every node
# `--etcd` on its own member with `--auto-failover`. A writer logs every write a
# acknowledges (acked_writes.py); a is killed with SIGKILL. Exactly one of b and c takes
# the lease (the etcd transaction) and is promoted by itself; the other stays secondary,
# the new primary connects to it, and it is verified and compared equal to the new
# primary (after the resync of whatever a had in flight to one of them but not the
# other). Every acknowledged write reads back through the new primary. a comes back as
# secondary and is resynced from its activity log and the new primary's bitmap only
# (<= 4 extents of 4 MiB + what that bitmap marked: the 1 MiB written meanwhile, and in
# later rounds up to 4 extents left from the new primary's own return), then all three
# are equal.
#
# split_brain: no etcd. a is cut off from b and c (its veth down) while it writes; b is
# promoted with --force and writes too, c follows b. Healed: a and b (two primaries) and
# a and c (c holds b's generation) are split brains, seen and refused on both sides of
# both pairs, with each side's changed blocks in the events; c keeps b's data, never a's.
# Resolved by hand: `secondary` + `connect --discard-my-data` on a, `connect` on b: all
# three equal.
#
# CAIRN_REPL_THREE_ROUNDS (default 1) failovers in a row (the roles rotate);
# CAIRN_REPL_THREE_ROUNDS=10 is the long mode. CAIRN_SEED replays a run.
. "$(dirname "$0")/lib.sh"

ROUNDS=${CAIRN_REPL_THREE_ROUNDS:-2}
SEED=${CAIRN_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
say "repl_three: seed $SEED, $ROUNDS failovers (replay: CAIRN_SEED=$SEED)"
ORACLE=$INTEROP_DIR/acked_writes.py
TAG=r3$$
IP=([1]=10.234.1.1 [2]=10.234.1.2 [3]=10.234.1.3)
TTL=2

. "$INTEROP_DIR/repl_lib.sh"

NAME=([1]=a [2]=b [3]=c [4]=d)
IP[4]=10.234.1.4
# The data nodes of the test that runs (four_nodes adds d).
NODES=(1 2 3)

# three_up: the switch, and a 64 MiB backing file with room for a peer per other node.
three_up() {
  need_root
  need_tool ip nbdinfo nbdcopy jq timeout cmp md5sum
  py -c 'import nbd' 2>/dev/null || skip "python3-libnbd (the nbd module) is missing"
  NS=([1]=${TAG}a [2]=${TAG}b)
  SWITCH_NODES="${NODES[*]}" switch_up
  local i
  for i in "${NODES[@]}"; do
    rm -f "$SHM/n$i.img"
    "$CAIRN" repl create-md --max-peers $((${#NODES[@]} - 1)) --size 64M "$SHM/n$i.img" >/dev/null
    DISK[$i]=$SHM/n$i.img
  done
}

# up I [ARGS]: node I with the other nodes as peers; sets NPID[I].
up() {
  local i=$1 j peers=()
  shift
  for j in "${NODES[@]}"; do
    [ "$j" = "$i" ] || peers+=(--peer "${NAME[$j]}=nbd://${IP[$j]}:7789/home")
  done
  ip netns exec "${NS[$i]}" "$CAIRN" -v repl up home --disk "${DISK[$i]}" --node "${NAME[$i]}" \
    --listen "tcp:${IP[$i]}:7789" --insecure-no-tls --peer-timeout "$PEER_TIMEOUT" --al-extents 4 \
    "${peers[@]}" --client-listen "unix:$WORK/n$i.nbd" --control "$(ctl "$i")" "$@" \
    >>"$WORK/n$i.log" 2>&1 &
  NPID[$i]=$!
  register pid "${NPID[$i]}"
  local n
  for n in $(seq 100); do
    [ -S "$(ctl "$i")" ] && status_json "$i" >/dev/null 2>&1 && return 0
    kill -0 "${NPID[$i]}" 2>/dev/null || fail "node $i exited: $(tail -5 "$WORK/n$i.log")"
    sleep 0.1
  done
  fail "node $i does not answer: $(tail -5 "$WORK/n$i.log")"
}
etcd_up_node() { up "$1" --etcd "$(etcd_url "$1")" --etcd-ttl "$TTL" --auto-failover; }

# peer_of I J FIELD: node I's view of peer J.
peer_of() { status_json "$1" | jq -r --arg p "${NAME[$2]}" ".peers[] | select(.name == \$p) | .$3"; }

# wait_of I J STATE [TENTHS]: node I sees peer J in replication state STATE.
wait_of() {
  local n s
  for n in $(seq "${4:-300}"); do
    s=$(peer_of "$1" "$2" replication)
    [ "$s" = "$3" ] && return 0
    sleep 0.1
  done
  fail "node ${NAME[$1]}: peer ${NAME[$2]} is $s, not $3: $(status_text "$1")"
}

# first_about_since_promotion I J: node I's first `connected` or `resync-started` event
# about peer J since its last promotion, as "KIND: message".
first_about_since_promotion() {
  status_json "$1" | jq -r --arg p "${NAME[$2]}" '.events as $e
    | ([$e[].kind] | rindex("promoted")) as $i
    | [$e[$i:][] | select(.peer == $p and (.kind == "connected" or .kind == "resync-started"))]
    | first // {} | "\(.kind): \(.message)"'
}

# events_of I KIND [PEER]: the messages of node I's events of KIND (about PEER), one a line.
events_of() {
  status_json "$1" | jq -r --arg k "$2" --arg p "${3:-}" \
    '.events[] | select(.kind == $k and ($p == "" or .peer == $p)) | .message'
}

# data_md5 I: the md5 of node I's data area, read from its backing file (a plain copy of
# the volume); vol_md5 I: the same read through node I's NBD export (primary only).
data_md5() { head -c "$(status_json "$1" | jq -r .data_size)" "${DISK[$1]}" | md5sum | cut -d' ' -f1; }
vol_md5() { nbdcopy "$(client_uri "$1")" - | md5sum | cut -d' ' -f1; }

# pwrite I CHAR LEN OFFSET: LEN bytes of CHAR at OFFSET through node I's volume, flushed.
pwrite() {
  timeout -k 2 30 /usr/bin/python3 -c 'import nbd, sys; h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(sys.argv[2].encode() * int(sys.argv[3]), int(sys.argv[4])); h.flush(); h.shutdown()' \
    "$(client_uri "$1")" "$2" "$3" "$4"
}

# verify_clean P: primary P verifies both peers: 0 blocks out of sync.
verify_clean() {
  repl "$1" verify --wait >/dev/null || fail "verify on node ${NAME[$1]}: $(status_text "$1")"
  local v
  v=$(status_json "$1" | jq -r '[.peers[] | "\(.name)=\(.verify.out_of_sync_blocks)"] | join(" ")')
  say "  verify on ${NAME[$1]}: out-of-sync blocks $v"
  case " $v " in
    *=0\ *=0\ ) ;;
    *) fail "verify on node ${NAME[$1]} found blocks out of sync: $v; 4 KiB blocks that differ from ${NAME[$1]}'s: $(differ "$1")" ;;
  esac
}

# differ I: for each other node, the 4 KiB blocks of its data area that differ from node
# I's (a failure's post-mortem).
differ() {
  local j
  for j in "${NODES[@]}"; do
    [ "$j" = "$1" ] && continue
    printf '%s: %s; ' "${NAME[$j]}" "$(py -c 'import sys
a, b, n = open(sys.argv[1], "rb"), open(sys.argv[2], "rb"), int(sys.argv[3])
print(" ".join(str(i) for i in range(n // 4096) if a.read(4096) != b.read(4096))[:300])' \
      "${DISK[$1]}" "${DISK[$j]}" "$(status_json "$1" | jq -r .data_size)")"
  done
}

t_failover() {
  three_up
  etcd3_up
  local i
  for i in 1 2 3; do etcd_up_node $i; done
  repl 1 primary --force >/dev/null
  wait_of 1 2 Established
  wait_of 1 3 Established
  local bs=4096 blocks k p=1 n
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  RANDOM=$((SEED % 32768))
  for k in $(seq 1 "$ROUNDS"); do
    local seed=$((SEED + k)) wpid o1 o2 w l
    o1=$((p % 3 + 1))
    o2=$((o1 % 3 + 1))
    say "failover $k (seed $seed): ${NAME[$p]} primary, ${NAME[$o1]} and ${NAME[$o2]} secondaries"
    rm -f "$WORK/log"
    py "$ORACLE" write "$(client_uri $p)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
    wpid=$!
    register pid "$wpid"
    for n in $(seq 200); do [ -s "$WORK/log" ] && break; sleep 0.05; done
    [ -s "$WORK/log" ] || fail "no write acknowledged within 10 s: $(cat "$WORK/writer.out")"
    sleep "$(printf '0.%03d' $((100 + RANDOM % 800)))"
    node_kill $p
    wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
    say "  ${NAME[$p]} killed: $(cat "$WORK/writer.out")"
    # Exactly one of the two takes the lease and is promoted by itself.
    w=""
    for n in $(seq 300); do
      for i in $o1 $o2; do
        [ "$(status_json $i | jq -r .role)" = Primary ] && w=$i && break 2
      done
      sleep 0.1
    done
    [ -n "$w" ] || fail "neither ${NAME[$o1]} nor ${NAME[$o2]} took over: $(status_text $o1) $(status_text $o2)"
    l=$((w == o1 ? o2 : o1))
    expect_contains "$(last_event $w failover)" "no primary held the lease" "${NAME[$w]}'s failover event"
    expect_eq "$(etcd_get $w /cairn/repl/home/primary | cut -d' ' -f1)" "${NAME[$w]}" "the lease holder in etcd"
    # The other stays secondary (its own transactions fail while w holds the lease) and
    # becomes w's peer.
    wait_of $w $l Established
    sleep "$TTL"
    expect_eq "$(status_json $l | jq -r .role)" Secondary "${NAME[$l]}'s role"
    [ -z "$(events_of $l promoted)" ] || fail "${NAME[$l]} was promoted too: $(events_of $l promoted)"
    expect_eq "$(peer_of $l $w replication)" Established "${NAME[$l]}'s view of ${NAME[$w]}"
    # The two survivors held the same generation: the new primary's first connection to
    # the other is in sync, no resync (bits left towards it from a node's own return as a
    # crashed primary used to copy its activity log again here, from the second round on).
    local first
    first=$(first_about_since_promotion $w $l)
    say "  ${NAME[$w]} took over: $(last_event $w failover); ${NAME[$l]} follows: $first"
    expect_eq "$first" "connected: connected to ${NAME[$l]} (in sync)" "${NAME[$w]}'s first connection to ${NAME[$l]} after the failover"
    py "$ORACLE" check "$(client_uri $w)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
      fail "${NAME[$w]} lacks writes ${NAME[$p]} acknowledged (seed $seed): $(cat "$WORK/check.out")"
    say "  ${NAME[$w]}: $(cat "$WORK/check.out")"
    # The two survivors hold the same data: whatever a had in flight to one of them and
    # not the other included. The new primary verifies its peer by itself after the
    # failover (verify --resync) and copies what differs.
    for n in $(seq 300); do
      [ -n "$(events_of $w verify-after-failover "${NAME[$l]}")" ] &&
        [ "$(peer_of $w $l verify.running)" = false ] && break
      sleep 0.1
    done
    say "  $(events_of $w verify-after-failover "${NAME[$l]}"); $(events_of $w verify-done "${NAME[$l]}" | tail -1)"
    [ "$(peer_of $w $l verify.running)" = false ] ||
      fail "no verify of ${NAME[$l]} after the failover ended: $(status_text $w)"
    for n in $(seq 300); do
      [ "$(peer_of $w $l replication)" = Established ] && [ "$(peer_of $w $l out_of_sync_bytes)" = 0 ] && break
      sleep 0.1
    done
    verify_one() {
      repl "$w" verify --peer "${NAME[$l]}" --wait >/dev/null || fail "verify: $(status_text $w)"
      expect_eq "$(status_json $w | jq -r --arg p "${NAME[$l]}" '.peers[] | select(.name == $p) | .verify.out_of_sync_blocks')" 0 \
        "blocks out of sync between ${NAME[$w]} and ${NAME[$l]} (verify)"
    }
    verify_one
    expect_eq "$(data_md5 $l)" "$(vol_md5 $w)" "${NAME[$l]}'s data area against ${NAME[$w]}'s volume"
    # The new primary writes while the old one is away: 1 MiB, marked in its bitmap.
    # One character (the fill repeats it): 1 MiB exactly in every round.
    pwrite $w "$((k % 10))" $((1 << 20)) $(((RANDOM % 60) << 20))
    # What the new primary's bitmap towards the old one marks: that 1 MiB, nothing left
    # from its own return as a crashed primary in an earlier round.
    local marked
    marked=$(peer_of $w $p out_of_sync_bytes)
    expect_eq "$marked" $((1 << 20)) "the bytes ${NAME[$w]}'s bitmap towards ${NAME[$p]} marks"
    # The old primary returns: secondary, resynced from its activity log and the new
    # primary's bitmap, not in full.
    etcd_up_node $p
    wait_of $w $p Established 300
    expect_eq "$(status_json $p | jq -r .role)" Secondary "${NAME[$p]}'s role after its return"
    expect_eq "$(status_json $p | jq -r .disk)" UpToDate "${NAME[$p]}'s disk after the resync"
    local resynced bytes
    resynced=$(events_of $w resync-started "${NAME[$p]}" | tail -1)
    say "  ${NAME[$p]} back: $resynced"
    expect_contains "$resynced" "bitmap resync to ${NAME[$p]}" "the resync of ${NAME[$p]}"
    bytes=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' <<<"$resynced")
    [ "$bytes" -le $(((16 << 20) + marked)) ] ||
      fail "resynced $bytes bytes to ${NAME[$p]}: more than its activity log (4 x 4 MiB) and the $marked bytes the new primary's bitmap marked"
    # Its resync from w emptied its bits towards l too: w told it l holds w's data (in
    # sync, verified after the failover), so the two copy nothing when they next meet.
    expect_eq "$(peer_of $p $l out_of_sync_bytes)" 0 "${NAME[$p]}'s bits towards ${NAME[$l]} after its resync from ${NAME[$w]}"
    expect_contains "$(events_of $p resync-done "${NAME[$w]}" | tail -1)" "towards ${NAME[$l]}" "${NAME[$p]}'s resync-done event"
    verify_clean $w
    p=$w
  done
  # All three data areas equal, after a clean stop of the primary role.
  local m
  m=$(vol_md5 $p)
  repl $p secondary >/dev/null
  for i in 1 2 3; do expect_eq "$(data_md5 $i)" "$m" "${NAME[$i]}'s data area"; done
}

t_split_brain() {
  three_up
  local i
  for i in 1 2 3; do up $i; done
  repl 1 primary --force >/dev/null
  wait_of 1 2 Established
  wait_of 1 3 Established
  pwrite 1 0 $((4 << 20)) 0
  # a is cut off from b and c and goes on writing: it drops both after the peer timeout.
  isolate 1
  pwrite 1 A 65536 0
  wait_of 1 2 Off 100
  wait_of 1 3 Off 100
  # b is made primary by hand while a is away; c (in sync with b) follows it.
  repl 2 primary --force >/dev/null
  wait_of 2 3 Established
  pwrite 1 A 65536 $((8 << 20))
  pwrite 2 B 8192 $((1 << 20))
  pwrite 2 B 8192 $((9 << 20))
  local bsum
  bsum=$(vol_md5 2)
  # Healed: both pairs that diverged see split brain, on both sides, and refuse it.
  rejoin 1
  wait_of 1 2 SplitBrain
  wait_of 2 1 SplitBrain
  wait_of 1 3 SplitBrain
  wait_of 3 1 SplitBrain
  expect_eq "$(peer_of 2 3 replication)" Established "b's view of c after the heal"
  expect_eq "$(peer_of 3 2 replication)" Established "c's view of b after the heal"
  local e
  for i in "1 2" "2 1" "1 3" "3 1"; do
    set -- $i
    e=$(events_of $1 split-brain "${NAME[$2]}" | tail -1)
    say "  ${NAME[$1]} about ${NAME[$2]}: $e"
    [ -n "$e" ] || fail "no split-brain event on ${NAME[$1]} about ${NAME[$2]}: $(status_text $1)"
    expect_contains "$(status_text $1)" "split brain" "${NAME[$1]}'s status"
  done
  # Each side's changed amount: a changed 2 x 64 KiB since it parted from c; c's own
  # count is 0 (it wrote nothing itself; b's writes came in as b's secondary).
  expect_contains "$(events_of 1 split-brain c | tail -1)" "this node changed 128 KiB" "a's count towards c"
  expect_contains "$(events_of 1 split-brain b | tail -1)" "this node changed 128 KiB" "a's count towards b"
  expect_contains "$(events_of 2 split-brain a | tail -1)" "this node changed 16 KiB" "b's count towards a"
  # c holds b's data, never a mix: none of a's writes after the cut reached it.
  expect_eq "$(vol_md5 2)" "$bsum" "b's volume after the heal"
  repl 2 verify --peer c --wait >/dev/null
  expect_eq "$(peer_of 2 3 verify.out_of_sync_blocks)" 0 "blocks out of sync between b and c"
  expect_eq "$(data_md5 3)" "$bsum" "c's data area against b's volume"
  # Resolution: a's changes go.
  repl 1 secondary >/dev/null
  repl 1 connect --discard-my-data >/dev/null
  repl 2 connect --peer a >/dev/null
  wait_of 2 1 Established
  wait_of 1 2 Established
  say "  resolved: $(last_event 2 resync-started)"
  verify_clean 2
  expect_eq "$(vol_md5 2)" "$bsum" "b's volume after the resolution"
  repl 2 secondary >/dev/null
  for i in 1 2 3; do expect_eq "$(data_md5 $i)" "$bsum" "${NAME[$i]}'s data area"; done
}

# split_brain_third_away: c leaves first (cut off from both), then a is cut off from b;
# b is promoted by hand and both a and b write. c changed nothing: its generation is the
# one both sides started from. DRBD's rule, and cairn's: a node whose data is an ancestor
# of a primary's, with a bitmap that knows the difference, takes that primary's data;
# then it holds that side's generation, and the other side is a split brain for it as
# for the first. b is kept away from c (`disconnect --peer c`) so a reaches c first:
# c takes a's data by a bitmap resync, all of it (md5), none of b's; then b reaches c
# and both sides refuse it as a split brain, c keeping a's data. (Two primaries
# reaching c at once: the fencing epoch of the later data connection shuts the earlier
# one out, c refuses a SyncDone from any node but the last to start a resync and be
# admitted, and it looks blank to the second while the first did not finish, so the
# second's resync is full.)
t_split_brain_third_away() {
  three_up
  local i
  for i in 1 2 3; do up $i; done
  repl 1 primary --force >/dev/null
  wait_of 1 2 Established
  wait_of 1 3 Established
  pwrite 1 0 $((4 << 20)) 0
  # c leaves: a drops it after the peer timeout and goes on with b.
  isolate 3
  pwrite 1 A 65536 0
  wait_of 1 3 Off 100
  expect_eq "$(peer_of 1 2 replication)" Established "a's view of b with c away"
  # a is cut off from b too and writes alone; b is promoted by hand and writes.
  isolate 1
  pwrite 1 A 65536 $((8 << 20))
  wait_of 1 2 Off 100
  repl 2 primary --force >/dev/null
  pwrite 2 B 8192 $((1 << 20))
  pwrite 2 B 8192 $((9 << 20))
  local asum bsum
  asum=$(vol_md5 1)
  bsum=$(vol_md5 2)
  [ "$asum" != "$bsum" ] || fail "a and b hold the same data after writing apart"
  # b stays away from c; a connection attempt of b's begun before is over after the
  # peer timeout.
  repl 2 disconnect --peer c >/dev/null
  sleep $((PEER_TIMEOUT + 1))
  rejoin 1
  rejoin 3
  wait_of 1 2 SplitBrain
  wait_of 2 1 SplitBrain
  # c takes a's data, by the bitmap a kept for it since it left.
  wait_of 1 3 Established
  local e
  e=$(events_of 1 resync-started c | tail -1)
  say "  a to c: $e"
  expect_contains "$e" "bitmap resync to c" "a's resync of c"
  expect_eq "$(data_md5 3)" "$asum" "c's data area against a's volume"
  expect_eq "$(status_json 3 | jq -r .disk)" UpToDate "c's disk"
  # b reaches c: c holds a's generation now, b changed since they parted: split brain
  # on both sides, refused; c keeps a's data, b its own.
  repl 2 connect --peer c >/dev/null
  wait_of 2 3 SplitBrain
  wait_of 3 2 SplitBrain
  say "  b about c: $(events_of 2 split-brain c | tail -1)"
  expect_eq "$(data_md5 3)" "$asum" "c's data area after b's attempt"
  expect_eq "$(vol_md5 2)" "$bsum" "b's volume after its attempt"
  expect_eq "$(peer_of 1 3 replication)" Established "a's view of c after b's attempt"
  # Resolution: b's changes go.
  repl 2 secondary >/dev/null
  repl 2 connect --discard-my-data >/dev/null
  repl 1 connect --peer b >/dev/null
  wait_of 1 2 Established
  wait_of 2 1 Established
  verify_clean 1
  repl 1 secondary >/dev/null
  for i in 1 2 3; do expect_eq "$(data_md5 $i)" "$asum" "${NAME[$i]}'s data area"; done
}

# four_nodes: a, b, c, d (`--max-peers 3`), a three-member etcd in a's, b's and c's
# namespaces (d lists all three), `--auto-failover`. a primary; under a writer that
# logs every acknowledged write, d is cut off and comes back: a drops it, goes on with
# b and c, and resyncs d from its bitmap (not in full); every acknowledged write reads
# back, a verify of b, c and d finds 0 out of sync. Then a is killed under a second
# writer: one of b, c, d takes the lease, the other two follow it in sync (no resync),
# each verified after the failover; a comes back and is resynced from its activity log
# and the new primary's bitmap; all four data areas equal.
t_four_nodes() {
  NODES=(1 2 3 4)
  three_up
  etcd3_up
  local i
  for i in 1 2 3; do etcd_up_node $i; done
  up 4 --etcd "$(etcd_urls 2)" --etcd-ttl "$TTL" --auto-failover
  repl 1 primary --force >/dev/null
  for i in 2 3 4; do wait_of 1 $i Established; done
  local bs=4096 blocks seed=$((SEED + 100)) wpid n e
  blocks=$(($(nbdinfo --size "$(client_uri 1)") / bs))
  rm -f "$WORK/log"
  py "$ORACLE" write "$(client_uri 1)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
  wpid=$!
  register pid "$wpid"
  for n in $(seq 200); do [ -s "$WORK/log" ] && break; sleep 0.05; done
  [ -s "$WORK/log" ] || fail "no write acknowledged within 10 s: $(cat "$WORK/writer.out")"
  isolate 4
  wait_of 1 4 Off 100
  sleep 1
  rejoin 4
  wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
  say "  writer: $(cat "$WORK/writer.out")"
  wait_of 1 4 Established 300
  e=$(events_of 1 resync-started d | tail -1)
  say "  d back: $e"
  expect_contains "$e" "bitmap resync to d" "the resync of d"
  for i in 2 3; do
    [ "$(events_of 1 resync-started "${NAME[$i]}" | wc -l)" = 1 ] ||
      fail "a resynced ${NAME[$i]}, which stayed, again after the initial sync: $(events_of 1 resync-started "${NAME[$i]}")"
  done
  py "$ORACLE" check "$(client_uri 1)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
    fail "a lacks acknowledged writes: $(cat "$WORK/check.out")"
  repl 1 verify --wait >/dev/null || fail "verify: $(status_text 1)"
  expect_eq "$(status_json 1 | jq -r '[.peers[].verify.out_of_sync_blocks] | join(" ")')" "0 0 0"     "blocks out of sync with b, c, d (verify)"

  # The failover: a killed under a writer.
  seed=$((seed + 1))
  rm -f "$WORK/log"
  py "$ORACLE" write "$(client_uri 1)" "$seed" "$blocks" "$bs" 32 "$WORK/log" >"$WORK/writer.out" 2>&1 &
  wpid=$!
  register pid "$wpid"
  for n in $(seq 200); do [ -s "$WORK/log" ] && break; sleep 0.05; done
  sleep "0.$((RANDOM % 5 + 1))"
  node_kill 1
  wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
  local w="" o
  for n in $(seq 300); do
    for i in 2 3 4; do
      [ "$(status_json $i | jq -r .role)" = Primary ] && w=$i && break 2
    done
    sleep 0.1
  done
  [ -n "$w" ] || fail "none of b, c, d took over: $(status_text 2)"
  say "  ${NAME[$w]} took over: $(last_event $w failover)"
  py "$ORACLE" check "$(client_uri $w)" "$seed" "$bs" "$WORK/log" >"$WORK/check.out" 2>&1 ||
    fail "${NAME[$w]} lacks writes a acknowledged: $(cat "$WORK/check.out")"
  for o in 2 3 4; do
    [ "$o" = "$w" ] && continue
    wait_of $w $o Established
    expect_eq "$(first_about_since_promotion $w $o)" "connected: connected to ${NAME[$o]} (in sync)"       "${NAME[$w]}'s first connection to ${NAME[$o]}"
    for n in $(seq 300); do
      [ -n "$(events_of $w verify-done "${NAME[$o]}")" ] && [ "$(peer_of $w $o verify.running)" = false ] &&
        [ "$(peer_of $w $o replication)" = Established ] && [ "$(peer_of $w $o out_of_sync_bytes)" = 0 ] && break
      sleep 0.1
    done
    say "  ${NAME[$o]}: $(events_of $w verify-done "${NAME[$o]}" | tail -1)"
    expect_eq "$(peer_of $w $o out_of_sync_bytes)" 0 "${NAME[$w]}'s bits towards ${NAME[$o]} after its verify"
  done
  sleep "$TTL"
  for o in 2 3 4; do
    [ "$o" = "$w" ] || expect_eq "$(status_json $o | jq -r .role)" Secondary "${NAME[$o]}'s role"
  done
  # a returns: its activity log and the new primary's bitmap only.
  etcd_up_node 1
  wait_of $w 1 Established 300
  e=$(events_of $w resync-started a | tail -1)
  say "  a back: $e"
  expect_contains "$e" "bitmap resync to a" "the resync of a"
  n=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' <<<"$e")
  [ "$n" -le $((16 << 20)) ] || fail "resynced $n bytes to a: more than its activity log (4 x 4 MiB)"
  repl $w verify --wait >/dev/null || fail "verify: $(status_text $w)"
  expect_eq "$(status_json $w | jq -r '[.peers[].verify.out_of_sync_blocks] | join(" ")')" "0 0 0"     "blocks out of sync on ${NAME[$w]}'s peers (verify)"
  local m
  m=$(vol_md5 $w)
  repl $w secondary >/dev/null
  for i in 1 2 3 4; do expect_eq "$(data_md5 $i)" "$m" "${NAME[$i]}'s data area"; done
}

# CAIRN_REPL_THREE_TESTS picks tests (default: all).
for t in ${CAIRN_REPL_THREE_TESTS:-failover split_brain split_brain_third_away four_nodes}; do
  run_test "$t" "t_$t"
done
finish
