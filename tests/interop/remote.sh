#!/usr/bin/env bash
# Disks on other machines: an md array whose members are NBD exports served from other
# network namespaces (real TCP over veth pairs) by cairn, nbdkit and qemu-nbd. Under fio
# verify=crc32c load, member servers are killed and brought back: the array goes on
# degraded (an event, `cairn status` says faulty), re-adds a member when its server
# answers again and rebuilds only what the write-intent bitmap marks; two members of a
# RAID6 may be gone; with three gone reads fail cleanly and nothing is corrupted. mdadm
# reads the members' data afterwards, and the array assembles from local copies of them.
# Also: the ownership rules over the network (a second owner refused, a paused one
# fenced, other data in a member's first 4 KiB left alone, a damaged owner record
# refusing the start) and a RAID6 whose member servers all require TLS with a PSK.
. "$(dirname "$0")/lib.sh"

# Short: interface names are at most 15 characters.
TAG=cr$$

# netns_up N: a namespace for the array host ($H) and one per member ($MNS[i]); member i
# is at 10.231.i.2, the host at 10.231.i.1 on the same veth pair.
netns_up() {
  ns_star "$1" 231 m MNS
}

# Which server serves member i: cairn, nbdkit or qemu-nbd in plaintext, or cairn-tls or
# nbdkit-tls requiring TLS with the pre-shared key of user alice in $PSK.
KIND=([1]=cairn [2]=nbdkit [3]=qemu-nbd [4]=cairn)
# member_uri I [PSK-FILE]: the URI of member I (nbds:// with a key file for a TLS kind).
member_uri() {
  case ${KIND[$1]} in
    *-tls) printf 'nbds://alice@10.231.%s.2/m%s?tls-psk-file=%s&tls-username=alice' "$1" "$1" "${2:-$PSK}" ;;
    *) printf 'nbd://10.231.%s.2/m%s' "$1" "$1" ;;
  esac
}

# psk_files: $PSK (user alice) and $WRONG_PSK (alice with another key), by psktool.
psk_files() {
  need_tool psktool
  PSK=$WORK/psk/keys.psk
  WRONG_PSK=$WORK/wrong/keys.psk
  mkdir -p "$WORK/psk" "$WORK/wrong"
  psktool -u alice -p "$PSK" >/dev/null
  psktool -u alice -p "$WRONG_PSK" >/dev/null
  chmod 600 "$PSK" "$WRONG_PSK"
}

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
    cairn-tls)
      # --tls require: allowed off loopback, nothing served before the TLS handshake.
      ip netns exec "${MNS[$i]}" "$CAIRN" serve --no-control --tls require --tls-psk "$PSK" \
        --listen "tcp:$ip:10809" "$file:m$i" >>"$log" 2>&1 &
      ;;
    nbdkit)
      ip netns exec "${MNS[$i]}" nbdkit -f -i "$ip" -p 10809 -e "m$i" file "$file" >>"$log" 2>&1 &
      ;;
    nbdkit-tls)
      ip netns exec "${MNS[$i]}" nbdkit -f -i "$ip" -p 10809 -e "m$i" --tls=require \
        --tls-psk="$PSK" file "$file" >>"$log" 2>&1 &
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
  # The failed owner did not release the members: a plain start is refused.
  for i in 1 2 4; do member_start "$i"; done
  if ip netns exec "$H" "$CAIRN" serve --no-control --listen "unix:$WORK/refused.sock" \
    --md "$(IFS=,; echo "${URIS[*]}"):again" >/dev/null 2>"$WORK/refused.err"; then
    fail "a start over unreleased members was not refused"
  fi
  expect_contains "$(cat "$WORK/refused.err")" "has not released it" "the refusal names the owner"
  # Nothing the survivors hold was corrupted: taken over with --force (the operator says
  # the old owner is gone), the array assembles as mdadm --assemble --force would, with
  # the data written before.
  CAIRN_WRAP="ip netns exec $H" start_cairn --no-control --force \
    --md "$(IFS=,; echo "${URIS[*]}"):again"
  expect_eq "$(nbdcopy "$(unix_uri again)" - | sha256sum | cut -d' ' -f1)" "$want" \
    "data after the total loss ($(tail -8 "$CAIRN_LOG"))"
  stop_cairn
}

