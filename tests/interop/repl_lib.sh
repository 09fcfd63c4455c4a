# Shared helpers of the replication topics (repl.sh, repl_verify.sh, repl_fs.sh,
# repl_etcd.sh): two nodes, a and b, each in a network namespace of its own, joined by a
# veth pair. Source it after lib.sh, with TAG (short: interface names are at most 15
# characters) and IP=([1]=... [2]=...) set.
#
# Knobs: SIZE (the backing files, default 64M), DISK[i] (node i's --disk, default
# $SHM/ni.img), PEER_TIMEOUT (default 3), PEER_SCHEME/PEER_QUERY (nbds:// and its
# query for TLS), EXTERNAL_META=1 (metadata on $SHM/ni.meta), SWITCH=1 (a third
# namespace c, IP[3], and the three on one switch instead of the veth pair; below).

NAME=([1]=a [2]=b)
PEER_TIMEOUT=${PEER_TIMEOUT:-3}

nodes_up() {
  need_root
  need_tool ip nbdinfo jq timeout cmp
  py -c 'import nbd' 2>/dev/null || skip "python3-libnbd (the nbd module) is missing"
  NS=([1]=${TAG}a [2]=${TAG}b)
  local i
  if [ "${SWITCH:-0}" = 1 ]; then
    switch_up
  else
    for i in 1 2; do
      ip netns add "${NS[$i]}" || fail "ip netns add ${NS[$i]}"
      register netns "${NS[$i]}"
      ip -n "${NS[$i]}" link set lo up
    done
    ip link add "${TAG}x" netns "${NS[1]}" type veth peer name "${TAG}y" netns "${NS[2]}" ||
      fail "veth pair"
    ip -n "${NS[1]}" addr add "${IP[1]}/24" dev "${TAG}x"
    ip -n "${NS[2]}" addr add "${IP[2]}/24" dev "${TAG}y"
    link_up
  fi
  for i in 1 2; do
    rm -f "$SHM/n$i.img" "$SHM/n$i.meta" "$WORK/n$i.log"
    # shellcheck disable=SC2086
    "$CAIRN" repl create-md --size "${SIZE:-64M}" "$SHM/n$i.img" \
      ${EXTERNAL_META:+--meta-disk "$SHM/n$i.meta"} >/dev/null
    DISK[$i]=$SHM/n$i.img
  done
}

link_up() {
  ip -n "${NS[1]}" link set "${TAG}x" up
  ip -n "${NS[2]}" link set "${TAG}y" up
}
link_down() {
  ip -n "${NS[1]}" link set "${TAG}x" down
  ip -n "${NS[2]}" link set "${TAG}y" down
}

# SWITCH=1: namespaces a, b and c (a witness: no cairn node, an etcd member) each with one
# veth to a bridge in a fourth namespace, all in one /24. Cutting a namespace's veth
# (`isolate I`) cuts it, and whatever runs in it, from both others at once:
#
#        a (IP[1]) ──${TAG}x1──┐
#        b (IP[2]) ──${TAG}x2──┼── bridge in ${TAG}s
#        c (IP[3]) ──${TAG}x3──┘
#
# SWITCH_NODES (default "1 2 3") lists the namespaces on the switch; the fourth is d.
switch_up() {
  local S=${TAG}s i
  NS[3]=${TAG}c
  NS[4]=${TAG}d
  ip netns add "$S" || fail "ip netns add $S"
  register netns "$S"
  ip -n "$S" link add br0 type bridge || skip "no bridge support in the kernel (ip link add type bridge)"
  ip -n "$S" link set br0 up
  for i in ${SWITCH_NODES:-1 2 3}; do
    ip netns add "${NS[$i]}" || fail "ip netns add ${NS[$i]}"
    register netns "${NS[$i]}"
    ip -n "${NS[$i]}" link set lo up
    ip link add "${TAG}x$i" netns "${NS[$i]}" type veth peer name "${TAG}p$i" netns "$S" ||
      fail "veth of ${NS[$i]}"
    ip -n "$S" link set "${TAG}p$i" master br0 up
    ip -n "${NS[$i]}" addr add "${IP[$i]}/24" dev "${TAG}x$i"
    ip -n "${NS[$i]}" link set "${TAG}x$i" up
  done
}

# isolate I / rejoin I (SWITCH=1): namespace I's veth down / up, on its own side.
isolate() { ip -n "${NS[$1]}" link set "${TAG}x$1" down; }
rejoin() {
  ip -n "${NS[$1]}" link set "${TAG}x$1" up
  # The bridge (no STP) forwards as soon as its port has carrier: wait for both ends.
  local n
  for n in $(seq 50); do
    ip -n "${NS[$1]}" -br link show "${TAG}x$1" | grep -q ' UP ' &&
      ip -n "${TAG}s" -br link show "${TAG}p$1" | grep -q ' UP ' && return 0
    sleep 0.1
  done
  fail "the link of namespace $1 is not up again"
}

