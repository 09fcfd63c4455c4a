#!/usr/bin/env bash
# fio's nbd engine with crc32c verification: several jobs, each its own connection, many
# requests in flight, over the Unix socket and TCP.
. "$(dirname "$0")/lib.sh"

# fio_nbd URI ARGS...: one fio run against an export; fails the test on any verify error.
fio_nbd() {
  local uri=$1
  shift
  timeout 300 fio --output-format=terse --terse-version=3 --ioengine=nbd --uri="$uri" \
    --verify=crc32c --verify_state_save=0 --do_verify=1 --verify_fatal=1 --group_reporting "$@" >"$WORK/fio.out" 2>&1 ||
    { cat "$WORK/fio.out"; fail "fio $* failed"; }
  # terse v3: field 6 = read KiB, 7 = read bw, 47 = written KiB, 48 = write bw (KiB/s).
  awk -F';' '/^3;/ {printf "NOTE: read %d MiB at %d MiB/s, wrote %d MiB at %d MiB/s\n", $6/1024, $7/1024, $47/1024, $48/1024}' "$WORK/fio.out"
}

# 4 jobs = 4 connections, each writing its own 64 MiB region at random and verifying it.
t_multiconn_unix() {
  need_tool fio
  truncate -s 512M "$SHM/disk.img"
  start_cairn "$SHM/disk.img"
  fio_nbd "$(unix_uri disk)" --name=multi --rw=randwrite --bs=4k --iodepth=16 --numjobs=4 \
    --size=64M --offset_increment=64M
}

# Mixed reads and writes of varying sizes with a skewed distribution, verifying as it goes.
t_mixed_tcp() {
  need_tool fio
  truncate -s 512M "$SHM/disk.img"
  start_cairn "$SHM/disk.img"
  fio_nbd "$(tcp_uri disk)" --name=mixed --rw=randrw --bsrange=4k-64k --size=256M \
    --iodepth=32 --verify_backlog=1024 --random_distribution=zipf:2.0 --numjobs=2 \
    --offset_increment=256M
}

# Large sequential writes (1 MiB, 8 in flight) then read back and verify: payloads near the
# preferred and maximum sizes.
t_sequential_big_blocks() {
  need_tool fio
  truncate -s 512M "$SHM/disk.img"
  start_cairn "$SHM/disk.img"
  fio_nbd "$(unix_uri disk)" --name=seq --rw=write --bs=1M --iodepth=8 --size=512M
  fio_nbd "$(tcp_uri disk)" --name=seq4m --rw=write --bs=4M --iodepth=4 --size=256M
}

run_test multiconn-unix t_multiconn_unix
run_test mixed-tcp t_mixed_tcp
run_test sequential-big-blocks t_sequential_big_blocks
finish