# nbdkit_unix NAME FILE [FILTER-ARGS...]: nbdkit serving FILE as export NAME on a Unix
# socket in $WORK; sets NBD_URI. (Not in $(...): nbdkit started in a command substitution
# does not outlive it.)
nbdkit_unix() {
  local name=$1 file=$2 sock=$WORK/$1.sock
  shift 2
  # Options (--filter=...) go before the plugin, KEY=VALUE parameters after it.
  local opts=() params=() a
  for a in "$@"; do
    case $a in --*) opts+=("$a") ;; *) params+=("$a") ;; esac
  done
  rm -f "$sock"
  nbdkit -f -U "$sock" -e "$name" "${opts[@]}" file "$file" "${params[@]}" >>"$WORK/$name.log" 2>&1 &
  register pid $!
  local i
  for i in $(seq 100); do
    [ -S "$sock" ] && nbdinfo --size "nbd+unix:///$name?socket=$sock" >/dev/null 2>&1 && break
    sleep 0.1
  done
  NBD_URI="nbd+unix:///$name?socket=$sock"
}

# Every front end takes a URI where it takes a file: serve FILE, --luks (and the luks
# verbs), the lvm verbs and --lvm, scan, the config file and the control API.
t_uris_everywhere() {
  need_tool nbdkit nbdinfo nbdcopy jq curl
  local u i
  # serve URI: a remote export served again, written through, landing in the file.
  truncate -s 16M "$SHM/plain.img"
  nbdkit_unix plain "$SHM/plain.img"; u=$NBD_URI
  start_cairn "$u:again"
  random_file "$WORK/data" 1M
  nbdcopy "$WORK/data" "$(unix_uri again)"
  stop_cairn
  cmp -n 1048576 "$WORK/data" "$SHM/plain.img" || fail "serve URI: the data is not in the file"

  # LUKS on a remote export: formatted through the URI, opened with --luks.
  truncate -s 32M "$SHM/vol.img"
  printf %s "remote key" >"$WORK/key"
  nbdkit_unix vol "$SHM/vol.img"; u=$NBD_URI
  "$CAIRN" luks format -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$WORK/key" "$u" >/dev/null ||
    fail "luks format on a URI"
  cryptsetup luksDump "$SHM/vol.img" | grep -q "^Version:.*2" || fail "cryptsetup does not read the header written through the URI"
  start_cairn --key-file "$WORK/key" --luks "$u:sealed"
  nbdcopy "$WORK/data" "$(unix_uri sealed)"
  expect_eq "$(nbdcopy "$(unix_uri sealed)" - | head -c 1048576 | sha256sum)" "$(sha256sum <"$WORK/data")" "LUKS over a URI"
  stop_cairn

  # LVM on a remote PV: pvcreate, vgcreate, lvcreate through the URI; lvm reads the label.
  truncate -s 64M "$SHM/pv.img"
  nbdkit_unix pv "$SHM/pv.img"; u=$NBD_URI
  "$CAIRN" lvm pvcreate "$u" >/dev/null || fail "pvcreate on a URI"
  "$CAIRN" lvm vgcreate rvg "$u" >/dev/null || fail "vgcreate on a URI"
  "$CAIRN" lvm lvcreate -n one -L 8M rvg "$u" >/dev/null || fail "lvcreate on a URI"
  start_cairn --lvm "$u"
  expect_eq "$(nbdinfo --size "$(unix_uri rvg/one)")" 8388608 "the LV over a remote PV"
  stop_cairn

  # scan names the remote export and what it holds.
  "$CAIRN" scan --json "$u" >"$WORK/scan.json" || fail "scan of a URI: $(cat "$WORK/scan.json")"
  jq -e '[.. | strings | select(test("LVM2|lvm"))] | length > 0' "$WORK/scan.json" >/dev/null ||
    fail "scan does not see the PV behind the URI: $(cat "$WORK/scan.json")"

  # The config file and the control API: an md array on remote members.
  local M=()
  for i in 0 1 2; do
    truncate -s 32M "$SHM/c$i.img"
    nbdkit_unix "c$i" "$SHM/c$i.img"; M+=("$NBD_URI")
  done
  "$CAIRN" md create -l 5 -n 3 -c 64K --name cfgmd "${M[@]}" >/dev/null || fail "md create on URIs"
  {
    echo '[[export]]'
    echo 'name = "viaconfig"'
    printf 'md = ["%s", "%s", "%s"]\n' "${M[@]}"
  } >"$WORK/cairn.toml"
  start_cairn --config "$WORK/cairn.toml"
  nbdcopy "$WORK/data" "$(unix_uri viaconfig)"
  stop_cairn
  truncate -s 16M "$SHM/other.img"
  CTL=$WORK/api.sock
  start_cairn --control "$CTL" "$SHM/other.img"
  local body code
  body=$(printf '{"name": "viaapi", "stack": {"md": ["%s", "%s", "%s"]}}' "${M[@]}")
  code=$(curl -s -o "$WORK/api.json" -w '%{http_code}' --unix-socket "$CTL" -X POST \
    -H 'Content-Type: application/json' --data-binary "$body" http://cairn/v1/exports)
  expect_eq "$code" 201 "POST an md stack on URIs: $(cat "$WORK/api.json")"
  expect_eq "$(nbdcopy "$(unix_uri viaapi)" - | head -c 1048576 | sha256sum)" "$(sha256sum <"$WORK/data")" "the array added through the API"
  stop_cairn
}

# A member server that fails some reads (nbdkit's error filter, EIO on 10 % of reads) is a
# disk with bad sectors: each failed read is rebuilt from parity and rewritten, the member
# stays in the array, and fio verifies every byte.
t_bad_sectors_on_a_remote_member() {
  need_tool nbdkit nbdinfo fio jq curl
  local M=() i
  for i in 0 1 2; do truncate -s 48M "$SHM/b$i.img"; done
  nbdkit_unix b0 "$SHM/b0.img"; M+=("$NBD_URI")
  # Errors only while $WORK/inject exists: from the start of the load to its end.
  # Member 1 sees only some 150-200 reads (fio's verify pass): at 2 % a run met 1 to 8
  # errors and now and then none (the test then failed, "the filter did nothing"; 1 run in
  # 4 once); at 10 % five runs met 13 to 24, and a run without one is out of reach.
  nbdkit_unix b1 "$SHM/b1.img" --filter=error error-pread-rate=0.1 error=EIO \
    "error-pread-file=$WORK/inject"
  M+=("$NBD_URI")
  nbdkit_unix b2 "$SHM/b2.img"; M+=("$NBD_URI")
  "$CAIRN" md create -l 5 -n 3 -c 64K --name bad "${M[@]}" >/dev/null || fail "md create"
  CTL=$WORK/bad.sock
  ARR=bad
  start_cairn --control "$CTL" --md "$(IFS=,; echo "${M[*]}"):bad"
  URI=$(unix_uri bad)
  touch "$WORK/inject"
  fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --size=32M \
    --verify=crc32c --do_verify=1 --output-format=json --output="$WORK/fio.json" >"$WORK/fio.stdout" 2>"$WORK/fio.err" ||
    fail "fio: $(tail -5 "$WORK/fio.err")"
  rm -f "$WORK/inject"
  expect_eq "$(jq '[.jobs[].error] | add' "$WORK/fio.json")" 0 "fio errors"
  grep -q "rebuilding from parity after a read error" "$CAIRN_LOG" ||
    fail "no read error was met (the error filter did nothing?): $(tail -3 "$CAIRN_LOG")"
  say "read errors repaired: $(grep -c 'rebuilding from parity after a read error' "$CAIRN_LOG")"
  expect_eq "$(api bad | jq -r '[.detail.members[].state] | join(",")')" "active-sync,active-sync,active-sync" "members after repairs"
  stop_cairn
}

# One owner per array across hosts: while host A serves the array, a second start on the
# same members is refused; A is paused (SIGSTOP, a frozen VM), B takes the members over
# (--force: the operator says A is gone) and writes; when A wakes up, not one block it
# tries to write reaches the members (checked on the member files), and its client sees
# errors.
t_fencing_over_the_network() {
  need_tool nbdinfo nbdcopy jq
  netns_up 4
  KIND=([1]=cairn [2]=cairn [3]=cairn [4]=cairn)
  local i
  URIS=()
  for i in 1 2 3 4; do
    # Fresh files: an earlier test of this topic left its members under these names.
    rm -f "$SHM/m$i.img"
    truncate -s 32M "$SHM/m$i.img"
    member_start "$i"
    URIS+=("$(member_uri "$i")")
  done
  ip netns exec "$H" "$CAIRN" md create --level 5 --chunk 64K --raid-devices 4 --name fa \
    "${URIS[@]}" >/dev/null || fail "md create"
  ARR=fa
  CTL=$WORK/ctl.sock
  CAIRN_WRAP="ip netns exec $H" start_cairn --control "$CTL" --member-timeout 2 \
    --md "$(IFS=,; echo "${URIS[*]}"):fa"
  local A_PID=$CAIRN_PID A_URI
  A_URI=$(unix_uri fa)
  random_file "$WORK/a1" 1M
  nbdcopy "$WORK/a1" "$A_URI"
  # A second host is refused while A holds the members.
  if ip netns exec "$H" "$CAIRN" serve --no-control --listen "unix:$WORK/b0.sock" \
    --md "$(IFS=,; echo "${URIS[*]}"):fa" >/dev/null 2>"$WORK/b0.err"; then
    fail "a second owner was let in while the first serves"
  fi
  expect_contains "$(cat "$WORK/b0.err")" "has not released it" "the second start names the owner"
  say "second start refused: $(tail -1 "$WORK/b0.err" | cut -c1-160)"
  # A freezes; B takes over and writes.
  kill -STOP "$A_PID"
  CAIRN_WRAP="ip netns exec $H" start_cairn --no-control --force --md "$(IFS=,; echo "${URIS[*]}"):fb"
  local B_PID=$CAIRN_PID
  random_file "$WORK/b1" 2M
  nbdcopy "$WORK/b1" "$(unix_uri fb)"
  expect_eq "$(nbdcopy "$(unix_uri fb)" - | head -c 2097152 | sha256sum)" "$(sha256sum <"$WORK/b1")" "B's data"
  # B stops cleanly (releasing the members at its own generation); what the members
  # hold now must not change when A wakes.
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "B stops cleanly"
  local before
  before=$(sha256sum "$SHM"/m{1,2,3,4}.img)
  # A wakes up and tries to write.
  kill -CONT "$A_PID"
  random_file "$WORK/a2" 1M
  if nbdcopy "$WORK/a2" "$A_URI" 2>"$WORK/a2.err"; then
    nbdsh -u "$A_URI" -c 'h.flush()' 2>>"$WORK/a2.err" &&
      fail "the paused owner's writes and flush succeeded after it was fenced"
  fi
  say "the old owner's write: $(grep -m1 -i error "$WORK/a2.err" | cut -c1-160)"
  sleep 1
  expect_eq "$(sha256sum "$SHM"/m{1,2,3,4}.img)" "$before" "member bytes after the old owner woke up"
  grep -q "fenced" "$WORK/cairn1.log" || fail "A's log does not say it was fenced: $(tail -3 "$WORK/cairn1.log")"
  # B's data is on the members: a new owner reads it.
  CAIRN_WRAP="ip netns exec $H" start_cairn --no-control --md "$(IFS=,; echo "${URIS[*]}"):fc"
  expect_eq "$(nbdcopy "$(unix_uri fc)" - | head -c 2097152 | sha256sum)" "$(sha256sum <"$WORK/b1")" "B's data, read by the next owner"
  stop_cairn
  kill -TERM "$A_PID" 2>/dev/null || true
}

# members_up N: N fresh 32 MiB member files served as KIND says; sets URIS.
members_up() {
  local i
  URIS=()
  for i in $(seq 1 "$1"); do
    # Fresh files: an earlier test of this topic left its members under these names.
    rm -f "$SHM/m$i.img"
    truncate -s 32M "$SHM/m$i.img"
    member_start "$i"
    URIS+=("$(member_uri "$i")")
  done
}

# refused_start WHAT SERVE-ARGS...: `cairn serve` from the host namespace must exit non-zero
# (not hang, not serve); its stderr is left in $WORK/refused.err.
refused_start() {
  local what=$1 st=0
  shift
  timeout -k 5 60 ip netns exec "$H" "$CAIRN" serve --no-control \
    --listen "unix:$WORK/refused.sock" "$@" >/dev/null 2>"$WORK/refused.err" || st=$?
  [ "$st" -ne 0 ] || fail "$what: the array started"
  [ "$st" -ne 124 ] || fail "$what: cairn serve hung"
  say "$what: refused: $(tail -1 "$WORK/refused.err" | cut -c1-240)"
}

# docs/fencing.md's foreign-data rule: a member whose first 4 KiB hold other data (not an
# owner record, not zeros) takes part unfenced, with a warning, and nothing is written
# over that data, on cairn member servers (which refuse an owner token there) and on
# nbdkit alike; such a member whose server restarts is re-added like any other.
t_foreign_data_on_remote_members() {
  need_tool nbdinfo nbdcopy nbdkit jq curl mdadm
  netns_up 3
  KIND=([1]=cairn [2]=cairn [3]=nbdkit)
  members_up 3
  ARR=fd
  ip netns exec "$H" "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 \
    --bitmap-chunk 1M --name "$ARR" "${URIS[@]}" >/dev/null || fail "md create"
  # Other data before md's superblock at 4096 (an old boot loader, bytes mdadm did not
  # clear; md v1.2 never reads or writes there), put on the disks with their servers down.
  local i
  for i in 1 2 3; do
    member_kill "$i"
    random_file "$WORK/head$i" 4K
    dd if="$WORK/head$i" of="$SHM/m$i.img" conv=notrunc status=none
    member_start "$i"
  done
  mdadm --examine "$SHM/m1.img" | grep -q "Checksum.*correct" || fail "mdadm: member 1's superblock"
  expect_eq "$(ip netns exec "$H" "$CAIRN" md owner --json "$(member_uri 1)" | jq -r '.[0].state')" \
    foreign "cairn md owner on member 1"
  serve_remote
  for i in 1 2 3; do
    grep -qF "$(member_uri "$i"): its first 4 KiB hold other data (data that is not an owner record); no owner record is kept on it, so it is not fenced" "$CAIRN_LOG" ||
      fail "no foreign-data warning for member $i: $(cat "$CAIRN_LOG")"
  done
  # Not the warning for members that carry a record they cannot enforce: none is written.
  if grep -q "does not enforce owner generations" "$CAIRN_LOG"; then
    fail "a foreign member was treated as one that carries a record: $(cat "$CAIRN_LOG")"
  fi
  random_file "$WORK/d1" 8M
  nbdcopy "$WORK/d1" "$URI"
  expect_eq "$(nbdcopy "$URI" - | head -c 8M | sha256sum)" "$(sha256sum <"$WORK/d1")" "data through the array"
  # Member 1's server (cairn) dies and comes back: re-added without an owner token.
  member_kill 1
  wait_for 15 "member 1 failed" faulty_count 1
  random_file "$WORK/d2" 1M
  nbdcopy "$WORK/d2" "$URI"
  member_start 1
  wait_for 40 "member 1 re-added and rebuilt" rebuilt
  grep -F "$(member_uri 1) answers again: " "$CAIRN_LOG" | grep -q "re-added into role 0" ||
    fail "no re-add of member 1 in the log: $(tail -5 "$CAIRN_LOG")"
  { cat "$WORK/d2"; tail -c +$((1048576 + 1)) "$WORK/d1"; } >"$WORK/want"
  expect_eq "$(nbdcopy "$URI" - | head -c 8M | sha256sum)" "$(sha256sum <"$WORK/want")" "data after the re-add"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  for i in 1 2 3; do
    cmp -n 4096 "$WORK/head$i" "$SHM/m$i.img" || fail "the first 4 KiB of member $i changed"
  done
}

# damage_record FILE checksum|version: breaks the owner record at the start of FILE, so its
# checksum no longer matches (a flipped bit of the instance), or so a field is wrong
# (version 2) behind a checksum recomputed to match.
damage_record() {
  py - "$1" "$2" <<'EOF2'
import struct, sys
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
path, how = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    rec = bytearray(f.read(128))
    assert rec[:8] == b"CAIRNOWN", "no owner record to damage"
    if how == "checksum":
        rec[40] ^= 1
    else:
        rec[8:12] = struct.pack("<I", 2)
        rec[124:128] = struct.pack("<I", crc32c(bytes(rec[:124])))
    f.seek(0)
    f.write(rec)
EOF2
}

# A damaged owner record (the magic there, the rest wrong) is an error, never "never
# owned": the start is refused, with --force too, naming the member and what is wrong,
# and not one byte of any member changes. Zeroed by the operator, the array starts again.
t_damaged_owner_record_refuses_the_start() {
  need_tool nbdinfo nbdcopy jq curl
  netns_up 3
  KIND=([1]=cairn [2]=cairn [3]=cairn)
  members_up 3
  ARR=dr
  ip netns exec "$H" "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --name "$ARR" \
    "${URIS[@]}" >/dev/null || fail "md create"
  serve_remote
  random_file "$WORK/d1" 2M
  nbdcopy "$WORK/d1" "$URI"
  stop_cairn
  local i how want before
  for i in 1 2 3; do
    expect_eq "$(head -c 8 "$SHM/m$i.img")" CAIRNOWN "member $i's owner record after a clean stop"
  done
  for how in checksum version; do
    member_kill 2
    damage_record "$SHM/m2.img" "$how"
    member_start 2
    case $how in
      checksum) want="damaged owner record: checksum 0x" ;;
      version) want="damaged owner record: version 2 is not 1" ;;
    esac
    expect_eq "$(ip netns exec "$H" "$CAIRN" md owner --json "$(member_uri 2)" | jq -r '.[0].state')" \
      damaged "cairn md owner on member 2 ($how)"
    before=$(sha256sum "$SHM"/m{1,2,3}.img)
    refused_start "record damaged ($how)" --md "$(IFS=,; echo "${URIS[*]}"):$ARR"
    expect_contains "$(cat "$WORK/refused.err")" "$(member_uri 2): $want" "the refusal names the member and the damage"
    expect_contains "$(cat "$WORK/refused.err")" "cairn md owner" "the refusal says how to look"
    refused_start "record damaged ($how), --force" --force --md "$(IFS=,; echo "${URIS[*]}"):$ARR"
    expect_contains "$(cat "$WORK/refused.err")" "$(member_uri 2): $want" "the refusal with --force"
    expect_eq "$(sha256sum "$SHM"/m{1,2,3}.img)" "$before" "member bytes after the refused starts ($how)"
  done
  grep -q "owner record is damaged" "$WORK/m2.log" ||
    fail "member server 2 does not say its record is damaged: $(tail -3 "$WORK/m2.log")"
  # The operator zeroes the record on the disk host: the array starts with its data.
  member_kill 2
  dd if=/dev/zero of="$SHM/m2.img" bs=4096 count=1 conv=notrunc status=none
  member_start 2
  serve_remote
  expect_eq "$(nbdcopy "$URI" - | head -c 2M | sha256sum)" "$(sha256sum <"$WORK/d1")" "data after the record was zeroed"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
}

