#!/usr/bin/env bash
# Disks on other machines: an md array whose members are NBD exports served from other
# network namespaces (real TCP over veth pairs) by cairn, nbdkit and qemu-nbd. Under fio
# verify=crc32c load, member servers are killed and brought back: the array goes on
# degraded (an event, `cairn status` says faulty), re-adds a member when its server
# answers again and rebuilds only what the write-intent bitmap marks; two members of a
# RAID6 may be gone; with three gone reads fail cleanly and nothing is corrupted. mdadm
# reads the members' data afterwards, and the array assembles from local copies of them.
. "$(dirname "$0")/lib.sh"

# Short: interface names are at most 15 characters.
TAG=cr$$

# netns_up N: a namespace for the array host ($H) and one per member ($MNS[i]); member i
# is at 10.231.i.2, the host at 10.231.i.1 on the same veth pair.
netns_up() {
  need_root
  need_tool ip
  H=${TAG}h
  ip netns add "$H" || fail "ip netns add $H"
  register netns "$H"
  ip -n "$H" link set lo up
  MNS=()
  local i m
  for i in $(seq 1 "$1"); do
    m=${TAG}m$i
    ip netns add "$m" || fail "ip netns add $m"
    register netns "$m"
    MNS[$i]=$m
    ip -n "$m" link set lo up
    ip link add "${TAG}a$i" netns "$H" type veth peer name "${TAG}b$i" netns "$m" ||
      fail "veth pair $i"
    ip -n "$H" addr add "10.231.$i.1/24" dev "${TAG}a$i"
    ip -n "$H" link set "${TAG}a$i" up
    ip -n "$m" addr add "10.231.$i.2/24" dev "${TAG}b$i"
    ip -n "$m" link set "${TAG}b$i" up
  done
}

# Which server serves member i.
KIND=([1]=cairn [2]=nbdkit [3]=qemu-nbd [4]=cairn)
member_uri() { printf 'nbd://10.231.%s.2/m%s' "$1" "$1"; }

# member_start I: serves $SHM/mI.img as export mI from member I's namespace, waits until
# the host namespace reaches it; sets MPID[I].
member_start() {
  local i=$1 ip=10.231.$1.2 file=$SHM/m$1.img log=$WORK/m$1.log
  case ${KIND[$i]} in
    cairn)
      local extra=()
      # A listener off loopback needs TLS or an explicit opt-out where cairn has TLS.
      "$CAIRN" serve --help | grep -q -- --insecure-no-tls && extra=(--insecure-no-tls)
      ip netns exec "${MNS[$i]}" "$CAIRN" serve --no-control "${extra[@]}" \
        --listen "tcp:$ip:10809" "$file:m$i" >>"$log" 2>&1 &
      ;;
    nbdkit)
      ip netns exec "${MNS[$i]}" nbdkit -f -i "$ip" -p 10809 -e "m$i" file "$file" >>"$log" 2>&1 &
      ;;
    qemu-nbd)
      ip netns exec "${MNS[$i]}" qemu-nbd -b "$ip" -p 10809 -x "m$i" -f raw --persistent \
        --shared=16 "$file" >>"$log" 2>&1 &
      ;;
  esac
  MPID[$i]=$!
  register pid "${MPID[$i]}"
  local n
  for n in $(seq 100); do
    ip netns exec "$H" nbdinfo --size "$(member_uri "$i")" >/dev/null 2>&1 && return 0
    kill -0 "${MPID[$i]}" 2>/dev/null || fail "member server $i (${KIND[$i]}) exited: $(cat "$log")"
    sleep 0.1
  done
  fail "member server $i (${KIND[$i]}) does not answer: $(cat "$log")"
}

# member_kill I: SIGKILL, as a host that loses power.
member_kill() {
  kill -KILL "${MPID[$1]}"
  wait "${MPID[$1]}" 2>/dev/null || true
  say "killed member server $1 (${KIND[$1]})"
}

api() { curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/$1"; }

# wait_for SECS WHAT COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
  local secs=$1 what=$2 i
  shift 2
  for i in $(seq $((secs * 5))); do
    "$@" && return 0
    sleep 0.2
  done
  fail "$what: not within $secs s"
}

