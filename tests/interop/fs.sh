#!/usr/bin/env bash
# A real kernel filesystem on a cairn export: nbdfuse exposes the export as a file, a loop
# device makes it a block device, then mkfs, mount, write, unmount, remount, verify, fsck.
# The kernel's writes, flushes and FUA reach cairn through FUSE. ext4 and XFS.
. "$(dirname "$0")/lib.sh"


# A tree of files to copy in: a few big, many small, some in nested directories.
make_testdata() {
  local d=$SHM/testdata
  mkdir -p "$d/small" "$d/deep/a/b/c"
  random_file "$d/big1.bin" 48M
  random_file "$d/big2.bin" 20M
  local i
  for i in $(seq 200); do head -c $((RANDOM * 4 + i)) /dev/urandom >"$d/small/f$i"; done
  for i in $(seq 20); do head -c 1M /dev/urandom >"$d/deep/a/b/c/m$i"; done
  (cd "$SHM" && find testdata -type f -print0 | sort -z | xargs -0 sha256sum) >"$WORK/sums"
}

# fs_roundtrip TYPE: the whole path for one filesystem type.
fs_roundtrip() {
  local type=$1 mkfs check mnt=$WORK/mnt
  need_root
  need_fuse
  need_tool losetup mount umount sha256sum
  case $type in
    ext4) need_tool mkfs.ext4 e2fsck; mkfs=(mkfs.ext4 -q -F); check=(e2fsck -fn) ;;
    xfs) need_tool mkfs.xfs xfs_repair; mkfs=(mkfs.xfs -q -f); check=(xfs_repair -n) ;;
  esac
  make_testdata
  # XFS (xfsprogs 6.1) refuses filesystems under 300 MB.
  truncate -s 512M "$SHM/$type.img"
  start_cairn "$SHM/$type.img:$type"
  attach_export "$(unix_uri "$type")"
  "${mkfs[@]}" "$LOOP"
  mkdir -p "$mnt"
  mount "$LOOP" "$mnt"
  register mount "$mnt"
  cp -a "$SHM/testdata" "$mnt/"
  sync
  umount "$mnt"

  # Remount and check every file.
  mount "$LOOP" "$mnt"
  (cd "$mnt" && sha256sum --quiet -c "$WORK/sums") || fail "$type: files differ after remount"
  # Modify, delete, write more: metadata churn, then check again.
  rm -rf "$mnt/testdata/small"
  cp -a "$SHM/testdata/small" "$mnt/testdata/small"
  mv "$mnt/testdata/big2.bin" "$mnt/testdata/deep/big2.bin"
  sync
  umount "$mnt"
  "${check[@]}" "$LOOP" || fail "${check[*]} found errors in the $type filesystem"
  detach_export

  # Through TCP this time, with a fresh nbdfuse and loop device, so no page cache of the
  # first attachment can answer: every file, the moved one where it was put.
  attach_export "$(tcp_uri "$type")"
  mount -o ro "$LOOP" "$mnt"
  sed 's|testdata/big2.bin|testdata/deep/big2.bin|' "$WORK/sums" >"$WORK/sums2"
  (cd "$mnt" && sha256sum --quiet -c "$WORK/sums2") || fail "$type: files differ over TCP"
  umount "$mnt"
  detach_export

  # After cairn stops, the backing file itself holds a clean filesystem.
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "cairn exit status"
  "${check[@]}" "$SHM/$type.img" || fail "${check[*]} on the backing file found errors"
  rm -rf "$SHM/testdata"
}

t_ext4() { fs_roundtrip ext4; }
t_xfs() { fs_roundtrip xfs; }

run_test ext4 t_ext4
run_test xfs t_xfs
finish
