#!/usr/bin/env bash
# LUKS through the cairn command, checked against cryptsetup, qemu and nbdkit:
#   cairn -> cryptsetup: `cairn luks format` over pbkdf2/argon2id x 256/512-bit keys x
#     512/4096-byte sectors; luksDump (read-only loop, --debug: no checksum error) shows the
#     intended fields, --test-passphrase accepts, and data written through `cairn serve
#     --luks` decrypts with cryptsetup's offline userspace path (verification.md §3.3c).
#   cryptsetup -> cairn: luksFormat + `reencrypt --encrypt --reduce-device-size` (§3.3b)
#     reads back through cairn byte-exact.
#   keyslots: add-key, change-key, remove-key checked by cryptsetup with old and new keys.
#   LUKS1: qemu-img made and wrote it, cairn reads; cairn writes, qemu-img and nbdkit read.
#   wrong passphrase (exit 2), rejected images, RAID6 -> LUKS2 end to end.
# KDF costs are tiny everywhere: these are format checks, not security.
. "$(dirname "$0")/lib.sh"

VECTORS=$REPO/../shared/vectors/luks-images
CHEAP=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
CHEAP_ARGON=(--pbkdf argon2id --pbkdf-memory 32768 --pbkdf-parallel 1 --pbkdf-force-iterations 4)

# ro_loop FILE: a read-only loop device, released after the test (checkers must not
# "repair" what they check).
ro_loop() {
  local l
  l=$(losetup -r -f --show "$1") || fail "losetup -r $1"
  register loop "$l"
  printf '%s' "$l"
}

keys() {
  printf %s 'first passphrase' >"$WORK/k1"
  printf %s 'second one' >"$WORK/k2"
  printf %s 'third, changed' >"$WORK/k3"
  printf %s 'wrong guess' >"$WORK/kbad"
}

# decrypt_with_cryptsetup IMG KEYFILE OUT: verification.md §3.3c, cryptsetup's own
# userspace decryption of the data segment of IMG into OUT.
decrypt_with_cryptsetup() {
  local img=$1 key=$2 out=$3 j off ss ciph ks
  j=$(cryptsetup luksDump --dump-json-metadata "$img")
  off=$(py -c 'import json,sys; print(json.loads(sys.argv[1])["segments"]["0"]["offset"])' "$j")
  ss=$(py -c 'import json,sys; print(json.loads(sys.argv[1])["segments"]["0"]["sector_size"])' "$j")
  ciph=$(py -c 'import json,sys; print(json.loads(sys.argv[1])["segments"]["0"]["encryption"])' "$j")
  rm -f "$WORK/vk.bin" "$WORK/seg.hdr"
  cryptsetup luksDump -q --dump-volume-key --volume-key-file "$WORK/vk.bin" --key-file "$key" "$img" >/dev/null
  ks=$(($(stat -c %s "$WORK/vk.bin") * 8))
  dd if="$img" of="$out" bs=512 skip=$((off / 512)) status=none
  cryptsetup luksFormat -q --type luks2 --header "$WORK/seg.hdr" --offset 0 \
    --volume-key-file "$WORK/vk.bin" --key-size "$ks" --cipher "$ciph" --sector-size "$ss" \
    "${CHEAP[@]}" --key-file "$key" "$out"
  cryptsetup reencrypt --decrypt -q --force-offline-reencrypt --header "$WORK/seg.hdr" \
    --key-file "$key" "$out"
  rm -f "$WORK/vk.bin" "$WORK/seg.hdr"
}

