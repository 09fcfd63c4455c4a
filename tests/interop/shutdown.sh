#!/usr/bin/env bash
# Graceful shutdown: SIGTERM while clients write. cairn must answer what it has received,
# flush, and exit 0; every write a client saw acknowledged must be in the file.
. "$(dirname "$0")/lib.sh"

MiB=$((1 << 20))

# A client that writes 64 KiB blocks one at a time (each tagged with its index) and logs
# each index once the server has acknowledged it, until the connection fails.
WRITER='
import nbd, struct, sys, time
log = open(LOG, "w")
base, n = 128 << 20, 2048
last = "none"
for i in range(n):
    block = struct.pack(">Q", i) * 8192
    try:
        h.pwrite(block, base + i * 65536)
    except nbd.Error as e:
        last = f"{e.errno}: {e.string}"
        break
    log.write(f"{i}\n"); log.flush()
    time.sleep(0.003)
print(f"writer stopped after {i} acknowledged writes; last error: {last}")
'

t_sigterm_under_load() {
  need_tool fio nbdsh
  local disk=$SHM/disk.img
  truncate -s 512M "$disk"
  start_cairn "$disk"
  # Region A [0, 128M): written completely before the signal, by fio with verify headers.
  timeout 120 fio --name=before --ioengine=nbd --uri="$(unix_uri disk)" --rw=write --bs=1M \
    --iodepth=8 --size=128M --verify=crc32c --verify_state_save=0 --do_verify=0 --output=/dev/null
  # Region C [256M, 512M): fio keeps 2 connections x 16 requests in flight.
  timeout 120 fio --name=load --ioengine=nbd --uri="$(unix_uri disk)" --rw=randwrite --bs=64k \
    --iodepth=16 --numjobs=2 --offset=256M --size=128M --offset_increment=128M \
    --time_based --runtime=60 --output="$WORK/fio-load.out" >/dev/null 2>&1 &
  local fio_pid=$!
  register pid $fio_pid
  # Region B [128M, 256M): the acknowledged-writes logger, over TCP.
  nbdsh -u "$(tcp_uri disk)" -c "LOG='$WORK/acked'" -c "$WRITER" >"$WORK/writer.out" 2>&1 &
  local writer_pid=$!
  register pid $writer_pid
  sleep 2
  kill -0 $fio_pid || fail "fio ended before the signal: $(cat "$WORK/fio-load.out")"
  kill -0 $writer_pid || fail "the writer ended before the signal: $(cat "$WORK/writer.out")"

  stop_cairn TERM
  say "NOTE: cairn exited $CAIRN_STATUS ${CAIRN_STOP_SECONDS}s after SIGTERM under load"
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status after SIGTERM"
  grep -q 'stopped cleanly' "$CAIRN_LOG" || fail "no clean-stop line in: $(cat "$CAIRN_LOG")"
  [ ! -e "$CAIRN_SOCK" ] || fail "the Unix socket was left behind"

  # The clients notice and end by themselves.
  local i
  for i in $(seq 100); do
    kill -0 $fio_pid 2>/dev/null || kill -0 $writer_pid 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $writer_pid 2>/dev/null && fail "the writer still runs 10 s after cairn exited"
  kill -0 $fio_pid 2>/dev/null && fail "fio still runs 10 s after cairn exited"
  say "NOTE: $(cat "$WORK/writer.out")"

  # Region A: every block fio wrote verifies, read straight from the file.
  timeout 120 fio --name=before --ioengine=psync --filename="$disk" --rw=write --bs=1M \
    --size=128M --verify=crc32c --verify_state_save=0 --verify_only --verify_fatal=1 --output="$WORK/verify.out" ||
    fail "region written before the signal does not verify: $(cat "$WORK/verify.out")"
  # Region B: every acknowledged write is in the file.
  py - "$disk" "$WORK/acked" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb")
acked = [int(x) for x in open(sys.argv[2]).read().split()]
assert acked, "no write was acknowledged before the signal"
for i in acked:
    data.seek((128 << 20) + i * 65536)
    block = data.read(65536)
    assert block == struct.pack(">Q", i) * 8192, f"acknowledged write {i} is not in the file"
print(f"ok: all {len(acked)} acknowledged writes are in the file")
EOF
}

