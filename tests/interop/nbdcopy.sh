#!/usr/bin/env bash
# nbdcopy round trips: 1 GiB of random data into an export and back out, byte-exact, over
# the Unix socket and over TCP, with nbdcopy's default multi-conn (4 connections, many
# requests in flight each). Everything lives in /dev/shm.
. "$(dirname "$0")/lib.sh"

SRC=$SHM/src.bin

# in: nbdcopy FILE -> export (--flush); the export's backing file must equal FILE.
# out: export -> nbdcopy -> file; it must equal FILE again.
roundtrip() { # TRANSPORT-FUNCTION
  local uri_of=$1 disk=$SHM/disk-$1.img out=$SHM/out-$1.bin
  need_tool nbdcopy cmp
  [ -s "$SRC" ] || random_file "$SRC" 1G
  truncate -s 1G "$disk"
  start_cairn "$disk:disk"
  local uri
  uri=$("$uri_of" disk)
  timeout 300 nbdcopy --flush "$SRC" "$uri"
  cmp "$SRC" "$disk" || fail "after nbdcopy into $uri the backing file differs from the source"
  timeout 300 nbdcopy "$uri" "$out"
  cmp "$SRC" "$out" || fail "nbdcopy out of $uri returned different bytes"
  rm -f "$out"
  # A single connection, synchronous requests: the other end of the concurrency range.
  timeout 300 nbdcopy --connections=1 --requests=1 --request-size=4194304 "$uri" "$out"
  cmp "$SRC" "$out" || fail "nbdcopy --connections=1 out of $uri returned different bytes"
  rm -f "$out" "$disk"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
}

t_unix() { roundtrip unix_uri; }
t_tcp() { roundtrip tcp_uri; }

# A sparse source over an export full of data: nbdcopy turns the holes into zero requests
# (WRITE_ZEROES), which must really zero the export.
t_sparse_source() {
  need_tool nbdcopy cmp
  random_file "$SHM/full.img" 64M
  truncate -s 64M "$SHM/sparse.bin"
  head -c 1M /dev/urandom | dd of="$SHM/sparse.bin" bs=1M seek=10 conv=notrunc status=none
  start_cairn "$SHM/full.img"
  timeout 120 nbdcopy --flush "$SHM/sparse.bin" "$(unix_uri full)"
  cmp "$SHM/sparse.bin" "$SHM/full.img" || fail "holes were not zeroed in the export"
}

run_test unix-1GiB t_unix
run_test tcp-1GiB t_tcp
run_test sparse-source t_sparse_source
finish
