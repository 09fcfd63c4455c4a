#!/usr/bin/env bash
# Bad requests through nbdsh with libnbd's strict mode off (verification.md §5.3, §5.4):
# each must get the protocol's errno, and the connection must stay usable.
. "$(dirname "$0")/lib.sh"

# nbdsh_run URI SCRIPT: runs a Python snippet in nbdsh connected to URI, with a helper
# t(name, fn) that prints "name: OK" or "name: ERRNO".
nbdsh_run() {
  local uri=$1 script=$2
  cat >"$WORK/case.py" <<'EOF'
import nbd
h.set_strict_mode(0)
size = h.get_size()
def t(name, fn):
    try:
        fn()
        print(f"{name}: OK", flush=True)
    except nbd.Error as e:
        print(f"{name}: {e.errno}", flush=True)
EOF
  printf '%s\n' "$script" >>"$WORK/case.py"
  nbdsh -u "$uri" -c "exec(open('$WORK/case.py').read())"
}

# check_output ACTUAL-FILE EXPECTED: line by line; each expected line may list
# alternatives as "name: A|B".
check_output() {
  py - "$1" "$2" <<'EOF'
import sys
got = open(sys.argv[1]).read().splitlines()
want = sys.argv[2].strip().splitlines()
bad = []
for i, w in enumerate(want):
    g = got[i] if i < len(got) else "<missing>"
    name, alts = w.split(": ", 1)
    if g not in [f"{name}: {a}" for a in alts.split("|")]:
        bad.append(f"  {g!r} but expected {w!r}")
if len(got) > len(want):
    bad.append(f"  extra lines: {got[len(want):]}")
if bad:
    print("unexpected answers:\n" + "\n".join(bad))
    sys.exit(1)
print(f"ok: {len(want)} answers as expected")
EOF
}

# The table of verification.md §5.4, exactly as nbdkit (the reference server) answers.
TABLE_SCRIPT='
t("read past end",        lambda: h.pread(512, size))
t("read straddling end",  lambda: h.pread(1024, size - 512))
t("write past end",       lambda: h.pwrite(b"x" * 512, size))
t("trim past end",        lambda: h.trim(512, size))
t("zero past end",        lambda: h.zero(512, size))
t("unknown flag on read", lambda: h.pread(512, 0, flags=0x80))
t("offset overflow",      lambda: h.pread(512, 2**64 - 256))
t("zero-length read",     lambda: h.pread(0, 0))
t("still usable",         lambda: h.pread(512, 0))
'
TABLE_EXPECTED='
read past end: EINVAL
read straddling end: EINVAL
write past end: ENOSPC
trim past end: EINVAL
zero past end: ENOSPC
unknown flag on read: EINVAL
offset overflow: EINVAL
zero-length read: EINVAL
still usable: OK
'

t_table() {
  need_tool nbdsh
  truncate -s 64M "$WORK/disk.img"
  start_cairn "$WORK/disk.img"
  for uri in "$(unix_uri disk)" "$(tcp_uri disk)"; do
    say "== $uri"
    nbdsh_run "$uri" "$TABLE_SCRIPT" | tee "$WORK/out"
    check_output "$WORK/out" "$TABLE_EXPECTED"
  done
}

# Flags that are allowed must be accepted; flags that are not must get EINVAL; neither may
# cost the connection.
t_flags() {
  need_tool nbdsh
  truncate -s 64M "$WORK/disk.img"
  start_cairn "$WORK/disk.img"
  nbdsh_run "$(unix_uri disk)" '
t("write with FUA",             lambda: h.pwrite(b"a" * 4096, 0, flags=nbd.CMD_FLAG_FUA))
t("read with FUA",              lambda: h.pread(4096, 0, flags=nbd.CMD_FLAG_FUA))
t("read back",                  lambda: h.pread(4096, 0) == b"a" * 4096 or 1/0)
t("DF on write",                lambda: h.pwrite(b"x" * 512, 0, flags=nbd.CMD_FLAG_DF))
t("NO_HOLE on read",            lambda: h.pread(512, 0, flags=nbd.CMD_FLAG_NO_HOLE))
t("DF read of 64 KiB",          lambda: h.pread(65536, 0, flags=nbd.CMD_FLAG_DF))
t("trim with FUA",              lambda: h.trim(65536, 1 << 20, flags=nbd.CMD_FLAG_FUA))
t("zero with NO_HOLE",          lambda: h.zero(65536, 2 << 20, flags=nbd.CMD_FLAG_NO_HOLE))
t("fast zero",                  lambda: h.zero(65536, 3 << 20, flags=nbd.CMD_FLAG_FAST_ZERO))
t("zero-length write",          lambda: h.pwrite(b"", 0))
t("zero-length trim",           lambda: h.trim(0, 0))
t("flush",                      lambda: h.flush())
t("cache",                      lambda: h.cache(65536, 0))
t("still usable",               lambda: h.pread(512, 0))
' | tee "$WORK/out"
  check_output "$WORK/out" '
write with FUA: OK
read with FUA: OK
read back: OK
DF on write: EINVAL
NO_HOLE on read: EINVAL
DF read of 64 KiB: OK
trim with FUA: OK
zero with NO_HOLE: OK
fast zero: OK|ENOTSUP
zero-length write: EINVAL|OK
zero-length trim: EINVAL|OK
flush: OK
cache: OK
still usable: OK
'
}