ctl() { echo "$WORK/n$1.sock"; }
client_uri() { printf 'nbd+unix:///home?socket=%s' "$WORK/n$1.nbd"; }

# node_up I [ARGS]: `cairn repl up` for node I in its namespace; sets NPID[I].
node_up() {
  local i=$1 o=$((3 - $1))
  shift
  # shellcheck disable=SC2086
  ip netns exec "${NS[$i]}" "$CAIRN" -v repl up home --disk "${DISK[$i]:-$SHM/n$i.img}" \
    ${EXTERNAL_META:+--meta-disk "$SHM/n$i.meta"} --node "${NAME[$i]}" \
    --listen "tcp:${IP[$i]}:7789" --insecure-no-tls --peer-timeout "$PEER_TIMEOUT" --al-extents 4 \
    --peer "${NAME[$o]}=${PEER_SCHEME:-nbd}://${IP[$o]}:7789/home${PEER_QUERY:-}" \
    --client-listen "unix:$WORK/n$i.nbd" --control "$(ctl "$i")" "$@" >>"$WORK/n$i.log" 2>&1 &
  NPID[$i]=$!
  register pid "${NPID[$i]}"
  local n
  for n in $(seq 100); do
    [ -S "$(ctl "$i")" ] && "$CAIRN" repl status home --control "$(ctl "$i")" >/dev/null 2>&1 && return 0
    kill -0 "${NPID[$i]}" 2>/dev/null || fail "node $i exited: $(tail -5 "$WORK/n$i.log")"
    sleep 0.1
  done
  fail "node $i does not answer: $(tail -5 "$WORK/n$i.log")"
}

# error_disk I TAG ARGS...: node I's disk ($SHM/nI.img) served by nbdkit behind its error
# filter with ARGS (e.g. error=EIO error-rate=100% error-file=F: failing while F exists)
# on $WORK/TAG.sock; DISK[I] becomes that export. nbdkit's log: $WORK/nbdkit.log.
error_disk() {
  local i=$1 sock=$WORK/$2.sock n
  shift 2
  rm -f "$sock"
  nbdkit -f --unix "$sock" --filter=error file "$SHM/n$i.img" "$@" >"$WORK/nbdkit.log" 2>&1 &
  register pid $!
  for n in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || fail "nbdkit did not start: $(cat "$WORK/nbdkit.log")"
  DISK[$i]="nbd+unix:///?socket=$sock"
}

# node_kill I: SIGKILL, as a host that loses power. node_down I: a clean stop.
node_kill() {
  kill -KILL "${NPID[$1]}"
  wait "${NPID[$1]}" 2>/dev/null || true
}
node_down() {
  "$CAIRN" repl down home --control "$(ctl "$1")" >/dev/null
  wait "${NPID[$1]}" 2>/dev/null || true
}

# repl I VERB [ARGS]: `cairn repl VERB home` on node I.
repl() { local i=$1; shift; "$CAIRN" repl "$@" home --control "$(ctl "$i")"; }

status_json() { timeout -k 2 10 "$CAIRN" --json repl status home --control "$(ctl "$1")"; }
status_text() { timeout -k 2 10 "$CAIRN" repl status home --control "$(ctl "$1")" 2>&1; }
peer_field() { status_json "$1" | jq -r ".peers[0].$2"; }