# An array over nbds:// members: every member server requires TLS with a pre-shared key
# (three cairn, one nbdkit), each in its own network namespace. Created with `md create` on
# the URIs, served, written and read back byte-exact; a cairn and then the nbdkit member
# server killed and brought back: re-added over TLS, rebuilt from the bitmap only, and the
# two re-added members alone hold the data. A wrong key on one member URI is a clear error
# at start that changes nothing; the clean stop released the members over TLS, so the next
# start needs no --force.
t_raid6_over_tls_members() {
  need_tool nbdinfo nbdcopy nbdkit jq curl psktool
  psk_files
  netns_up 4
  KIND=([1]=cairn-tls [2]=cairn-tls [3]=nbdkit-tls [4]=cairn-tls)
  members_up 4
  local i
  # Plaintext gets nothing from a member server.
  for i in 1 3; do
    if ip netns exec "$H" nbdinfo --size "nbd://10.231.$i.2/m$i" >/dev/null 2>&1; then
      fail "member $i (${KIND[$i]}) answered a plaintext client"
    fi
  done
  ARR=tr
  ip netns exec "$H" "$CAIRN" md create --level 6 --chunk 64K --raid-devices 4 \
    --bitmap-chunk 1M --name "$ARR" "${URIS[@]}" >"$WORK/create.txt" ||
    fail "md create over nbds:// members: $(cat "$WORK/create.txt")"
  serve_remote
  random_file "$WORK/d1" 24M
  nbdcopy "$WORK/d1" "$URI"
  expect_eq "$(nbdcopy "$URI" - | head -c 24M | sha256sum)" "$(sha256sum <"$WORK/d1")" "data through the array"
  cp "$WORK/d1" "$WORK/want"
  local chunk worked role size
  chunk=$(api "$ARR" | jq .detail.bitmap.chunk_bytes)
  # Member 1 (cairn) and then member 3 (nbdkit) go away; the array is written degraded
  # (each time the first SIZE of the array, SIZE/2 of each member: 2 or 1 bitmap chunks);
  # the member comes back over TLS and only what the bitmap marks is rebuilt.
  for i in 1 3; do
    role=$((i - 1))
    size=$(((5 - i) << 20))
    member_kill "$i"
    wait_for 15 "member $i failed" faulty_count 1
    random_file "$WORK/w$i" "$size"
    nbdcopy "$WORK/w$i" "$URI"
    dd if="$WORK/w$i" of="$WORK/want" conv=notrunc status=none
    member_start "$i"
    wait_for 40 "member $i re-added and rebuilt" rebuilt
    grep -F "$(member_uri "$i") answers again: " "$CAIRN_LOG" | grep -q "re-added into role $role" ||
      fail "no re-add of member $i in the log: $(tail -5 "$CAIRN_LOG")"
    worked=$(api "$ARR" | jq .background.worked_bytes)
    say "member $i (${KIND[$i]}): rebuilt $worked bytes (bitmap chunk $chunk)"
    [ "$worked" -gt 0 ] || fail "nothing rebuilt on member $i"
    [ "$worked" -le $(((size / 2 / chunk + 1) * chunk)) ] ||
      fail "member $i: rebuilt $worked bytes, more than the bitmap chunks written while it was gone"
  done
  expect_eq "$(nbdcopy "$URI" - | head -c 24M | sha256sum)" "$(sha256sum <"$WORK/want")" "data after both re-adds"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  # The two re-added members alone (RAID6 runs on two of four), read-only from the files.
  start_cairn --no-control --read-only \
    --md "$SHM/m1.img,$WORK/gone2.img,$SHM/m3.img,$WORK/gone4.img:rebuilt"
  expect_eq "$(nbdcopy "$(unix_uri rebuilt)" - | head -c 24M | sha256sum)" "$(sha256sum <"$WORK/want")" \
    "data on the re-added members 1 and 3 alone"
  stop_cairn

  # A wrong key for one member (cairn, then nbdkit): a clear error at start, no member
  # byte changed.
  local before bad
  before=$(sha256sum "$SHM"/m{1,2,3,4}.img)
  for i in 2 3; do
    bad=("${URIS[@]}")
    bad[$((i - 1))]=$(member_uri "$i" "$WRONG_PSK")
    refused_start "wrong PSK for member $i (${KIND[$i]})" --md "$(IFS=,; echo "${bad[*]}"):$ARR"
    expect_contains "$(cat "$WORK/refused.err")" "${bad[$((i - 1))]}: its server refuses this host" "the refusal names the member"
    expect_contains "$(cat "$WORK/refused.err")" 'the server did not accept the key of PSK user "alice"' "the refusal says why"
  done
  grep -q "TLS handshake failed" "$WORK/m2.log" || fail "member server 2 did not log the handshake: $(tail -3 "$WORK/m2.log")"
  expect_eq "$(sha256sum "$SHM"/m{1,2,3,4}.img)" "$before" "member bytes after the refused starts"
  # The clean stop released every member over TLS: a plain start takes them over.
  serve_remote
  expect_eq "$(nbdcopy "$URI" - | head -c 24M | sha256sum)" "$(sha256sum <"$WORK/want")" "data on the next start"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
}

