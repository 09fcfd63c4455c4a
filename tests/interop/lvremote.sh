#!/usr/bin/env bash
# An LVM RAID1 LV over remote PVs survives one disk host (issue 30 item 1): two disk
# hosts in their own network namespaces serve one file each (`cairn serve`), a third
# namespace joins them with `cairn lvm pvcreate/vgcreate/lvcreate --type raid1 -m 1` over
# nbd:// PVs and serves the LVs (`serve --lvm`): ext4 on one (nbdfuse + loop), a writer
# logging acknowledged writes on the other. Disk host 2 is killed: every acknowledged
# write reads back, ext4 stays writable and a file written during the outage is intact,
# `cairn status` (text and JSON) shows the LVs degraded and PV 2 faulty with the image
# named. Host 2 comes back: each image is re-added from its bitmap (rebuilt bytes within
# the regions written meanwhile, not the whole LV), status healthy, e2fsck -fn clean,
# and each PV file alone holds the same LVs.
. "$(dirname "$0")/lib.sh"

TAG=lv$$

# netns_up: the joining host ($H) and a disk host per PV ($DNS[i]); disk host i is at
# 10.233.i.2, the joining host at 10.233.i.1 on the same veth pair.
netns_up() {
  need_tool nsenter
  ns_star 2 233 d DNS
}

# in_ns NS COMMAND...: runs COMMAND in network namespace NS only. Not `ip netns exec`,
# which also gives COMMAND a copy of the mounts: a server started while ext4 is mounted
# would hold the filesystem (and its loop device) for as long as it runs.
in_ns() {
  local ns=$1
  shift
  nsenter "--net=/run/netns/$ns" "$@"
}

pv_uri() { printf 'nbd://10.233.%s.2/e%s' "$1" "$1"; }

# disk_start I: serves $SHM/eI.img as export eI from disk host I; sets DPID[I].
disk_start() {
  local i=$1 log=$WORK/d$1.log n
  # nsenter itself (not a function: $! must be the server's PID) execs the server.
  nsenter "--net=/run/netns/${DNS[$i]}" "$CAIRN" serve --no-control --insecure-no-tls \
    --listen "tcp:10.233.$i.2:10809" "$SHM/e$i.img:e$i" >>"$log" 2>&1 &
  DPID[$i]=$!
  register pid "${DPID[$i]}"
  for n in $(seq 100); do
    in_ns "$H" "$CAIRN" nbd info "$(pv_uri "$i")" >/dev/null 2>&1 && return 0
    kill -0 "${DPID[$i]}" 2>/dev/null || fail "disk host $i exited: $(cat "$log")"
    sleep 0.1
  done
  fail "disk host $i does not answer: $(cat "$log")"
}

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

status_json() { "$CAIRN" status --control "$CTL" --json >"$WORK/status.json"; }
# The state of every node whose path or name is $1, one a line.
node_states() {
  status_json
  jq -r --arg n "$1" '[.. | objects | select(has("state") and ((.path? == $n) or (.name? == $n)))] | .[].state' \
    "$WORK/status.json"
}
lv_healthy() { [ "$(node_states "$1" | sort -u)" = active ]; }
both_readded() {
  [ "$(grep -c "re-added into role 1" "$CAIRN_LOG")" -ge 2 ] && lv_healthy vgab/fs && lv_healthy vgab/raw &&
    [ "$(node_states "$(pv_uri 2)" | sort -u)" = active ]
}

