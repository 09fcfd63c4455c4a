#!/usr/bin/env bash
# Installs the system tools cairn's tests and benchmarks drive. Idempotent: does nothing
# when every tool is already present. Needs root (or sudo) for apt-get.
set -euo pipefail

# tool-on-PATH  debian-package (Debian 12: nbdfuse and nbdcopy are in libnbd-bin, nbdsh in
# python3-libnbd)
needed=(
  "nbdkit nbdkit"   # includes the luks filter (tests/interop/luks.sh, bench/run.sh --luks)
  "nbdinfo libnbd-bin"
  "nbdcopy libnbd-bin"
  "nbdfuse libnbd-bin"
  "nbdsh python3-libnbd"
  "qemu-img qemu-utils"
  "qemu-io qemu-utils"
  "qemu-nbd qemu-utils"
  "fio fio"
  "fusermount3 fuse3"
  "sfdisk fdisk"     # tests/interop/lvm.sh: pvcreate refuses MBR and GPT tables sfdisk made
  "mkfs.ext4 e2fsprogs"
  "mkfs.xfs xfsprogs"
  "xfs_repair xfsprogs"
  "cmp diffutils"
  "timeout coreutils"
  "losetup mount"
  "/usr/bin/python3 python3"
  "mdadm mdadm"
  "cryptsetup cryptsetup-bin"
  "lvm lvm2"
  "jq jq"
  "curl curl"       # tests/interop/operator.sh: the control API over its Unix socket
  "tmux tmux"       # tests/interop/operator.sh: cairn status under a real terminal
  "xz xz-utils"
  "file file"       # tests/interop/cairn_bench.sh: the plots are real PNG and SVG
  "ip iproute2"     # tests/interop/remote.sh: member servers in network namespaces
  "etcd etcd-server" # crates/cluster tests and tests/interop/fence.sh start their own etcd
  "certtool gnutls-bin"  # tests/interop/tls.sh: a throwaway CA and certificates
  "psktool gnutls-bin"   # tests/interop/tls.sh: PSK files (username:hexkey)
  "nbd-client nbd-client"  # tests/interop/tls.sh: the Linux client's TLS 1.2 (-l, and the negotiation)
  "pkg-config pkg-config"  # the openssl crate finds libssl with it
  "openssl openssl"  # crates/cluster tests and fence.sh etcd_tls: a throwaway CA for etcd over TLS
)

missing=()
for pair in "${needed[@]}"; do
  tool=${pair%% *}; pkg=${pair##* }
  if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ] && [ ! -x "/sbin/$tool" ]; then
    missing+=("$pkg")
  fi
done
# nbdsh needs the nbd module in the system python (python3-libnbd).
if ! /usr/bin/python3 -c 'import nbd' >/dev/null 2>&1; then missing+=(python3-libnbd); fi
# ISA-L (the anchor for bench/pq: its pq_gen computes md's P and Q) is a library, not a tool.
if [ ! -e /usr/include/isa-l/raid.h ]; then missing+=(libisal-dev); fi
# NBD over TLS (crates/nbd/src/tls.rs) builds against OpenSSL's headers.
if [ ! -e /usr/include/openssl/ssl.h ]; then missing+=(libssl-dev); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all system tools present"
  exit 0
fi

# One package may provide several missing tools.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends keeps mdadm/lvm2 from pulling in services we never start.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