# idle_api CTL ARRAY: whether the served array has no dirty bitmap bit (bits clear once
# idle for 5 s; safe mode marked it clean 200 ms after the last write).
idle_api() {
  [ "$(curl -s --unix-socket "$1" "http://cairn/v1/arrays/$2" | jq -r .detail.bitmap.dirty)" = 0 ]
}

# A disk host restored from an old snapshot (issue 30): a RAID1 on two nbdkit members
# (Unix sockets), 1 MiB bitmap chunks. Data written, idle; member 1's export file copied;
# 8 MiB X written, idle (bits cleared, clean); member 1's server killed, a write fails it;
# its file replaced by the old copy and the server restarted: the supervisor re-adds it
# by itself, as a full recovery (logged), and 64 reads of X (both mirrors in turn) all
# return X.
t_stale_copy_on_a_member_server() {
  need_tool nbdkit nbdinfo nbdsh jq curl mdadm
  local M=() i pid1 ctl=$WORK/sc.sock
  for i in 0 1; do truncate -s 32M "$SHM/sc$i.img"; done
  nbdkit_unix sc0 "$SHM/sc0.img"; M+=("$NBD_URI")
  nbdkit_unix sc1 "$SHM/sc1.img"; M+=("$NBD_URI"); pid1=$!
  "$CAIRN" md create -l 1 -n 2 --bitmap-chunk 1M --name sc "${M[@]}" >/dev/null || fail "md create"
  random_file "$WORK/a" 8M
  random_file "$WORK/x" 8M
  start_cairn --control "$ctl" --member-timeout 2 --md "$(IFS=,; echo "${M[*]}"):sc"
  local uri
  uri=$(unix_uri sc)
  A=$WORK/a nbdsh -u "$uri" -c 'import os; h.pwrite(open(os.environ["A"], "rb").read(), 4 << 20); h.flush()'
  wait_for 30 "idle after the first data" idle_api "$ctl" sc
  cp --sparse=always "$SHM/sc1.img" "$SHM/sc1.old"
  X=$WORK/x nbdsh -u "$uri" -c 'import os; h.pwrite(open(os.environ["X"], "rb").read(), 4 << 20); h.flush()'
  wait_for 30 "idle after X" idle_api "$ctl" sc
  kill -KILL "$pid1"
  wait "$pid1" 2>/dev/null || true
  # A write outside X meets the dead server: member 1 fails.
  nbdsh -u "$uri" -c 'h.pwrite(b"\x77" * 4096, 20 << 20); h.flush()' || fail "write with a member gone"
  wait_for 15 "member 1 failed" grep -q "sc1.*is now out of the array" "$CAIRN_LOG"
  cp --sparse=always "$SHM/sc1.old" "$SHM/sc1.img"
  nbdkit_unix sc1 "$SHM/sc1.img"
  wait_for 60 "re-added by the supervisor" grep -q "answers again" "$CAIRN_LOG"
  local readded
  readded=$(grep "answers again" "$CAIRN_LOG" | tail -1)
  say "$readded"
  local st
  for i in $(seq 300); do
    st=$(curl -s --unix-socket "$ctl" "http://cairn/v1/arrays/sc" |
      jq -r '"\(.background.action) \(.background.state) \(.detail.state.degraded)"')
    [ "$st" = "recovery finished false" ] && break
    sleep 0.1
  done
  expect_eq "$st" "recovery finished false" "rebuilt"
  local bad
  bad=$(X=$WORK/x nbdsh -u "$uri" -c '
import os
x = open(os.environ["X"], "rb").read()
n = 128 << 10
print(sum(h.pread(n, (4 << 20) + i * n) != x[i * n:(i + 1) * n] for i in range(64)))')
  expect_eq "$bad" 0 "reads of X returning old data"
  expect_contains "$readded" "full recovery" "the old snapshot is rebuilt in full"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
}

# One member server that takes the connection and the handshake but never answers a
# request (nbdkit's delay filter, an hour per read and write), then one that reports too
# small a size: `serve --md` starts degraded within a few member timeouts, naming the
# member ("did not answer within 2 s" / "too small"), and the data reads back.
t_silent_member_server() {
  need_tool nbdkit nbdinfo nbdcopy jq curl
  local M=() i ctl=$WORK/sl.sock
  for i in 0 1 2; do truncate -s 24M "$SHM/sl$i.img"; done
  for i in 0 1 2; do nbdkit_unix "sl$i" "$SHM/sl$i.img"; M+=("$NBD_URI"); done
  local pid2=$!
  "$CAIRN" md create -l 5 -n 3 -c 64K --name sl "${M[@]}" >/dev/null || fail "md create"
  random_file "$WORK/d" 8M
  start_cairn --control "$ctl" --member-timeout 2 --md "$(IFS=,; echo "${M[*]}"):sl"
  nbdcopy "$WORK/d" "$(unix_uri sl)"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  kill "$pid2"; wait "$pid2" 2>/dev/null || true
  nbdkit_unix sl2 "$SHM/sl2.img" --filter=delay delay-read=3600 delay-write=3600
  local silent=$! t0 t1
  t0=$(date +%s)
  start_cairn --control "$ctl" --member-timeout 2 --md "$(IFS=,; echo "${M[*]}"):sl"
  t1=$(date +%s)
  say "started in $((t1 - t0)) s with a silent member"
  [ $((t1 - t0)) -le 9 ] || fail "the start took $((t1 - t0)) s"
  expect_contains "$(cat "$CAIRN_LOG")" "${M[2]}: not reached: its server took the connection but did not answer within 2 s" "the silent member named"
  expect_contains "$(cat "$CAIRN_LOG")" "running DEGRADED" "degraded start"
  expect_eq "$(nbdcopy "$(unix_uri sl)" - | head -c 8M | sha256sum)" "$(sha256sum <"$WORK/d")" "data without the silent member"
  stop_cairn
  kill -KILL "$silent"; wait "$silent" 2>/dev/null || true
  # Too small: the same file cut to 8 MiB behind nbdkit's truncate filter.
  nbdkit_unix sl2 "$SHM/sl2.img" --filter=truncate truncate=8M
  silent=$!
  start_cairn --control "$ctl" --member-timeout 2 --md "$(IFS=,; echo "${M[*]}"):sl"
  expect_contains "$(cat "$CAIRN_LOG")" "too small" "the small member named"
  expect_contains "$(cat "$CAIRN_LOG")" "running DEGRADED" "degraded start"
  expect_eq "$(nbdcopy "$(unix_uri sl)" - | head -c 8M | sha256sum)" "$(sha256sum <"$WORK/d")" "data without the small member"
  stop_cairn
  kill "$silent"; wait "$silent" 2>/dev/null || true
}

run_test raid6_members_on_other_hosts t_raid6_members_on_other_hosts
run_test uris_everywhere t_uris_everywhere
run_test bad_sectors_on_a_remote_member t_bad_sectors_on_a_remote_member
run_test fencing_over_the_network t_fencing_over_the_network
run_test foreign_data_on_remote_members t_foreign_data_on_remote_members
run_test damaged_owner_record_refuses_the_start t_damaged_owner_record_refuses_the_start
run_test raid6_over_tls_members t_raid6_over_tls_members
run_test stale_copy_on_a_member_server t_stale_copy_on_a_member_server
run_test silent_member_server t_silent_member_server
finish