t_read_only_eperm() {
  need_tool nbdsh
  truncate -s 64M "$WORK/ro.img"
  start_cairn --read-only "$WORK/ro.img"
  for uri in "$(unix_uri ro)" "$(tcp_uri ro)"; do
    nbdsh_run "$uri" '
t("write", lambda: h.pwrite(b"x" * 512, 0))
t("big write", lambda: h.pwrite(b"x" * (1 << 20), 0))
t("trim", lambda: h.trim(4096, 0))
t("zero", lambda: h.zero(4096, 0))
t("flush", lambda: h.flush())
t("still usable", lambda: h.pread(4096, 0))
' | tee "$WORK/out"
    check_output "$WORK/out" '
write: EPERM
big write: EPERM
trim: EPERM
zero: EPERM
flush: OK|EPERM
still usable: OK
'
  done
  # Nothing reached the file.
  expect_eq "$(stat -c %b "$WORK/ro.img")" 0 "allocated blocks of the read-only file"
}

# DF (don't fragment) needs structured replies; a client without them gets EINVAL.
t_df_without_structured_replies() {
  need_tool nbdsh
  truncate -s 64M "$WORK/disk.img"
  start_cairn "$WORK/disk.img"
  local uri
  for uri in "$(unix_uri disk)" "$(tcp_uri disk)"; do
    nbdsh -c 'h.set_request_structured_replies(False)' -c "h.connect_uri('$uri')" \
      -c 'h.set_strict_mode(0)' -c '
import nbd
print("structured replies:", h.get_structured_replies_negotiated())
try:
    h.pread(512, 0, flags=nbd.CMD_FLAG_DF); print("DF read: OK")
except nbd.Error as e:
    print("DF read:", e.errno)
h.pread(512, 0); print("still usable: OK")
' | tee "$WORK/out"
    check_output "$WORK/out" '
structured replies: False
DF read: EINVAL
still usable: OK
'
  done
}

# With O_DIRECT the minimum block size is 4096: smaller or unaligned I/O gets EINVAL.
t_alignment() {
  need_tool nbdsh
  truncate -s 64M "$WORK/direct.img"
  dd if=/dev/zero of="$WORK/direct.img" bs=4096 count=1 oflag=direct conv=notrunc status=none 2>/dev/null ||
    skip "$WORK does not support O_DIRECT, which this test needs for a 4096-byte minimum block"
  start_cairn --direct "$WORK/direct.img"
  nbdsh_run "$(unix_uri direct)" '
print("minimum block:", h.get_block_size(nbd.SIZE_MINIMUM))
t("write 512 at 512", lambda: h.pwrite(b"x" * 512, 512))
t("write 4096 at 512", lambda: h.pwrite(b"x" * 4096, 512))
t("read 512 at 0", lambda: h.pread(512, 0))
t("trim 512 at 4096", lambda: h.trim(512, 4096))
t("aligned write", lambda: h.pwrite(b"y" * 8192, 4096))
t("still usable", lambda: h.pread(8192, 4096) == b"y" * 8192 or 1/0)
' | tee "$WORK/out"
  check_output "$WORK/out" '
minimum block: 4096
write 512 at 512: EINVAL
write 4096 at 512: EINVAL
read 512 at 0: EINVAL
trim 512 at 4096: EINVAL
aligned write: OK
still usable: OK
'
}

# Payload sizes: 32 MiB must never cost the connection. Above the advertised maximum and
# 32 MiB the server may hang up, but only on that connection.
t_oversize_payloads() {
  need_tool nbdsh
  truncate -s 128M "$WORK/disk.img"
  start_cairn "$WORK/disk.img"
  nbdsh_run "$(unix_uri disk)" '
print("maximum block:", h.get_block_size(nbd.SIZE_MAXIMUM))
t("32 MiB write", lambda: h.pwrite(bytes(32 << 20), 0))
t("32 MiB read", lambda: h.pread(32 << 20, 0))
t("still usable", lambda: h.pread(512, 0))
other = nbd.NBD()
other.connect_uri(h.get_uri())
t("33 MiB write", lambda: h.pwrite(bytes(33 << 20), 0))
def other_conn():
    other.pwrite(b"z" * 4096, 0)
    assert other.pread(4096, 0) == b"z" * 4096
t("other connection", other_conn)
' | tee "$WORK/out"
  check_output "$WORK/out" '
maximum block: 33554432
32 MiB write: OK|EINVAL
32 MiB read: OK|EINVAL
still usable: OK
33 MiB write: OK|EINVAL|ENOTCONN|ECONNRESET|EPIPE|ESHUTDOWN
other connection: OK
'
}

run_test table t_table
run_test flags t_flags
run_test read-only-eperm t_read_only_eperm
run_test df-without-structured-replies t_df_without_structured_replies
run_test alignment t_alignment
run_test oversize-payloads t_oversize_payloads
finish
