# Shared helpers of the replication topics (repl.sh, repl_verify.sh, repl_fs.sh): two
# nodes, a and b, each in a network namespace of its own, joined by a veth pair. Source
# it after lib.sh, with TAG (short: interface names are at most 15 characters) and
# IP=([1]=... [2]=...) set.
#
# Knobs: SIZE (the backing files, default 64M), DISK[i] (node i's --disk, default
# $SHM/ni.img), PEER_TIMEOUT (default 3), PEER_SCHEME/PEER_QUERY (nbds:// and its
# query for TLS), EXTERNAL_META=1 (metadata on $SHM/ni.meta).

NAME=([1]=a [2]=b)
PEER_TIMEOUT=${PEER_TIMEOUT:-3}

nodes_up() {
  need_root
  need_tool ip nbdinfo jq timeout cmp
  py -c 'import nbd' 2>/dev/null || skip "python3-libnbd (the nbd module) is missing"
  NS=([1]=${TAG}a [2]=${TAG}b)
  local i
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