faulty_count() {
  [ "$(api "$ARR" | jq '[.detail.members[] | select(.state == "faulty" or .state == "removed")] | length')" = "$1" ]
}
rebuilt() {
  local st
  st=$(api "$ARR" | jq -r 'if .background then "\(.background.action) \(.background.state)" else "none" end')
  [ "$st" = "recovery finished" ] && [ "$(api "$ARR" | jq .detail.state.degraded)" = false ]
}

# serve_remote: the array on the four members, served from the host namespace.
serve_remote() {
  CTL=$WORK/ctl.sock
  EVENTS=$WORK/events.log
  : >"$EVENTS"
  CAIRN_WRAP="ip netns exec $H" start_cairn --control "$CTL" --member-timeout 2 \
    --speed-limit-min 20000 \
    --on-event "echo \"\$CAIRN_EVENT|\$CAIRN_MEMBER|\$CAIRN_MESSAGE\" >>$EVENTS" \
    --md "$(IFS=,; echo "${URIS[*]}"):$ARR"
  URI=$(unix_uri "$ARR")
  SIZE=$(nbdinfo --size "$URI")
}

# fio on the first 16 MiB of the array (so the bitmap bits it dirties are known: 8 MiB
# of each member), with crc32c verification, paced to about RUN seconds.
start_fio() {
  local region=$((16 << 20)) rate=$(((16 << 20) / RUN * 2))
  fio --name=verify --ioengine=nbd --uri="$URI" --rw=randrw --rwmixread=40 \
    --bsrange=4k-64k --iodepth=8 --size="$region" --verify=crc32c --verify_backlog=64 \
    --verify_fatal=1 --time_based --runtime="$RUN" --rate="$rate,$rate" \
    --output-format=json --output="$WORK/fio.json" >"$WORK/fio.stdout" 2>"$WORK/fio.err" &
  FIO_PID=$!
  register pid "$FIO_PID"
}

fio_ok() {
  local status=0
  wait "$FIO_PID" || status=$?
  [ "$status" = 0 ] || fail "fio failed ($status): $(tail -5 "$WORK/fio.err") $(tail -5 "$WORK/fio.stdout")"
  expect_eq "$(jq '[.jobs[].error] | add' "$WORK/fio.json")" 0 "fio errors"
  grep -qi "verify" "$WORK/fio.err" && fail "fio reported verify trouble: $(grep -i verify "$WORK/fio.err" | head -3)"
  say "fio: $(jq '[.jobs[].read.io_bytes] | add' "$WORK/fio.json") bytes read and verified, $(jq '[.jobs[].write.io_bytes] | add' "$WORK/fio.json") written, 0 errors"
}

