#!/usr/bin/env bash
# `cairn advise`: the mkfs lines it prints, run on the export (nbdfuse + loop), make
# filesystems whose stripe geometry matches the array: dumpe2fs shows the RAID stride and
# stripe width, xfs_db the sunit and swidth. Over several levels, chunk sizes and member
# counts, the classic 4-member RAID6 with 64 KiB chunks (stride=16, stripe_width=32)
# included, and once with LUKS2 between the filesystem and the array.
. "$(dirname "$0")/lib.sh"

CHEAP=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)

# json FILE EXPR: a Python expression over the JSON in FILE (as j).
json() { py -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

# run_line LINE EXTRA...: runs a printed mkfs command line with EXTRA options (-q, -F)
# put right after the program name.
run_line() {
  local line=$1 words
  shift
  read -ra words <<<"$line"
  "${words[0]}" "$@" "${words[@]:1}"
}

# One shape: LEVEL MEMBERS CHUNK MEMBER-SIZE STRIDE WIDTH [luks]
advise_shape() {
  local level=$1 n=$2 chunk=$3 size=$4 stride=$5 width=$6 luks=${7:-} i members list
  need_root
  need_fuse
  need_tool losetup mkfs.ext4 dumpe2fs mkfs.xfs xfs_db
  rm -f "$SHM"/a*.img
  members=()
  for i in $(seq 0 $((n - 1))); do members+=("$SHM/a$i.img"); done
  list=$(IFS=,; echo "${members[*]}")
  "$CAIRN" md create -l "$level" -n "$n" -c "$chunk" --size "$size" --name adv "${members[@]}" >/dev/null
  local stack=(--md "$list:adv")
  if [ -n "$luks" ]; then
    printf %s 'advise test' >"$WORK/key"
    "$CAIRN" luks format -q --key-file "$WORK/key" "${CHEAP[@]}" --sector-size 4096 --md "$list" >/dev/null
    stack+=(--luks --key-file "$WORK/key")
  fi
  start_cairn "${stack[@]}" --control "$WORK/control.sock"
  attach_export "$(unix_uri adv)"
  # Online: the running server's tree gives the same advice.
  "$CAIRN" advise --json adv --control "$WORK/control.sock" --device "$LOOP" >"$WORK/online.json" ||
    fail "cairn advise EXPORT (online) failed"
  # Offline, on the members the server has open: reading them is harmless.
  "$CAIRN" advise --json --device "$LOOP" "${stack[@]}" >"$WORK/advice.json" || fail "cairn advise failed"
  cat "$WORK/advice.json"
  local a=$WORK/advice.json
  expect_eq "$(json "$a" 'j[0]["stride"]')" "$stride" "advised stride"
  expect_eq "$(json "$a" 'j[0]["stripe_width"]')" "$width" "advised stripe width"
  expect_eq "$(json "$a" 'j[0]["warnings"]')" "[]" "warnings"
  expect_eq "$(json "$a" 'j[0]')" "$(json "$WORK/online.json" 'j')" "offline and online advice"
  local ext4 xfs
  ext4=$(json "$a" 'j[0]["mkfs_ext4"]')
  xfs=$(json "$a" 'j[0]["mkfs_xfs"]')
  expect_eq "$ext4" "mkfs.ext4 -E stride=$stride,stripe_width=$width $LOOP" "the ext4 line"
  say "running: $ext4"
  run_line "$ext4" -q -F
  dumpe2fs -h "$LOOP" 2>/dev/null >"$WORK/dumpe2fs.txt"
  grep -E "^RAID stri" "$WORK/dumpe2fs.txt"
  expect_eq "$(awk -F: '/^RAID stride:/ {gsub(/ /, "", $2); print $2}' "$WORK/dumpe2fs.txt")" "$stride" "dumpe2fs RAID stride"
  expect_eq "$(awk -F: '/^RAID stripe width:/ {gsub(/ /, "", $2); print $2}' "$WORK/dumpe2fs.txt")" "$width" "dumpe2fs RAID stripe width"
  say "running: $xfs"
  run_line "$xfs" -q -f
  # sunit/swidth in filesystem blocks (4096 bytes): the chunk and the full stripe.
  xfs_db -r -c sb -c p "$LOOP" >"$WORK/xfs_db.txt"
  grep -E "^(blocksize|unit|width) " "$WORK/xfs_db.txt"
  expect_eq "$(awk '/^blocksize =/ {print $3}' "$WORK/xfs_db.txt")" 4096 "xfs block size"
  expect_eq "$(awk '/^unit =/ {print $3}' "$WORK/xfs_db.txt")" "$stride" "xfs sunit (blocks)"
  expect_eq "$(awk '/^width =/ {print $3}' "$WORK/xfs_db.txt")" "$width" "xfs swidth (blocks)"
  detach_export
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
  rm -f "$SHM"/a*.img
}

# Arrays of 1 GiB, sparse: mkfs.xfs 6.1 with a stripe unit refuses anything under about
# 700 MB ("Log size must be at least 64MB").
t_raid6_4x64k() { advise_shape 6 4 64K 512M 16 32; }
t_raid5_3x128k() { advise_shape 5 3 128K 512M 32 64; }
t_raid6_6x32k() { advise_shape 6 6 32K 256M 8 32; }
t_raid0_2x256k() { advise_shape 0 2 256K 512M 64 128; }
t_raid6_4x64k_luks2() { advise_shape 6 4 64K 512M 16 32 luks; }

# Text output, RAID1 (nothing to stripe), and a LUKS payload at 2 MiB on a 192K full
# stripe (cryptsetup --offset), which advise must flag.
t_text_raid1_and_misaligned_luks() {
  rm -f "$SHM"/b*.img
  "$CAIRN" md create -l 6 -n 4 -c 64K --size 64M --name b "$SHM"/b{0,1,2,3}.img >/dev/null
  "$CAIRN" advise --md "$SHM/b0.img,$SHM/b1.img,$SHM/b2.img,$SHM/b3.img" >"$WORK/text.txt"
  cat "$WORK/text.txt"
  expect_contains "$(cat "$WORK/text.txt")" "mkfs.ext4 -E stride=16,stripe_width=32 DEVICE" "text ext4 line"
  expect_contains "$(cat "$WORK/text.txt")" "mkfs.xfs -d su=64k,sw=2 DEVICE" "text xfs line"
  "$CAIRN" md create -l 1 -n 2 --size 64M --name m "$SHM"/b{4,5}.img >/dev/null
  "$CAIRN" advise --json --md "$SHM/b4.img,$SHM/b5.img" >"$WORK/r1.json"
  expect_eq "$(json "$WORK/r1.json" 'j[0]["stride"]')" None "RAID1 stride"
  expect_eq "$(json "$WORK/r1.json" 'j[0]["mkfs_ext4"]')" "mkfs.ext4 DEVICE" "RAID1 ext4 line"
  expect_contains "$(json "$WORK/r1.json" 'j[0]["notes"]')" "RAID1" "RAID1 note"
  # Scan a directory offline: one advice per stack.
  mkdir -p "$SHM/dir"
  mv "$SHM"/b{0,1,2,3}.img "$SHM/dir/"
  "$CAIRN" advise --json --scan "$SHM/dir" >"$WORK/scan.json"
  expect_eq "$(json "$WORK/scan.json" '[(x["export"], x["stride"]) for x in j]')" "[('b', 16)]" "advise --scan"
  "$CAIRN" advise --json --scan "$SHM/dir" b >"$WORK/one.json"
  expect_eq "$(json "$WORK/one.json" 'j["stripe_width"]')" 32 "advise --scan EXPORT"

  if command -v cryptsetup >/dev/null 2>&1; then
    # RAID6 over 5 members, 64K chunks: a 192K full stripe. A LUKS2 header made by
    # cryptsetup on a plain file with its payload at 2 MiB, copied onto the array through
    # cairn: 2 MiB is not a multiple of 192K.
    rm -f "$SHM"/c*.img
    "$CAIRN" md create -l 6 -n 5 -c 64K --size 64M --name c "$SHM"/c{0,1,2,3,4}.img >/dev/null
    truncate -s 8M "$SHM/hdr.img"
    printf %s 'x' >"$WORK/k"
    cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
      --offset 4096 --key-file "$WORK/k" "$SHM/hdr.img" || skip "cryptsetup luksFormat on a file failed"
    local list
    list=$(IFS=,; echo "$SHM"/c{0,1,2,3,4}.img | tr ' ' ',')
    start_cairn --md "$list:c"
    nbdcopy "$SHM/hdr.img" "$(unix_uri c)"
    stop_cairn
    "$CAIRN" advise --json --md "$list" --luks >"$WORK/mis.json"
    cat "$WORK/mis.json"
    expect_contains "$(json "$WORK/mis.json" 'j[0]["warnings"]')" \
      "LUKS payload at 2 MiB is not a multiple of the array's 192K full stripe" "misalignment warning"
    expect_eq "$(json "$WORK/mis.json" 'j[0]["stripe_width"]')" 48 "RAID6 5 x 64K stripe width"
  fi
}

run_test raid6_4x64k t_raid6_4x64k
run_test raid5_3x128k t_raid5_3x128k
run_test raid6_6x32k t_raid6_6x32k
run_test raid0_2x256k t_raid0_2x256k
run_test raid6_4x64k_luks2 t_raid6_4x64k_luks2
run_test text_raid1_and_misaligned_luks t_text_raid1_and_misaligned_luks
finish