# cairn -> cryptsetup over the whole table of shapes.
t_cairn_format_cryptsetup_reads() {
  need_root
  need_tool cryptsetup nbdcopy
  keys
  local kdf bits ss img loop dbg n=0
  for kdf in pbkdf2 argon2id; do
    for bits in 256 512; do
      for ss in 512 4096; do
        n=$((n + 1))
        img=$SHM/c$n.img
        truncate -s 24M "$img"
        if [ $kdf = pbkdf2 ]; then kargs=("${CHEAP[@]}"); else kargs=("${CHEAP_ARGON[@]}"); fi
        "$CAIRN" luks format -q --key-file "$WORK/k1" --key-size $bits --sector-size $ss \
          --label "shape$n" "${kargs[@]}" "$img" >/dev/null || fail "cairn luks format $kdf/$bits/$ss"
        loop=$(ro_loop "$img")
        dbg=$(cryptsetup luksDump --debug "$loop" 2>&1) || fail "luksDump $kdf/$bits/$ss: $dbg"
        case $dbg in *"checksum error"* | *"requires recovery"*) fail "checksum complaint for $kdf/$bits/$ss: $dbg" ;; esac
        cryptsetup luksDump --dump-json-metadata "$loop" >"$WORK/meta.json"
        py - "$WORK/meta.json" $kdf $bits $ss "shape$n" <<'EOF'
import json, sys
path, kdf, bits, ss, label = sys.argv[1:]
j = json.load(open(path))
seg = j["segments"]["0"]
assert seg["type"] == "crypt", seg
assert seg["encryption"] == "aes-xts-plain64", seg
assert seg["sector_size"] == int(ss), seg
assert int(seg["offset"]) % (1 << 20) == 0, seg
ks = j["keyslots"]["0"]
assert ks["key_size"] * 8 == int(bits), ks
assert ks["kdf"]["type"] == kdf, ks["kdf"]
assert j["config"]["json_size"], j["config"]
EOF
        cryptsetup luksDump "$loop" | grep -q "Label:.*shape$n" || fail "label not shown by luksDump"
        cryptsetup open --test-passphrase --key-file "$WORK/k1" "$loop" ||
          fail "cryptsetup rejects cairn's passphrase for $kdf/$bits/$ss"
        losetup -d "$loop"
        # Data through the export, decrypted by cryptsetup.
        random_file "$WORK/plain.bin" 8M
        start_cairn --luks "$img:vol" --key-file "$WORK/k1"
        nbdcopy "$WORK/plain.bin" "$(unix_uri vol)"
        stop_cairn
        expect_eq "$CAIRN_STATUS" 0 "serve exit status"
        decrypt_with_cryptsetup "$img" "$WORK/k1" "$WORK/dec.bin"
        cmp -n $((8 << 20)) "$WORK/dec.bin" "$WORK/plain.bin" ||
          fail "cryptsetup decrypts something else than what was written for $kdf/$bits/$ss"
        say "ok: $kdf $bits-bit $ss-byte sectors"
        rm -f "$img" "$WORK/dec.bin"
      done
    done
  done
}

# cryptsetup -> cairn: cryptsetup encrypts data in place, cairn reads it back.
t_cryptsetup_encrypts_cairn_reads() {
  need_tool cryptsetup nbdcopy
  keys
  local ss kdf img
  for ss in 512 4096; do
    for kdf in pbkdf2 argon2id; do
      img=$SHM/cs.img
      random_file "$WORK/plain16.bin" 16M
      cp "$WORK/plain16.bin" "$img"
      truncate -s 32M "$img"
      if [ $kdf = pbkdf2 ]; then kargs=(--pbkdf-force-iterations 1000); else
        kargs=(--pbkdf-memory 32768 --pbkdf-parallel 1 --pbkdf-force-iterations 4); fi
      cryptsetup reencrypt --encrypt --type luks2 -q --pbkdf $kdf "${kargs[@]}" \
        --key-file "$WORK/k1" --sector-size $ss --reduce-device-size 16M "$img" >/dev/null 2>&1 ||
        fail "cryptsetup reencrypt --encrypt ($ss, $kdf)"
      "$CAIRN" luks test --key-file "$WORK/k1" "$img" >"$WORK/t.out" || fail "cairn luks test"
      expect_contains "$(cat "$WORK/t.out")" "Key slot 0 unlocked." "cairn luks test"
      "$CAIRN" luks dump "$img" >"$WORK/dump.txt" || fail "cairn luks dump"
      expect_contains "$(cat "$WORK/dump.txt")" "sector: $ss [bytes]" "cairn luks dump sector size"
      start_cairn --read-only --luks "$img:vol" --key-file "$WORK/k1"
      nbdcopy "$(unix_uri vol)" "$WORK/back.bin"
      stop_cairn
      cmp -n $((16 << 20)) "$WORK/back.bin" "$WORK/plain16.bin" ||
        fail "cairn reads something else than cryptsetup encrypted ($ss, $kdf)"
      say "ok: cryptsetup $kdf $ss-byte sectors"
      rm -f "$img" "$WORK/back.bin"
    done
  done
}