t_raid1_lv_survives_a_disk_host() {
  need_fuse
  need_tool jq curl nbdcopy nbdinfo mkfs.ext4 e2fsck losetup mount umount sha256sum
  /usr/bin/python3 -c 'import nbd' 2>/dev/null || skip "python3-libnbd is not installed"
  netns_up
  local U1 U2 i
  for i in 1 2; do
    truncate -s 256M "$SHM/e$i.img"
    disk_start "$i"
  done
  U1=$(pv_uri 1)
  U2=$(pv_uri 2)
  ip netns exec "$H" "$CAIRN" lvm pvcreate "$U1" "$U2" >/dev/null || fail "pvcreate"
  ip netns exec "$H" "$CAIRN" lvm vgcreate vgab "$U1" "$U2" >/dev/null || fail "vgcreate"
  ip netns exec "$H" "$CAIRN" lvm lvcreate --type raid1 -m 1 -n fs -L 128M --devices "$U1,$U2" vgab ||
    fail "lvcreate fs"
  ip netns exec "$H" "$CAIRN" lvm lvcreate --type raid1 -m 1 -n raw -L 32M --devices "$U1,$U2" vgab ||
    fail "lvcreate raw"
  CTL=$WORK/ctl.sock
  EVENTS=$WORK/events.log
  : >"$EVENTS"
  CAIRN_WRAP="nsenter --net=/run/netns/$H" start_cairn --control "$CTL" --member-timeout 2 \
    --on-event "echo \"\$CAIRN_EVENT|\$CAIRN_MEMBER|\$CAIRN_MESSAGE\" >>$EVENTS" \
    --lvm "$U1,$U2"
  local FS RAW
  FS=$(unix_uri vgab/fs)
  RAW=$(unix_uri vgab/raw)
  expect_eq "$(node_states vgab/fs | sort -u)" active "the fs LV before"

  # ext4 with a file, idle long enough for the bitmap to clear what mkfs dirtied.
  local mnt=$WORK/mnt
  mkdir -p "$mnt"
  attach_export "$FS"
  timeout -k 5 60 mkfs.ext4 -q -F "$LOOP" || fail "mkfs.ext4"
  timeout -k 5 30 mount "$LOOP" "$mnt" || fail "mount"
  register mount "$mnt"
  random_file "$WORK/f1" $((4 << 20))
  cp "$WORK/f1" "$mnt/f1"
  sync
  sleep 7

  # Disk host 2 dies while the writer's acknowledged writes (16 MiB of the raw LV) are
  # in flight.
  local seed=$((RANDOM * 32768 + RANDOM))
  say "writer seed $seed"
  /usr/bin/python3 "$INTEROP_DIR/acked_writes.py" write "$RAW" "$seed" 4096 4096 8 "$WORK/acked.log" \
    >"$WORK/writer.out" 2>&1 &
  local wpid=$!
  register pid "$wpid"
  sleep 0.05
  kill -KILL "${DPID[2]}"
  wait "${DPID[2]}" 2>/dev/null || true
  say "killed disk host 2"
  wait "$wpid" || fail "the writer failed: $(cat "$WORK/writer.out")"
  say "writer: $(cat "$WORK/writer.out")"
  # A file written during the outage, through ext4 (which must stay writable).
  random_file "$WORK/f2" $((4 << 20))
  cp "$WORK/f2" "$mnt/f2" || fail "writing f2 during the outage: $(dmesg 2>/dev/null | tail -3)"
  sync || fail "sync during the outage"
  grep -qw ro <(findmnt -no OPTIONS "$mnt") && fail "ext4 went read-only: $(findmnt -no OPTIONS "$mnt")"
  echo 3 >/proc/sys/vm/drop_caches
  expect_eq "$(sha256sum <"$mnt/f1")" "$(sha256sum <"$WORK/f1")" "f1 during the outage"
  expect_eq "$(sha256sum <"$mnt/f2")" "$(sha256sum <"$WORK/f2")" "f2 during the outage"
  /usr/bin/python3 "$INTEROP_DIR/acked_writes.py" check "$RAW" "$seed" 4096 "$WORK/acked.log" ||
    fail "acknowledged writes lost during the outage"
  say "$(wc -l <"$WORK/acked.log") acknowledged writes read back during the outage"

  # Status says which image and PV failed, and why.
  wait_for 10 "PV 2 shown faulty" eval '[ "$(node_states "$U2" | sort -u)" = faulty ]'
  local st
  st=$("$CAIRN" status --control "$CTL")
  say "$st"
  grep -Eq "lv vgab/fs  128 MiB  raid1  [a-z]+, degraded" <<<"$st" || fail "status: the fs LV not shown degraded"
  expect_contains "$st" "$U2  256 MiB  faulty (since" "status: PV 2 faulty"
  expect_contains "$st" "image vgab/fs_rimage_1 failed" "status: the failed image named"
  expect_eq "$(node_states "$U1" | sort -u)" active "PV 1 during the outage"
  jq -e --arg n "$U2" '[.. | objects | select(.path? == $n) | .failure.reason] | all(test("rimage_1 failed"))' \
    "$WORK/status.json" >/dev/null || fail "status --json: no failure reason on PV 2: $(cat "$WORK/status.json")"
  # The control API: the LV's array names the failed image, its state and why.
  curl -s --unix-socket "$CTL" http://cairn/v1/arrays >"$WORK/arrays.json"
  expect_eq "$(jq -r '.arrays[] | select(.name == "vgab/fs") | .detail.members[] |
      select(.name == "vgab/fs_rimage_1") | .state' "$WORK/arrays.json")" faulty "/v1/arrays: image 1 of vgab/fs"
  expect_eq "$(jq -r '.arrays[] | select(.name == "vgab/fs") | .detail.members[] |
      select(.name == "vgab/fs_rimage_0") | .state' "$WORK/arrays.json")" active-sync "/v1/arrays: image 0 of vgab/fs"
  grep -q "^Fail|vgab/fs_rimage_1|" "$EVENTS" || fail "no Fail event for vgab/fs_rimage_1: $(cat "$EVENTS")"
  grep -q "^Fail|vgab/fs_rimage_0|" "$EVENTS" && fail "image 0 failed too: $(cat "$EVENTS")"

  # Host 2 returns: each image re-added from its bitmap.
  disk_start 2
  wait_for 60 "both images re-added and rebuilt" both_readded
  grep "re-added into role 1" "$CAIRN_LOG" | tee "$WORK/readd.txt"
  local fs_bytes raw_bytes
  fs_bytes=$(grep "vgab/fs_rimage_1 re-added" "$WORK/readd.txt" | grep -o 'only the [0-9]* bytes' | grep -o '[0-9]*')
  raw_bytes=$(grep "vgab/raw_rimage_1 re-added" "$WORK/readd.txt" | grep -o 'only the [0-9]* bytes' | grep -o '[0-9]*')
  [ -n "$fs_bytes" ] && [ -n "$raw_bytes" ] || fail "not re-added from the bitmap: $(cat "$WORK/readd.txt")"
  # fs: f2 (4 MiB), the journal and ext4's metadata, in 2 MiB regions: far less than
  # the 128 MiB LV. raw: the writer's 16 MiB (8 regions) at most.
  [ "$fs_bytes" -gt 0 ] && [ "$fs_bytes" -le $((48 << 20)) ] || fail "fs: $fs_bytes bytes rebuilt"
  [ "$raw_bytes" -le $((16 << 20)) ] || fail "raw: $raw_bytes bytes rebuilt of 32 MiB"
  say "rebuilt: fs $fs_bytes bytes of 128 MiB, raw $raw_bytes bytes of 32 MiB"
  "$CAIRN" status --control "$CTL"

  /usr/bin/python3 "$INTEROP_DIR/acked_writes.py" check "$RAW" "$seed" 4096 "$WORK/acked.log" ||
    fail "acknowledged writes lost after the return"
  timeout -k 5 30 umount "$mnt"
  timeout -k 5 120 e2fsck -fn "$LOOP" >"$WORK/fsck.txt" 2>&1 || fail "e2fsck -fn: $(cat "$WORK/fsck.txt")"
  say "e2fsck -fn: clean"
  losetup -d "$LOOP"
  # The loop device lets go of the nbdfuse file asynchronously (asked by file: another
  # test may take the freed device at once). It never does while a process that entered
  # a network namespace with `ip netns exec` during the mount holds a copy of it (another
  # test running beside this one): then FUSE is detached lazily, as a dead volume is.
  local n
  for n in $(seq 50); do
    [ -z "$(losetup -j "$WORK/fuse/nbd")" ] && break
    sleep 0.2
  done
  fusermount3 -u "$WORK/fuse" 2>/dev/null || {
    say "note: the loop device is still held elsewhere; FUSE detached lazily"
    fusermount3 -uz "$WORK/fuse"
  }
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "clean stop"
  for i in 1 2; do kill "${DPID[$i]}"; wait "${DPID[$i]}" 2>/dev/null || true; done

  # Each PV file alone (the other left out, read-only) holds the same LVs.
  local lv pv sums=()
  for pv in 1 2; do
    start_cairn --read-only --no-control --lvm "$SHM/e$pv.img"
    for lv in fs raw; do
      sums+=("$lv $(nbdcopy "$(unix_uri "vgab/$lv")" - | sha256sum)")
    done
    stop_cairn
  done
  expect_eq "${sums[0]}" "${sums[2]}" "the fs LV from PV 1 and from PV 2"
  expect_eq "${sums[1]}" "${sums[3]}" "the raw LV from PV 1 and from PV 2"
}

run_test raid1_lv_survives_a_disk_host t_raid1_lv_survives_a_disk_host
finish