t_raid6_members_on_other_hosts() {
  need_tool fio jq curl nbdinfo nbdcopy nbdkit qemu-nbd mdadm
  netns_up 4
  local i
  URIS=()
  for i in 1 2 3 4; do
    truncate -s 48M "$SHM/m$i.img"
    member_start "$i"
    URIS+=("$(member_uri "$i")")
  done
  ARR=rr
  # Created over the network, from the host namespace.
  ip netns exec "$H" "$CAIRN" md create --level 6 --chunk 64K --raid-devices 4 \
    --bitmap-chunk 1M --name "$ARR" "${URIS[@]}" >"$WORK/create.txt" ||
    fail "md create over remote members: $(cat "$WORK/create.txt")"
  mdadm --examine "$SHM/m2.img" | grep -q "Checksum.*correct" || fail "mdadm: member 2 after create"
  serve_remote
  expect_contains "$(cat "$CAIRN_JSON")" "nbd://10.231.3.2/m3" "the announcement names the remote members"

  RUN=30
  start_fio
  sleep 3
  # 1. One member's host dies (nbdkit): the array goes on degraded.
  member_kill 2
  wait_for 15 "member 2 failed" faulty_count 1
  grep -q "^Fail|$(member_uri 2)|" "$EVENTS" || wait_for 5 "a Fail event" grep -q "^Fail|$(member_uri 2)|" "$EVENTS"
  "$CAIRN" status --control "$CTL" >"$WORK/status.txt"
  grep -q "$(member_uri 2).*faulty" "$WORK/status.txt" || fail "status does not show member 2 faulty: $(cat "$WORK/status.txt")"
  kill -0 "$FIO_PID" || fail "fio ended early"
  sleep 2
  # 2. It comes back: re-added, rebuilt from the bitmap only.
  member_start 2
  wait_for 40 "member 2 re-added and rebuilt" rebuilt
  grep -q "$(member_uri 2) answers again: .*re-added into role 1" "$CAIRN_LOG" ||
    fail "no re-add in the log: $(tail -5 "$CAIRN_LOG")"
  local worked chunk
  worked=$(api "$ARR" | jq .background.worked_bytes)
  chunk=$(api "$ARR" | jq .detail.bitmap.chunk_bytes)
  say "rebuilt $worked bytes of member 2 (bitmap chunk $chunk; fio writes the first 8 MiB of each member)"
  [ "$worked" -gt 0 ] || fail "nothing rebuilt"
  [ "$worked" -le $((9 * chunk)) ] || fail "rebuilt $worked bytes: more than the 8 (+1) bitmap chunks fio can dirty"
  # 3. Two gone at once (cairn and qemu-nbd): RAID6 still serves.
  member_kill 1
  member_kill 3
  wait_for 15 "members 1 and 3 failed" faulty_count 2
  kill -0 "$FIO_PID" || fail "fio ended with two members gone"
  fio_ok
  # Both come back and are rebuilt.
  member_start 1
  member_start 3
  wait_for 60 "members 1 and 3 re-added and rebuilt" bash -c "
    curl -s --unix-socket '$CTL' http://cairn/v1/arrays/$ARR |
      jq -e '.detail.state.degraded == false and (.background.state // \"\") != \"running\"' >/dev/null"
  local want
  want=$(nbdcopy "$URI" - | sha256sum | cut -d' ' -f1)
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"

  # 4. mdadm reads each member's data as its server returns it, and the array assembles
  # from local copies of the members with the same contents.
  for i in 1 2 3 4; do
    ip netns exec "$H" nbdcopy "$(member_uri "$i")" "$WORK/copy$i.img" ||
      fail "nbdcopy member $i"
    mdadm --examine "$WORK/copy$i.img" >"$WORK/ex$i.txt" || fail "mdadm --examine copy $i"
    grep -q "Checksum.*correct" "$WORK/ex$i.txt" || fail "member $i checksum: $(cat "$WORK/ex$i.txt")"
    grep -q "State : clean" "$WORK/ex$i.txt" || fail "member $i not clean: $(cat "$WORK/ex$i.txt")"
  done
  "$CAIRN" md detail --json "$WORK"/copy{1,2,3,4}.img |
    jq -e '.state.degraded == false and .state.clean == true' >/dev/null ||
    fail "the local copies do not assemble clean"
  local CTL_SAVE=$CTL
  start_cairn --no-control --read-only --md "$WORK/copy1.img,$WORK/copy2.img,$WORK/copy3.img,$WORK/copy4.img:local"
  expect_eq "$(nbdcopy "$(unix_uri local)" - | sha256sum | cut -d' ' -f1)" "$want" "data of the local copies"
  stop_cairn
  CTL=$CTL_SAVE

  # 5. Three of four gone: reads fail with an error, the server stays up and says why.
  serve_remote
  member_kill 1
  member_kill 2
  member_kill 4
  if nbdcopy "$URI" - >/dev/null 2>"$WORK/copy.err"; then
    fail "reading an array with three of four members gone succeeded"
  fi
  say "read with three members gone: $(head -1 "$WORK/copy.err")"
  kill -0 "$CAIRN_PID" || fail "cairn exited when the array failed: $(tail -5 "$CAIRN_LOG")"
  grep -qi "panic" "$CAIRN_LOG" && fail "panic: $(grep -i panic "$CAIRN_LOG")"
  api "$ARR" | jq -e '.detail.state.failed == true' >/dev/null ||
    fail "the array is not reported failed: $(api "$ARR" | jq -c '.detail.state, [.detail.members[] | .state]')"
  stop_cairn
  # Nothing the survivors hold was corrupted: bring the members back and the array
  # assembles (forced, as mdadm --assemble --force would) with the data written before.
  for i in 1 2 4; do member_start "$i"; done
  CAIRN_WRAP="ip netns exec $H" start_cairn --no-control --read-only --force \
    --md "$(IFS=,; echo "${URIS[*]}"):again"
  expect_eq "$(nbdcopy "$(unix_uri again)" - | sha256sum | cut -d' ' -f1)" "$want" "data after the total loss"
  stop_cairn
}

run_test raid6_members_on_other_hosts t_raid6_members_on_other_hosts
finish
