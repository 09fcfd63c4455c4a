#!/usr/bin/env bash
# Online verify and invalidate of `cairn repl` (DRBD's `drbdadm verify` and `invalidate`)
# on two nodes in their own network namespaces. One 4 KiB block of the secondary's
# backing file is corrupted behind cairn's back; a verify on the primary, while a client
# keeps writing other blocks, finds exactly that block; a reconnect (or verify --resync)
# resyncs it and the replicas' data areas are equal. An invalidated secondary gets a
# full resync.
. "$(dirname "$0")/lib.sh"

TAG=rv$$
IP=([1]=10.233.1.1 [2]=10.233.1.2)

SIZE=${SIZE:-32M}
. "$INTEROP_DIR/repl_lib.sh"
BS=4096



# wait_event I KIND NEEDLE: node I's last KIND event contains NEEDLE.
wait_event() {
  local n m
  for n in $(seq 300); do
    m=$(last_event "$1" "$2")
    case $m in *"$3"*) return 0 ;; esac
    sleep 0.1
  done
  fail "node $1: no $2 event with '$3' (last: '$m')"
}

# corrupt_secondary BLOCK: node 2 is taken away, one 4 KiB block of its data area (at
# the start of its backing file) is overwritten behind cairn's back, and it comes back.
corrupt_secondary() {
  repl 1 disconnect >/dev/null
  node_down 2
  head -c "$BS" /dev/urandom | dd of="$SHM/n2.img" bs="$BS" seek="$1" conv=notrunc status=none
  node_up 2
  repl 1 connect >/dev/null
  wait_peer 1 Established
  wait_peer 2 Established
}

# same_data: the primary steps down (everything flushed), the data areas are compared,
# and it is primary again.
same_data() {
  repl 1 secondary >/dev/null
  cmp -n "$DATA" "$SHM/n1.img" "$SHM/n2.img" || fail "the replicas differ: $1"
  repl 1 primary >/dev/null
  wait_peer 1 Established
}

t_verify() {
  nodes_up
  node_up 1
  node_up 2
  repl 1 primary --force >/dev/null
  wait_peer 1 Established
  wait_peer 2 Established
  DATA=$(status_json 1 | jq -r .data_size)
  py -c 'import nbd, os, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for i in range(0, 32, 3): h.pwrite(os.urandom(1 << 20), i << 20)
h.flush(); h.shutdown()' "$(client_uri 1)"
  local out
  out=$(repl 2 verify 2>&1) && fail "verify on a secondary succeeded"
  expect_contains "$out" "runs on the primary" "verify on a secondary is refused"

  # 1. One block differs; a verify while a client writes elsewhere finds that one only.
  local bad=100
  corrupt_secondary $bad
  expect_eq "$(status_json 1 | jq -r '.peers[0].out_of_sync_bytes')" 0 "out of sync before the verify"
  local first
  first=$({ cmp -n "$DATA" "$SHM/n1.img" "$SHM/n2.img" || true; } | sed -n 's/.* byte \([0-9]*\),.*/\1/p')
  [ -n "$first" ] && [ $(((first - 1) / BS)) = $bad ] || fail "the corruption is not at block $bad: $first"
  py -c 'import nbd, os, random, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
while True: h.pwrite(os.urandom(4096), random.randrange(200, 8000) * 4096)' "$(client_uri 1)" >/dev/null 2>&1 &
  local wpid=$!
  register pid "$wpid"
  sleep 0.3
  local k v
  for k in 1 2 3; do
    out=$(repl 1 verify --wait)
    say "verify $k (a client writing meanwhile): $out"
    v=$(status_json 1 | jq -c '.peers[0].verify')
    expect_eq "$(jq -r .out_of_sync_blocks <<<"$v")" 1 "blocks found out of sync by verify $k"
  done
  stop_tree "$wpid"
  wait "$wpid" 2>/dev/null || true
  say "  $(last_event 1 verify-done)"
  expect_eq "$(jq -r .blocks_checked <<<"$v")" $((DATA / BS)) "blocks checked"
  expect_eq "$(jq -r .done_bytes <<<"$v")" "$DATA" "bytes verified"
  expect_eq "$(jq -r .running <<<"$v")" false "the verify's state"
  expect_eq "$(status_json 1 | jq -r '.peers[0].out_of_sync_bytes')" $BS "out of sync after the verify"
  expect_contains "$(last_event 1 verify-done)" "1 out of sync" "the verify-done event"
  expect_contains "$("$CAIRN" repl status home --control "$(ctl 1)")" "last verify" "status shows the verify"
  # Verify copied nothing; a reconnect resyncs the marked block only.
  cmp -s -n "$DATA" "$SHM/n1.img" "$SHM/n2.img" && fail "verify copied data"
  repl 1 disconnect >/dev/null
  repl 1 connect >/dev/null
  wait_peer 1 Established
  wait_event 1 resync-started "started: $BS bytes"
  same_data "after the resync of the verified block"

  # 2. verify --resync resyncs by itself.
  corrupt_secondary 300
  repl 1 verify --resync --wait >/dev/null
  expect_eq "$(status_json 1 | jq -r '.peers[0].verify.out_of_sync_blocks')" 1 "blocks found by verify --resync"
  wait_event 1 resync-done "resync to b done: $BS bytes"
  wait_peer 1 Established
  expect_eq "$(status_json 1 | jq -r '.peers[0].out_of_sync_bytes')" 0 "out of sync after verify --resync"
  same_data "after verify --resync"
  # A clean verify finds nothing.
  out=$(repl 1 verify --wait)
  expect_contains "$out" ", 0 out of sync" "a verify of equal replicas"

  # 3. invalidate: refused on the primary; on the secondary a full resync follows.
  out=$(repl 1 invalidate 2>&1) && fail "invalidate on the primary succeeded"
  expect_contains "$out" "is primary" "invalidate on the primary is refused"
  repl 2 invalidate >/dev/null
  expect_eq "$(status_json 2 | jq -r .disk)" Inconsistent "the invalidated node's disk"
  # The primary, idle (no client I/O), notices the dropped data connection by itself.
  wait_event 1 resync-started "full resync to b"
  wait_event 2 resync-started "full resync from a"
  wait_peer 1 Established
  wait_event 2 resync-done "resync from a done"
  expect_eq "$(status_json 2 | jq -r .disk)" UpToDate "the invalidated node's disk after the resync"
  say "invalidate: $(last_event 1 resync-started); $(last_event 1 resync-done)"
  same_data "after the full resync of the invalidated node"
}

run_test verify t_verify
finish