# Keyslot operations, each checked by cryptsetup with the old and the new passphrase.
t_keyslots() {
  need_root
  need_tool cryptsetup
  keys
  local img=$SHM/ks.img loop
  truncate -s 20M "$img"
  "$CAIRN" luks format -q --key-file "$WORK/k1" "${CHEAP[@]}" "$img" >/dev/null
  cs_test() { # KEYFILE WANT-STATUS
    loop=$(ro_loop "$img")
    expect_status "$2" cryptsetup open --test-passphrase --key-file "$1" "$loop"
    losetup -d "$loop"
  }
  "$CAIRN" luks add-key --key-file "$WORK/k1" --new-key-file "$WORK/k2" "${CHEAP_ARGON[@]}" "$img" >"$WORK/o"
  expect_contains "$(cat "$WORK/o")" "Key slot 1 created." "add-key output"
  cs_test "$WORK/k1" 0
  cs_test "$WORK/k2" 0
  "$CAIRN" luks change-key --key-file "$WORK/k2" --new-key-file "$WORK/k3" "${CHEAP[@]}" "$img" >"$WORK/o"
  expect_contains "$(cat "$WORK/o")" "Key slot 1 changed." "change-key output"
  cs_test "$WORK/k2" 2
  cs_test "$WORK/k3" 0
  cs_test "$WORK/k1" 0
  "$CAIRN" luks remove-key --key-file "$WORK/k1" "$img" >"$WORK/o"
  expect_contains "$(cat "$WORK/o")" "Key slot 0 removed." "remove-key output"
  cs_test "$WORK/k1" 2
  cs_test "$WORK/k3" 0
  # The last keyslot is not removed without asking (no terminal here, -q alone refuses).
  expect_status 1 "$CAIRN" luks remove-key -q --key-file "$WORK/k3" "$img"
  cs_test "$WORK/k3" 0
  # Key file on stdin, exact bytes.
  "$CAIRN" luks test --key-file - "$img" <"$WORK/k3" >/dev/null
  # A header backup cryptsetup reads, restored by cryptsetup onto a wiped header.
  "$CAIRN" luks header-backup --header-backup-file "$WORK/hdr.bak" "$img" >/dev/null
  expect_eq "$(stat -c %a "$WORK/hdr.bak")" 600 "header backup mode"
  cryptsetup isLuks --type luks2 "$WORK/hdr.bak" || fail "cryptsetup does not see LUKS2 in the backup"
  dd if=/dev/zero of="$img" bs=4096 count=1 conv=notrunc status=none  # primary only
  expect_status 1 "$CAIRN" luks header-restore --header-backup-file "$WORK/hdr.bak" "$img" </dev/null
  "$CAIRN" luks header-restore -q --header-backup-file "$WORK/hdr.bak" "$img" >/dev/null
  cs_test "$WORK/k3" 0
}

# A wrong passphrase: cryptsetup's sentence and exit status 2, for test and serve.
t_wrong_passphrase() {
  keys
  local img=$SHM/w.img out status
  truncate -s 20M "$img"
  "$CAIRN" luks format -q --key-file "$WORK/k1" "${CHEAP[@]}" "$img" >/dev/null
  status=0
  out=$("$CAIRN" luks test --key-file "$WORK/kbad" "$img" 2>&1) || status=$?
  expect_eq "$status" 2 "luks test exit status"
  expect_eq "$out" "cairn: No key available with this passphrase." "luks test message"
  status=0
  out=$("$CAIRN" serve --listen "unix:$WORK/w.sock" --luks "$img" --key-file "$WORK/kbad" 2>&1) || status=$?
  expect_eq "$status" 2 "serve exit status"
  expect_contains "$out" "No key available with this passphrase." "serve message"
  status=0
  out=$("$CAIRN" luks add-key --key-file "$WORK/kbad" --new-key-file "$WORK/k2" "${CHEAP[@]}" "$img" 2>&1) || status=$?
  expect_eq "$status" 2 "add-key exit status"
  # Nothing secret in the output.
  case $out in *"wrong guess"* | *"second one"*) fail "a passphrase reached the output: $out" ;; esac
  # No terminal and no key file: advice, not a hang.
  status=0
  out=$(setsid "$CAIRN" luks test "$img" 2>&1 </dev/null) || status=$?
  expect_eq "$status" 1 "no-terminal exit status"
  expect_contains "$out" "--key-file" "no-terminal advice"
}