# peer_gone_within I TENTHS: node I stops showing its peer as Connected within TENTHS
# tenths of a second (polled every 0.1 s); how many it took is in GONE_AFTER.
peer_gone_within() {
  local n
  for n in $(seq "$2"); do
    if [ "$(peer_field "$1" connection)" != Connected ]; then
      GONE_AFTER="$((n / 10)).$((n % 10))"
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# wait_peer I STATE [TENTHS]: node I sees its peer in replication state STATE.
wait_peer() {
  local n s
  for n in $(seq "${3:-300}"); do
    s=$(peer_field "$1" replication)
    [ "$s" = "$2" ] && return 0
    sleep 0.1
  done
  fail "node $1: peer is $s, not $2: $(status_text "$1")"
}

# last_event I KIND: the message of node I's last event of KIND.
last_event() {
  status_json "$1" | jq -r --arg k "$2" '[.events[] | select(.kind == $k)] | last | .message // ""'
}

wait_role() { # NODE ROLE [TENTHS]
  local n r
  for n in $(seq "${3:-200}"); do
    r=$(status_json "$1" | jq -r .role)
    [ "$r" = "$2" ] && return 0
    sleep 0.1
  done
  fail "node $1 is $r, not $2: $("$CAIRN" repl status home --control "$(ctl "$1")")"
}

# --- a three-member etcd (SWITCH=1) -------------------------------------------------------

# etcd3_up: one etcd member in each of the namespaces a, b and c, on IP[i]:2379 (clients)
# and :2380 (peers), data on tmpfs; EPID[i] is member i's process. A node lists the
# member of its own namespace first (etcd_urls), so a cut namespace takes its node and
# its member out together: the member loses quorum, the node's lease its keepalives (the
# other members, next in its list, are out of reach too). --pre-vote (the default from etcd 3.5 on): a member
# that was cut off and comes back does not depose the leader with the terms it counted
# up alone, which would leave the cluster without a leader for an election timeout, and
# a primary with a TTL of 2 s without keepalives long enough to lose its lease.
ETCD_HEARTBEAT_MS=${ETCD_HEARTBEAT_MS:-100}
ETCD_ELECTION_MS=${ETCD_ELECTION_MS:-1000}
etcd3_up() {
  need_tool etcd curl
  local i cluster=""
  for i in 1 2 3; do cluster+="${cluster:+,}m$i=http://${IP[$i]}:2380"; done
  for i in 1 2 3; do
    rm -rf "$SHM/etcd$i"
    register dir "$SHM/etcd$i"
    ip netns exec "${NS[$i]}" etcd --name "m$i" --data-dir "$SHM/etcd$i" \
      --listen-client-urls "http://${IP[$i]}:2379" --advertise-client-urls "http://${IP[$i]}:2379" \
      --listen-peer-urls "http://${IP[$i]}:2380" --initial-advertise-peer-urls "http://${IP[$i]}:2380" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$TAG" \
      --heartbeat-interval "$ETCD_HEARTBEAT_MS" --election-timeout "$ETCD_ELECTION_MS" --pre-vote=true \
      >"$WORK/etcd$i.log" 2>&1 &
    EPID[$i]=$!
    register pid $!
  done
  for i in 1 2 3; do
    etcd_healthy "$i" 150 || fail "etcd member m$i is not healthy: $(tail -5 "$WORK/etcd$i.log")"
  done
}

etcd_url() { echo "http://${IP[$1]}:2379"; }
# etcd_urls I: every member's endpoint, comma-separated, member I's first.
etcd_urls() { echo "$(etcd_url "$1"),$(etcd_url $(($1 % 3 + 1))),$(etcd_url $((($1 + 1) % 3 + 1)))"; }

# etcd_healthy I [TENTHS]: member I answers /health with a leader (a quorum) in reach.
etcd_healthy() {
  local n
  for n in $(seq "${2:-1}"); do
    ip netns exec "${NS[$1]}" curl -s -m 1 "$(etcd_url "$1")/health" | grep -q '"true"' && return 0
    [ "${2:-1}" = 1 ] || sleep 0.1
  done
  return 1
}

# etcd_v3 I PATH JSON: a v3 API call (the gRPC gateway) on member I.
etcd_v3() { ip netns exec "${NS[$1]}" curl -s -m 3 -X POST -d "$3" "$(etcd_url "$1")/v3/$2"; }

# etcd_keys I PREFIX/: the keys under PREFIX/, one a line, read through member I
# (linearizable: only a member with a quorum answers).
etcd_keys() {
  local k e
  k=$(printf '%s' "$2" | base64 -w0)
  e=$(printf '%s0' "${2%/}" | base64 -w0) # the prefix's end: '0' follows '/'
  etcd_v3 "$1" kv/range "{\"key\": \"$k\", \"range_end\": \"$e\", \"keys_only\": true}" |
    jq -r '.kvs // [] | .[].key | @base64d'
}

# etcd_leader: the index (1-3) of the member that leads, as a member with a quorum sees it.
etcd_leader() {
  local i id
  for i in 1 2 3; do
    id=$(etcd_v3 "$i" maintenance/status '{}' | jq -r '.leader // empty') || continue
    [ -n "$id" ] || continue
    etcd_v3 "$i" cluster/member/list '{}' |
      jq -r --arg id "$id" '.members | to_entries[] | select(.value.ID == $id) | .value.name' |
      sed 's/^m//'
    return 0
  done
  return 1
}

# etcd_get I KEY: KEY's value through member I (empty if absent).
etcd_get() {
  etcd_v3 "$1" kv/range "{\"key\": \"$(printf '%s' "$2" | base64 -w0)\"}" |
    jq -r '.kvs // [] | .[].value | @base64d'
}

# etcd_lead I: makes member I etcd's leader (the leader hands over, raft's transfer).
etcd_lead() {
  local l id
  l=$(etcd_leader) || fail "no etcd leader"
  [ "$l" = "$1" ] && return 0
  id=$(etcd_v3 "$1" maintenance/status '{}' | jq -r .header.member_id)
  etcd_v3 "$l" maintenance/transfer-leadership "{\"targetID\": \"$id\"}" >"$WORK/lead.out"
  local n
  for n in $(seq 50); do
    [ "$(etcd_leader)" = "$1" ] && return 0
    sleep 0.1
  done
  fail "member m$1 did not become etcd's leader: $(cat "$WORK/lead.out")"
}