# Idle connections do not hold up a shutdown: SIGINT with clients connected but silent.
t_sigint_idle_clients() {
  need_tool nbdsh
  truncate -s 64M "$WORK/disk.img"
  start_cairn "$WORK/disk.img"
  nbdsh -u "$(unix_uri disk)" -c 'import time; time.sleep(60)' >/dev/null 2>&1 &
  register pid $!
  nbdsh -u "$(tcp_uri disk)" -c 'import time; time.sleep(60)' >/dev/null 2>&1 &
  register pid $!
  sleep 1
  stop_cairn INT
  say "NOTE: cairn exited $CAIRN_STATUS ${CAIRN_STOP_SECONDS}s after SIGINT with 2 idle clients"
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status after SIGINT"
  py -c 'import sys; assert float(sys.argv[1]) < 5, f"took {sys.argv[1]} s"' "$CAIRN_STOP_SECONDS"
}

# A second signal means "now": exit at once with 130, even with a shutdown in progress.
t_second_signal() {
  truncate -s 64M "$WORK/disk.img"
  start_cairn "$WORK/disk.img"
  kill -TERM "$CAIRN_PID"
  kill -TERM "$CAIRN_PID" 2>/dev/null || true
  stop_cairn 0 # signal 0: just wait
  case $CAIRN_STATUS in 0 | 130) ;; *) fail "exit status $CAIRN_STATUS after two signals" ;; esac
}

# md_stop_while_written SIGNAL: serves a RAID5 with stderr into a pipe and a client
# writing, kills the pipe's reader, then sends SIGNAL. cairn must still stop cleanly: exit
# 0, and the md array marked clean (not left active for a full resync).
md_stop_while_written() {
  local sig=$1 D=$WORK/stop-$1
  mkdir -p "$D"
  need_tool mdadm
  local m members=() list
  for m in 0 1 2; do
    truncate -s 64M "$D/m$m.img"
    members+=("$D/m$m.img")
  done
  "$CAIRN" md create --level 5 --raid-devices 3 --name pipe "${members[@]}" >/dev/null ||
    fail "md create failed"
  list=$(IFS=,; echo "${members[*]}")
  mkfifo "$D/err.fifo"
  cat "$D/err.fifo" >"$D/err.log" &
  local reader=$!
  register pid $reader
  "$CAIRN" serve --json --listen "unix:$D/pipe.sock" --control "$D/pipe-ctl.sock" \
    --md "$list:r" >"$D/pipe.json" 2>"$D/err.fifo" &
  CAIRN_PID=$!
  register pid $CAIRN_PID
  local i
  for i in $(seq 100); do
    [ -s "$D/pipe.json" ] && break
    kill -0 $CAIRN_PID 2>/dev/null || fail "cairn exited at start: $(cat "$D/err.log")"
    sleep 0.1
  done
  [ -s "$D/pipe.json" ] || fail "cairn did not announce itself"
  # A client keeps writing, so the array is marked active when the signal comes.
  nbdsh -u "nbd+unix:///r?socket=$D/pipe.sock" \
    -c 'import time
for i in range(3000):
    h.pwrite(b"w" * 65536, (i % 512) * 65536); time.sleep(0.01)' >/dev/null 2>&1 &
  register pid $!
  sleep 1
  mdadm --examine "${members[0]}" | grep -q 'State : active' ||
    fail "array not marked active while written"
  kill $reader
  wait $reader 2>/dev/null || true
  stop_cairn "$sig"
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status after SIG$sig with stderr's reader gone"
  mdadm --examine "${members[0]}" >"$D/examine.txt" 2>&1 || true
  expect_contains "$(cat "$D/examine.txt")" "State : clean" "array state after the stop"
}

# `cairn serve ... 2>&1 | tee log` and Ctrl-C: the terminal's SIGINT kills tee too, so the
# "stopping" line meets a pipe with no reader (EPIPE).
t_sigint_stderr_pipe_gone() { md_stop_while_written INT; }

# The terminal closing (SIGHUP, the same pipe gone) is a stop like SIGINT, not a kill.
t_sighup_stderr_pipe_gone() { md_stop_while_written HUP; }

run_test sigterm-under-load t_sigterm_under_load
run_test sigint-idle-clients t_sigint_idle_clients
run_test second-signal t_second_signal
run_test sigint-stderr-pipe-gone t_sigint_stderr_pipe_gone
run_test sighup-stderr-pipe-gone t_sighup_stderr_pipe_gone
finish
