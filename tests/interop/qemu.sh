#!/usr/bin/env bash
# qemu-img and qemu-io with NBD URIs: info, compare (identical and different), convert out
# of and into an export.
. "$(dirname "$0")/lib.sh"

# A 256 MiB export full of random data, and a reference copy of it.
setup() {
  need_tool qemu-img qemu-io cmp
  random_file "$SHM/disk.img" 256M
  cp "$SHM/disk.img" "$SHM/ref.bin"
  start_cairn "$SHM/disk.img"
}

t_info() {
  setup
  for uri in "$(unix_uri disk)" "$(tcp_uri disk)"; do
    qemu-img info --output=json "$uri" >"$WORK/info.json"
    py - "$WORK/info.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["virtual-size"] == 256 << 20, j
assert j["format"] == "raw", j
print("ok:", j["filename"], j["virtual-size"])
EOF
  done
}

t_compare() {
  setup
  local out
  out=$(qemu-img compare -f raw -F raw "$SHM/ref.bin" "$(unix_uri disk)")
  expect_contains "$out" "Images are identical" "qemu-img compare over the Unix socket"
  out=$(qemu-img compare -f raw -F raw "$SHM/ref.bin" "$(tcp_uri disk)")
  expect_contains "$out" "Images are identical" "qemu-img compare over TCP"

  # Change 64 KiB at 5 MiB through the export: compare must now find the first difference
  # there, and the backing file must hold the new bytes.
  qemu-io -f raw -c 'write -P 0x5a 5M 64k' "$(tcp_uri disk)" >/dev/null
  local status=0
  out=$(qemu-img compare -f raw -F raw "$SHM/ref.bin" "$(unix_uri disk)") || status=$?
  expect_eq "$status" 1 "qemu-img compare exit status after a change"
  expect_contains "$out" "offset 5242880" "qemu-img compare's first mismatch"
  py -c 'import sys; d=open(sys.argv[1],"rb").read(); assert d[5<<20:(5<<20)+65536] == b"\x5a"*65536; print("ok: file holds the write")' "$SHM/disk.img"
  # And qemu-io reads it back through the export.
  out=$(qemu-io -f raw -c 'read -P 0x5a 5M 64k' "$(unix_uri disk)")
  expect_contains "$out" "read 65536/65536 bytes" "qemu-io read -P"
}

t_convert_out() {
  setup
  qemu-img convert -f raw -O raw "$(unix_uri disk)" "$SHM/copy-unix.raw"
  cmp "$SHM/ref.bin" "$SHM/copy-unix.raw" || fail "qemu-img convert out over the Unix socket differs"
  qemu-img convert -f raw -O raw "$(tcp_uri disk)" "$SHM/copy-tcp.raw"
  cmp "$SHM/ref.bin" "$SHM/copy-tcp.raw" || fail "qemu-img convert out over TCP differs"
  # And to qcow2: a format conversion reads the export the way a VM import does.
  qemu-img convert -f raw -O qcow2 "$(tcp_uri disk)" "$SHM/copy.qcow2"
  qemu-img compare -f qcow2 -F raw "$SHM/copy.qcow2" "$SHM/ref.bin" >/dev/null
}

t_convert_in() {
  setup
  # New contents: random data with a zero hole in the middle (qemu-img sends zero
  # requests for it).
  random_file "$SHM/new.raw" 256M
  dd if=/dev/zero of="$SHM/new.raw" bs=1M seek=100 count=50 conv=notrunc status=none
  # -n: the target exists already (an NBD export cannot be created).
  qemu-img convert -n -f raw -O raw "$SHM/new.raw" "$(tcp_uri disk)"
  cmp "$SHM/new.raw" "$SHM/disk.img" || fail "qemu-img convert into the export: file differs"
  out=$(qemu-img compare -f raw -F raw "$SHM/new.raw" "$(unix_uri disk)")
  expect_contains "$out" "Images are identical" "qemu-img compare after convert in"
}

run_test info t_info
run_test compare t_compare
run_test convert-out t_convert_out
run_test convert-in t_convert_in
finish