# Images that must be rejected are, with a sentence and no panic; format refuses to
# overwrite signatures without --force.
t_rejected() {
  need_tool xz
  keys
  local f out status
  for f in luks2-invalid-checksum-both-hdrs luks2-uint64-overflow-segment-size luks2-invalid-json-size-c2; do
    [ -f "$VECTORS/$f.img.xz" ] || skip "vector image $f is missing"
    xz -dc "$VECTORS/$f.img.xz" >"$WORK/$f.img"
    status=0
    out=$("$CAIRN" luks dump "$WORK/$f.img" 2>&1) || status=$?
    [ "$status" -ne 0 ] || fail "$f: dump accepted a bad header"
    status=0
    out=$out$("$CAIRN" serve --listen "unix:$WORK/r.sock" --luks "$WORK/$f.img" --key-file "$WORK/k1" 2>&1) || status=$?
    [ "$status" -ne 0 ] || fail "$f: serve accepted a bad header"
    case $out in *panicked* | *"internal error"* | *backtrace*) fail "$f: a panic reached the user: $out" ;; esac
    expect_contains "$out" "cairn: " "$f: an error sentence"
    say "$f: $(printf '%s' "$out" | head -1)"
  done
  # Not LUKS at all.
  truncate -s 20M "$WORK/plain.img"
  status=0
  out=$("$CAIRN" luks dump "$WORK/plain.img" 2>&1) || status=$?
  expect_eq "$status" 1 "dump of a plain file"
  expect_contains "$out" "not a LUKS device" "dump of a plain file"
  # format refuses a filesystem, and an existing LUKS header, without --force.
  if command -v mkfs.ext4 >/dev/null; then
    mkfs.ext4 -q -F "$WORK/plain.img"
    status=0
    out=$("$CAIRN" luks format -q --key-file "$WORK/k1" "${CHEAP[@]}" "$WORK/plain.img" 2>&1) || status=$?
    expect_eq "$status" 1 "format over ext4"
    expect_contains "$out" "ext4 filesystem" "format names what it found"
    "$CAIRN" luks format -q --force --key-file "$WORK/k1" "${CHEAP[@]}" "$WORK/plain.img" >/dev/null
  fi
  status=0
  out=$("$CAIRN" luks format --key-file "$WORK/k1" "${CHEAP[@]}" --force "$WORK/plain.img" 2>&1 </dev/null) || status=$?
  expect_eq "$status" 1 "format without -q and without a terminal"
  expect_contains "$out" "batch-mode" "format asks for -q"
}

# LUKS1 made by qemu-img: qemu writes, cairn reads; cairn writes, qemu-img and nbdkit read.
t_luks1_qemu_nbdkit() {
  need_tool qemu-img nbdcopy nbdkit
  local img=$SHM/l1.img pass='qemu pass' so
  printf %s "$pass" >"$WORK/qk"
  so=(--object "secret,id=s0,file=$WORK/qk")
  qemu-img create -q -f luks "${so[@]}" -o key-secret=s0,iter-time=10 "$img" 64M
  "$CAIRN" luks dump "$img" | grep -q "Version: *.1" || fail "cairn luks dump does not see LUKS1"
  random_file "$WORK/p1.bin" 64M
  qemu-img convert "${so[@]}" -n -f raw "$WORK/p1.bin" \
    --target-image-opts "driver=luks,key-secret=s0,file.filename=$img"
  start_cairn --luks "$img:l1" --key-file "$WORK/qk"
  expect_eq "$(nbdinfo --size "$(unix_uri l1)")" $((64 << 20)) "LUKS1 export size"
  nbdcopy "$(unix_uri l1)" "$WORK/b1.bin"
  cmp "$WORK/b1.bin" "$WORK/p1.bin" || fail "cairn reads something else than qemu-img wrote"
  random_file "$WORK/p2.bin" 64M
  nbdcopy "$WORK/p2.bin" "$(unix_uri l1)"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "serve exit status"
  qemu-img convert "${so[@]}" --image-opts "driver=luks,key-secret=s0,file.filename=$img" \
    -O raw "$WORK/q2.bin"
  cmp "$WORK/q2.bin" "$WORK/p2.bin" || fail "qemu-img reads something else than cairn wrote"
  rm -f "$WORK/q2.bin"
  nbdkit -U - file "$img" --filter=luks "passphrase=+$WORK/qk" \
    --run "nbdcopy \"\$uri\" $WORK/k2.bin"
  cmp "$WORK/k2.bin" "$WORK/p2.bin" || fail "nbdkit's luks filter reads something else than cairn wrote"
  # cryptsetup agrees on the passphrase too.
  if command -v cryptsetup >/dev/null; then
    cryptsetup open --test-passphrase --key-file "$WORK/qk" "$img" || fail "cryptsetup rejects qemu's LUKS1"
  fi
}

# RAID6 -> LUKS2, the quickstart stack, by hand: format over the array, serve, round trip,
# and the payload offset is a whole number of full stripes.
t_raid6_luks2() {
  need_tool nbdcopy
  keys
  local m=("$SHM/r0.img" "$SHM/r1.img" "$SHM/r2.img" "$SHM/r3.img") list
  list=$(IFS=,; echo "${m[*]}")
  "$CAIRN" md create -l 6 -n 4 --chunk 64K --size 64M "${m[@]}" >/dev/null
  "$CAIRN" luks format -q --md "$list" --key-file "$WORK/k1" "${CHEAP[@]}" >"$WORK/f.out"
  expect_contains "$(cat "$WORK/f.out")" "full stripe" "format mentions the stripe alignment"
  "$CAIRN" luks dump --json --md "$list" >"$WORK/d.json"
  py - "$WORK/d.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
off = j["segments"][0]["offset"]
assert off % (128 << 10) == 0 and off % (1 << 20) == 0, off
EOF
  random_file "$WORK/plain.bin" 64M
  start_cairn --md "$list:secure" --luks --key-file "$WORK/k1"
  py -c 'import json,sys; e=json.load(open(sys.argv[1]))["exports"][0]; assert e["luks"]["version"]==2 and e["md"]["level"]=="raid6", e' "$CAIRN_JSON"
  nbdcopy "$WORK/plain.bin" "$(unix_uri secure)"
  nbdcopy "$(unix_uri secure)" "$WORK/back.bin"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "serve exit status"
  cmp -n $((64 << 20)) "$WORK/back.bin" "$WORK/plain.bin" || fail "RAID6 -> LUKS2 round trip differs"
  # Again after a restart, with one member gone (degraded RAID6 under LUKS).
  mv "${m[1]}" "$WORK/gone.img"
  start_cairn --md "$list:secure" --luks --key-file "$WORK/k1"
  nbdcopy "$(unix_uri secure)" "$WORK/back2.bin"
  stop_cairn
  cmp -n $((64 << 20)) "$WORK/back2.bin" "$WORK/plain.bin" || fail "degraded RAID6 -> LUKS2 read differs"
  # The ciphertext is not the plaintext.
  if cmp -s -n 65536 "${m[0]}" "$WORK/plain.bin"; then fail "plaintext on a member"; fi
}

run_test cairn-format-cryptsetup-reads t_cairn_format_cryptsetup_reads
run_test cryptsetup-encrypts-cairn-reads t_cryptsetup_encrypts_cairn_reads
run_test keyslots t_keyslots
run_test wrong-passphrase t_wrong_passphrase
run_test rejected t_rejected
run_test luks1-qemu-nbdkit t_luks1_qemu_nbdkit
run_test raid6-luks2 t_raid6_luks2
finish
