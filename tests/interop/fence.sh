#!/usr/bin/env bash
# One owner per array across hosts (docs/fencing.md), with real processes:
# - `cairn serve` in the member-server role keeps each export's owner record and refuses
#   an older owner generation at once, also after a restart; a client without a token reads
#   but cannot write an owned member; the record does not disturb `mdadm --examine`, `cairn
#   md examine` or assembling the array from the members; `cairn md owner` shows it.
# - `cairn serve --md ... --etcd`: a second server of the same array (here from copies of
#   its members, as another host would see them) is refused while the first holds the
#   lease; the first, paused with SIGSTOP past its lease and resumed, cannot write a block
#   (checked on the member data), and the second takes over.
# - The same over cairn member servers (remote members, owner generations): the lease
#   comes first, so a host that holds it takes over from a paused owner that never
#   released the members, without --force; the woken owner's writes are refused and the
#   members hold the new owner's data. And an owner whose lease is lost while it runs
#   (etcd stopped) stops its resync at once: the member files do not change any more,
#   its log and status say FENCED.
# The owner token is sent by tests/interop/fence_client.py (libnbd cannot send cairn's option).
. "$(dirname "$0")/lib.sh"

FC() { py "$INTEROP_DIR/fence_client.py" "$CAIRN_SOCK" "$@"; }

make_array() {
  M=("$SHM/m0.img" "$SHM/m1.img" "$SHM/m2.img")
  rm -f "${M[@]}"
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --size 16M --name fence "${M[@]}" >/dev/null
  LIST=$(IFS=,; echo "${M[*]}")
}

# expect_lines OUTPUT EXPECTED...: each line of OUTPUT starts with the next EXPECTED.
expect_lines() {
  local out=$1 i=1 want got
  shift
  for want in "$@"; do
    got=$(printf '%s\n' "$out" | sed -n "${i}p")
    case $got in "$want"*) ;; *) fail "line $i: got '$got', expected '$want...' in:
$out" ;; esac
    i=$((i + 1))
  done
}

t_member_server_fences() {
  need_tool mdadm nbdinfo
  make_array
  start_cairn --no-control "${M[0]}:m0" "${M[1]}:m1" "${M[2]}:m2"
  local at=$((4 << 20)) out
  out=$(FC m0 a=conn:host-a:1:1 a.write:$at:170 p=conn:plain:0:0 p.read:$at p.write:$at:1 \
    b=conn:host-b:2:2 a.write:$at:171 a.read:$at b.write:$at:187 a2=conn:host-a:1:1 \
    c=conn:host-c:3:2 b.write:0:0 b2=conn:host-b:2:2 b2.write:$((at + 4096)):188)
  say "$out"
  expect_lines "$out" \
    "a=conn:host-a:1:1 ok" "a.write:$at:170 ok" "p=conn:plain:0:0 ok" "p.read:$at ok" \
    "p.write:$at:1 errno 1" "b=conn:host-b:2:2 ok" "a.write:$at:171 errno 1" \
    "a.read:$at errno 1" "b.write:$at:187 ok" "a2=conn:host-a:1:1 refused: fenced" \
    "c=conn:host-c:3:2 refused: fenced" "b.write:0:0 errno 1" "b2=conn:host-b:2:2 ok" \
    "b2.write:$((at + 4096)):188 ok"
  # Other clients read an owned member as before.
  nbdinfo "$(unix_uri m0)" >/dev/null
  stop_cairn
  # The generation survived the restart.
  start_cairn --no-control "${M[0]}:m0" "${M[1]}:m1" "${M[2]}:m2"
  out=$(FC m0 a=conn:host-a:9:1 b=conn:host-b:2:2 b.write:$at:189)
  say "$out"
  expect_lines "$out" "a=conn:host-a:9:1 refused: fenced" "b=conn:host-b:2:2 ok" "b.write:$at:189 ok"
  stop_cairn
  # On the member: B's data, B's record; md's superblock untouched.
  expect_eq "$(py -c "import sys; f=open(sys.argv[1],'rb'); f.seek($at); print(f.read(4096)==bytes([189])*4096)" "${M[0]}")" True "B's block on the member"
  out=$("$CAIRN" md owner "${M[@]}")
  say "$out"
  expect_lines "$out" "${M[0]}: generation 2, owner host-b/0000000000000002, array 696e7465:726f702d:61727261:792d3031" \
    "${M[1]}: no owner record" "${M[2]}: no owner record"
  local m x
  for m in "${M[@]}"; do
    x=$(mdadm --examine "$m" 2>&1) || fail "mdadm --examine $m: $x"
    expect_contains "$x" "correct" "mdadm --examine $m: checksum"
    expect_contains "$x" "Name : fence" "mdadm --examine $m: name"
    "$CAIRN" md examine "$m" >/dev/null
  done
  # The array still assembles from the members (degraded data aside: the test wrote into
  # member 0's data area behind md's back, which is not md's business here).
  start_cairn --no-control --md "$LIST:fence"
  nbdinfo "$(unix_uri fence)" >/dev/null
  stop_cairn
}

t_fence_off_and_stacks() {
  make_array
  # --fence off: the option is unknown, as on nbdkit or qemu-nbd.
  start_cairn --no-control --fence off "${M[0]}:m0"
  local out
  out=$(FC m0 a=conn:host-a:1:1)
  expect_lines "$out" "a=conn:host-a:1:1 refused: "
  stop_cairn
  # --fence on with an md export is refused; auto is off there.
  local err rc=0
  err=$(timeout -k 2 20 "$CAIRN" serve --listen "unix:$WORK/x.sock" --control "$WORK/x-ctl.sock" \
    --fence on --md "$LIST:fence" 2>&1) || rc=$?
  [ "$rc" -ne 0 ] || fail "--fence on with --md was accepted"
  expect_contains "$err" "disk host" "--fence on --md: message"
}

# start_etcd [tls]: an etcd of the test's own on free ports with a temporary data dir;
# sets ETCD. With tls: clients over TLS only, with client certificates (--client-cert-auth)
# from make_etcd_certs; ETCD_TLS holds cairn's options for them.
start_etcd() {
  need_tool etcd curl
  local c p scheme=http tls=() curl_tls=()
  if [ "${1:-}" = tls ]; then
    make_etcd_certs "$WORK/etcd-certs"
    local d=$WORK/etcd-certs
    scheme=https
    tls=(--cert-file "$d/server.pem" --key-file "$d/server-key.pem" --trusted-ca-file "$d/ca.pem"
      --client-cert-auth)
    curl_tls=(--cacert "$d/ca.pem" --cert "$d/client.pem" --key "$d/client-key.pem")
    ETCD_TLS=(--etcd-cacert "$d/ca.pem" --etcd-cert "$d/client.pem" --etcd-key "$d/client-key.pem")
  fi
  c=$(py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  p=$(py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  ETCD=$scheme://127.0.0.1:$c
  # A fresh data dir: an earlier test's users and auth setting must not carry over.
  rm -rf "$WORK/etcd"
  etcd --name t --data-dir "$WORK/etcd" --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "t=http://127.0.0.1:$p" "${tls[@]}" >"$WORK/etcd.log" 2>&1 &
  ETCD_PID=$!
  register pid "$ETCD_PID"
  local i
  for i in $(seq 100); do
    curl -sf "${curl_tls[@]}" -XPOST "$ETCD/v3/kv/range" -d '{"key":"eA=="}' >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  fail "etcd did not start: $(tail -5 "$WORK/etcd.log")"
}

# make_etcd_certs DIR: a CA, a server certificate for 127.0.0.1 and localhost (also a
# client one: etcd's gateway dials etcd with it), a client certificate, and one without a
# CommonName (client-nocn).
make_etcd_certs() {
  need_tool openssl
  local d=$1 who ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  mkdir -p "$d"
  openssl req -x509 -days 2 -subj "/CN=cairn test ca" "${ec[@]}" -keyout "$d/ca-key.pem" \
    -out "$d/ca.pem" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$d/server.ext"
  printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
  # With etcd's authentication on, its gateway refuses client certificates with a CN.
  cp "$d/client.ext" "$d/client-nocn.ext"
  for who in server client client-nocn; do
    local subj="/CN=cairn test $who"
    [ "$who" = client-nocn ] && subj="/O=cairn test client"
    openssl req -subj "$subj" "${ec[@]}" -keyout "$d/$who-key.pem" -out "$d/$who.csr" 2>/dev/null
    openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" -CAcreateserial \
      -days 2 -extfile "$d/$who.ext" -out "$d/$who.pem" 2>/dev/null
  done
}

t_etcd_lease() {
  need_tool nbdsh mdadm
  start_etcd
  make_array
  # Host B sees the same array through its own paths: copies of the members.
  local c B=()
  for c in "${M[@]}"; do cp --sparse=always "$c" "$c.b"; B+=("$c.b"); done
  local LISTB
  LISTB=$(IFS=,; echo "${B[*]}")
  start_cairn --no-control --md "$LIST:fence" --etcd "$ETCD" --etcd-ttl 2 --owner-id host-a
  local first=$CAIRN_PID sock1=$CAIRN_SOCK
  nbdsh -u "$(unix_uri fence)" -c 'h.pwrite(b"\xaa" * 4096, 0); h.flush()'
  # A second server of the same array is refused while A holds the lease.
  local err rc=0
  err=$(timeout -k 2 30 "$CAIRN" serve --listen "unix:$WORK/b.sock" --control "$WORK/b-ctl.sock" \
    --md "$LISTB:fence" --etcd "$ETCD" --etcd-ttl 2 --owner-id host-b 2>&1) || rc=$?
  say "second server: exit $rc: $err"
  [ "$rc" -ne 0 ] || fail "a second owner was let in"
  expect_contains "$err" "served by another host" "second owner: message"
  # A stops (SIGSTOP) past its lease; B gets the array.
  kill -STOP "$first"
  sleep 4
  start_cairn --no-control --md "$LISTB:fence" --etcd "$ETCD" --etcd-ttl 2 --owner-id host-b
  local second=$CAIRN_PID
  nbdsh -u "$(unix_uri fence)" -c 'h.pwrite(b"\xbb" * 4096, 0); h.flush()'
  # A resumes and tries to write: refused, and not one byte of it reaches its members.
  kill -CONT "$first"
  local off
  off=$(($(mdadm --examine "${M[0]}" | sed -n 's/.*Data Offset : \([0-9]*\) sectors.*/\1/p') * 512))
  rc=0
  out=$(nbdsh -u "nbd+unix:///fence?socket=$sock1" -c '
import nbd
for i in range(20):
    try:
        h.pwrite(b"\xee" * 4096, 4096 * i)
        print("LATE WRITE", i)
    except nbd.Error as e:
        print("refused", e.errno)
' 2>&1) || rc=$?
  say "$out"
  case $out in *"LATE WRITE"*) fail "the paused owner wrote after its lease ran out" ;; esac
  expect_contains "$out" "refused EPERM" "paused owner: refused"
  expect_eq "$(py -c "import sys; d=open(sys.argv[1],'rb').read(); print(d[$off:$off+4096]==b'\xaa'*4096, b'\xee'*4096 in d)" "${M[0]}")" \
    "True False" "member 0 holds A's last write and nothing after it"
  for c in "${M[1]}" "${M[2]}"; do
    expect_eq "$(py -c "import sys; print(b'\xee'*4096 in open(sys.argv[1],'rb').read())" "$c")" False "$c: no late write"
  done
  grep -q "I/O is frozen\|lease" "$WORK"/cairn1.log || fail "A did not say its lease was lost: $(tail -5 "$WORK"/cairn1.log)"
  CAIRN_PID=$first; stop_cairn
  CAIRN_PID=$second; stop_cairn
}

# The lease over TLS with a client certificate (etcd --client-cert-auth): taken, refused
# to a second host, handed on when the first stops; a host without a client certificate is
# refused with a sentence that says so. Then with etcd's users and passwords too.
t_etcd_tls() {
  need_tool nbdsh
  start_etcd tls
  make_array
  local c B=()
  for c in "${M[@]}"; do cp --sparse=always "$c" "$c.b"; B+=("$c.b"); done
  local LISTB
  LISTB=$(IFS=,; echo "${B[*]}")
  start_cairn --no-control --md "$LIST:fence" --etcd "$ETCD" "${ETCD_TLS[@]}" --etcd-ttl 2 --owner-id host-a
  nbdsh -u "$(unix_uri fence)" -c 'h.pwrite(b"\xaa" * 4096, 0); h.flush()'
  serve_refused "served by another host" --md "$LISTB:fence" --etcd "$ETCD" "${ETCD_TLS[@]}" \
    --etcd-ttl 2 --owner-id host-b
  serve_refused "refused this client's certificate" --md "$LISTB:fence" --etcd "$ETCD" \
    --etcd-cacert "$WORK/etcd-certs/ca.pem" --owner-id host-b
  # No CA: the system's roots do not know the test CA.
  serve_refused "does not verify" --md "$LISTB:fence" --etcd "$ETCD" \
    --etcd-cert "$WORK/etcd-certs/client.pem" --etcd-key "$WORK/etcd-certs/client-key.pem" --owner-id host-b
  # A key that is not the certificate's: named by its path, its contents never shown.
  serve_refused "is not the key of" --md "$LISTB:fence" --etcd "$ETCD" "${ETCD_TLS[@]/client-key.pem/server-key.pem}" \
    --owner-id host-b
  case $OUT in *PRIVATE*) fail "key material in a message: $OUT" ;; esac
  stop_cairn
  start_cairn --no-control --md "$LISTB:fence" --etcd "$ETCD" "${ETCD_TLS[@]}" --etcd-ttl 2 --owner-id host-b
  nbdsh -u "$(unix_uri fence)" -c 'h.pwrite(b"\xbb" * 4096, 0); h.flush()'
  stop_cairn
  # etcd's users on top (etcdctl user add, role grant, auth enable): without a user the
  # lease is refused, with one and its password file the array is served.
  local d=$WORK/etcd-certs call
  call() {
    curl -sf --cacert "$d/ca.pem" --cert "$d/client.pem" --key "$d/client-key.pem" -XPOST "$ETCD/v3/auth/$1" -d "$2" >/dev/null ||
      fail "etcd auth/$1 failed"
  }
  call user/add '{"name":"root","password":"root-pw"}'
  call user/grant '{"user":"root","role":"root"}'
  call role/add '{"name":"rw"}'
  call role/grant '{"name":"rw","perm":{"permType":"READWRITE","key":"AA==","range_end":"AA=="}}'
  call user/add '{"name":"cairn","password":"pw-5c2a"}'
  call user/grant '{"user":"cairn","role":"rw"}'
  call enable '{}'
  printf 'pw-5c2a\n' >"$WORK/etcd.pw"
  printf 'wrong-pw\n' >"$WORK/etcd-wrong.pw"
  local NOCN=(--etcd-cacert "$d/ca.pem" --etcd-cert "$d/client-nocn.pem" --etcd-key "$d/client-nocn-key.pem")
  # A client certificate with a CN: etcd refuses it on the gateway once auth is on.
  serve_refused "no CN" --md "$LISTB:fence" --etcd "$ETCD" "${ETCD_TLS[@]}" \
    --etcd-user cairn --etcd-password-file "$WORK/etcd.pw" --owner-id host-b
  serve_refused "permission denied" --md "$LISTB:fence" --etcd "$ETCD" "${NOCN[@]}" --owner-id host-b
  serve_refused "authentication failed" --md "$LISTB:fence" --etcd "$ETCD" "${NOCN[@]}" \
    --etcd-user cairn --etcd-password-file "$WORK/etcd-wrong.pw" --owner-id host-b
  case $OUT in *wrong-pw*) fail "the password in a message: $OUT" ;; esac
  start_cairn --no-control --md "$LISTB:fence" --etcd "$ETCD" "${NOCN[@]}" --etcd-user cairn \
    --etcd-password-file "$WORK/etcd.pw" --etcd-ttl 2 --owner-id host-b
  nbdsh -u "$(unix_uri fence)" -c 'h.pwrite(b"\xcc" * 4096, 0); h.flush()'
  stop_cairn
}

# member_server FILE...: one cairn member server (fencing on) serving the files as m0,
# m1, ...; sets MPID, URIS and ULIST (the --md list).
member_server() {
  local i=0 f args=()
  for f in "$@"; do args+=("$f:m$i"); i=$((i + 1)); done
  start_cairn --no-control "${args[@]}"
  MPID=$CAIRN_PID
  URIS=()
  for ((i = 0; i < $#; i++)); do URIS+=("nbd+unix:///m$i?socket=$CAIRN_SOCK"); done
  ULIST=$(IFS=,; echo "${URIS[*]}")
}

# no_block_of BYTE FILE...: no 4 KiB block of the files is BYTE repeated.
no_block_of() {
  py -c '
import sys
b = bytes([int(sys.argv[1], 0)]) * 4096
for p in sys.argv[2:]:
    d = open(p, "rb").read()
    for i in range(0, len(d), 4096):
        if d[i:i + 4096] == b:
            print(p, i)
            sys.exit(1)
' "$@"
}

t_etcd_takeover_over_member_servers() {
  need_tool nbdsh nbdcopy
  start_etcd
  local M=("$SHM/r0.img" "$SHM/r1.img" "$SHM/r2.img") f
  for f in "${M[@]}"; do rm -f "$f"; truncate -s 32M "$f"; done
  member_server "${M[@]}"
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --assume-clean --name fa \
    "${URIS[@]}" >/dev/null || fail "md create"
  # Host A owns the array: the lease, then generation 1 on every member.
  start_cairn --no-control --md "$ULIST:fa" --etcd "$ETCD" --etcd-ttl 2 --owner-id host-a
  local A_PID=$CAIRN_PID A_URI A_LOG=$CAIRN_LOG out
  A_URI=$(unix_uri fa)
  nbdsh -u "$A_URI" -c 'h.pwrite(b"\xaa" * 4096, 0); h.flush()'
  out=$("$CAIRN" md owner "${URIS[@]}")
  say "$out"
  expect_contains "$out" "generation 1, owner host-a/" "A's records"
  case $out in *released*) fail "A's records say released while A serves" ;; esac
  # A is paused past its lease, without releasing anything.
  kill -STOP "$A_PID"
  sleep 4
  # Host B: no --force. It gets the lease (A's ran out), so it replaces A's generation.
  start_cairn -v --no-control --md "$ULIST:fb" --etcd "$ETCD" --etcd-ttl 2 --owner-id host-b
  local B_PID=$CAIRN_PID B_LOG=$CAIRN_LOG
  out=$("$CAIRN" md owner "${URIS[@]}")
  say "$out"
  expect_contains "$out" "generation 2, owner host-b/" "B's records"
  # The lease came first: B's log (-v) says it took the lease before the generation.
  local took gen
  took=$(grep -n "took /cairn/arrays/" "$B_LOG" | head -1 | cut -d: -f1)
  gen=$(grep -n "took generation 2" "$B_LOG" | head -1 | cut -d: -f1)
  [ -n "$took" ] && [ -n "$gen" ] && [ "$took" -lt "$gen" ] ||
    fail "B did not take the lease before the members: $(cat "$B_LOG")"
  random_file "$WORK/b1" 1M
  nbdcopy "$WORK/b1" "$(unix_uri fb)"
  nbdsh -u "$(unix_uri fb)" -c 'h.flush()'
  # A wakes up and tries to write: every write and flush is refused.
  kill -CONT "$A_PID"
  out=$(nbdsh -u "$A_URI" -c '
import nbd
for i in range(20):
    try:
        h.pwrite(b"\xee" * 4096, 4096 * i)
        print("LATE WRITE", i)
    except nbd.Error as e:
        print("refused", e.errno)
try:
    h.flush()
    print("LATE FLUSH")
except nbd.Error as e:
    print("flush refused", e.errno)
' 2>&1) || true
  say "$out"
  case $out in *LATE*) fail "the woken owner wrote after its lease ran out" ;; esac
  expect_contains "$out" "refused EPERM" "woken owner: refused"
  sleep 1
  no_block_of 0xee "${M[@]}" || fail "a write of the woken owner reached a member"
  grep -q "lease .* is lost" "$A_LOG" || fail "A's log does not say its lease was lost: $(tail -5 "$A_LOG")"
  grep -q "fenced" "$A_LOG" || fail "A's log does not say its array is fenced: $(tail -5 "$A_LOG")"
  # B stops cleanly (records released, lease revoked); the members hold B's data.
  CAIRN_PID=$B_PID; stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "B stops cleanly"
  start_cairn --no-control --read-only --md "$ULIST:fc"
  expect_eq "$(nbdcopy "$(unix_uri fc)" - | head -c 1048576 | sha256sum)" "$(sha256sum <"$WORK/b1")" "B's data on the members"
  stop_cairn
  # A cannot close what it no longer owns, and says why.
  CAIRN_PID=$A_PID; stop_cairn
  [ "$CAIRN_STATUS" -ne 0 ] || fail "A stopped as if it still owned the array"
  grep -q "may no longer own it" "$A_LOG" || fail "A's stop: $(tail -3 "$A_LOG")"
  no_block_of 0xee "${M[@]}" || fail "A wrote at its stop"
  CAIRN_PID=$MPID; stop_cairn
}

t_etcd_lease_lost_stops_md_writes() {
  need_tool curl jq
  start_etcd
  local M=("$SHM/s0.img" "$SHM/s1.img" "$SHM/s2.img") f
  # Old data on the members: the resync rewrites parity stripe by stripe.
  # The first 4 KiB stay zero, as md leaves them: the owner record goes there.
  for f in "${M[@]}"; do
    rm -f "$f"
    random_file "$f" 32M
    dd if=/dev/zero of="$f" bs=4096 count=1 conv=notrunc status=none
  done
  member_server "${M[@]}"
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 3 --name fs "${URIS[@]}" >/dev/null ||
    fail "md create"
  CTL=$WORK/a-ctl.sock
  # 256 KiB/s: the resync of 64 MiB would take minutes.
  start_cairn --control "$CTL" --md "$ULIST:fs" --etcd "$ETCD" --etcd-ttl 3 --owner-id host-a \
    --speed-limit-min 256 --speed-limit-max 256
  local A_PID=$CAIRN_PID A_LOG=$CAIRN_LOG h1 h2 i
  detail() { curl -s --unix-socket "$CTL" "http://cairn/v1/arrays/fs"; }
  for i in $(seq 50); do
    [ "$(detail | jq -r '.background.state // empty')" = running ] && break
    sleep 0.2
  done
  say "before: $(detail | jq -c '{state: .detail.state_text, background: .background}')"
  [ "$(detail | jq -r '.background.action')" = resync ] || fail "no resync running: $(detail)"
  h1=$(sha256sum "${M[@]}")
  sleep 2
  h2=$(sha256sum "${M[@]}")
  [ "$h1" != "$h2" ] || fail "the resync wrote nothing in 2 s; the test would prove nothing"
  # etcd stops answering: A's keepalives fail, its deadline passes while it runs.
  local EPID=$ETCD_PID
  kill -STOP "$EPID"
  for i in $(seq 100); do
    grep -q "lease .* is lost" "$A_LOG" && break
    sleep 0.1
  done
  grep -q "lease .* is lost" "$A_LOG" || { kill -CONT "$EPID"; fail "A never noticed: $(tail -5 "$A_LOG")"; }
  # What was in flight settles; from here on the member files must not change, while A
  # runs (not paused).
  sleep 1
  h1=$(sha256sum "${M[@]}")
  sleep 4
  h2=$(sha256sum "${M[@]}")
  kill -0 "$A_PID" || fail "A exited"
  kill -CONT "$EPID"
  expect_eq "$h2" "$h1" "member files after A's lease was lost"
  local d
  d=$(detail)
  say "after: $(jq -c '{state: .detail.state_text, background: .background}' <<<"$d")"
  expect_contains "$(jq -r '.detail.state_text' <<<"$d")" "FENCED" "A's status"
  [ "$(jq -r '.background.state' <<<"$d")" != running ] || fail "A's resync still runs: $d"
  grep -q "fenced" "$A_LOG" || fail "A's log does not say the array is fenced"
  grep -i "fenced\|lease" "$A_LOG" | head -5
  CAIRN_PID=$A_PID; stop_cairn
  [ "$CAIRN_STATUS" -ne 0 ] || fail "A stopped as if it still owned the array"
  grep -q "may no longer own it" "$A_LOG" || fail "A's stop: $(tail -3 "$A_LOG")"
  expect_eq "$(sha256sum "${M[@]}")" "$h1" "member files after A stopped"
  CAIRN_PID=$MPID; stop_cairn
}

# serve_refused WHAT SERVE-ARGS...: a second `cairn serve` with these arguments exits at
# start with a message naming WHAT; sets OUT.
serve_refused() {
  local what=$1 st=0
  shift
  OUT=$(timeout -k 5 60 "$CAIRN" serve --no-control --listen "unix:$WORK/second.sock" "$@" 2>&1 >/dev/null) || st=$?
  [ "$st" -ne 0 ] && [ "$st" -ne 124 ] || fail "a second serve $* was not refused (status $st): $OUT"
  expect_contains "$OUT" "$what" "the refusal"
  say "refused: $(printf '%s\n' "$OUT" | tail -1)"
}

# Remote exports used whole (LUKS, an LVM PV, an export served as it is) are owned like
# md members: the record is kept beside the export by the member server (its first bytes
# are the owner's data), a second host is refused, a clean stop releases, a paused owner
# replaced with --force cannot write a block.
t_whole_exports_owned() {
  need_tool nbdsh
  local KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000) key=$WORK/key out sum
  printf %s "whole export key" >"$key"
  rm -f "$SHM"/w*.img "$SHM"/w*.img.cairn-owner
  truncate -s 32M "$SHM/wvol.img" "$SHM/wpv.img" "$SHM/wraw.img"
  "$CAIRN" luks format -q "${KDF[@]}" --key-file "$key" "$SHM/wvol.img" >/dev/null
  "$CAIRN" lvm pvcreate "$SHM/wpv.img" >/dev/null
  "$CAIRN" lvm vgcreate wvg "$SHM/wpv.img" >/dev/null
  "$CAIRN" lvm lvcreate -n lv -L 8M wvg "$SHM/wpv.img" >/dev/null
  member_server "$SHM/wvol.img" "$SHM/wpv.img" "$SHM/wraw.img"
  local VOL=${URIS[0]} PV=${URIS[1]} RAW=${URIS[2]} MSOCK=$CAIRN_SOCK
  # Host A: the LUKS volume, the PV and the raw export, each taken over.
  start_cairn --no-control --key-file "$key" --owner-id host-a --luks "$VOL:sealed" \
    --lvm "$PV" "$RAW:raw"
  local A_PID=$CAIRN_PID A_SOCK=$CAIRN_SOCK A_LOG=$CAIRN_LOG
  nbdsh -u "$(unix_uri sealed)" -c 'h.pwrite(b"\xaa" * 4096, 0); h.flush()'
  nbdsh -u "$(unix_uri raw)" -c 'h.pwrite(b"\xab" * 4096, 0); h.flush()'
  [ -s "$SHM/wvol.img.cairn-owner" ] || fail "no record beside the LUKS export"
  out=$("$CAIRN" md owner "$VOL" "$RAW")
  say "$out"
  expect_lines "$out" "$VOL: generation 1, owner host-a/" "$RAW: generation 1, owner host-a/"
  head -c 6 "$SHM/wvol.img" | grep -q LUKS || fail "the LUKS header was overwritten"
  # The member server refuses writes without A's token, even at byte 0.
  out=$(nbdsh -u "nbd+unix:///m2?socket=$MSOCK" -c '
import nbd
try:
    h.pwrite(b"\xcc" * 4096, 8192); print("PLAIN WRITE")
except nbd.Error as e:
    print("refused", e.errno)' 2>&1) || true
  expect_contains "$out" "refused EPERM" "a plain client's write to an owned export"
  # Host B: each refused while A runs, naming A.
  serve_refused "owned by host-a/" --key-file "$key" --owner-id host-b --luks "$VOL:sealed"
  serve_refused "owned by host-a/" --owner-id host-b --lvm "$PV"
  serve_refused "owned by host-a/" --owner-id host-b "$RAW:raw"
  # Read-only opens claim nothing.
  start_cairn --no-control --read-only --key-file "$key" --owner-id host-b --luks "$VOL:ro"
  expect_eq "$(nbdsh -u "$(unix_uri ro)" -c 'print(h.pread(4096, 0) == b"\xaa" * 4096)')" True "read-only B reads A's data"
  stop_cairn
  # A stops cleanly: released; B takes each over without --force.
  CAIRN_PID=$A_PID; stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "A stops cleanly"
  out=$("$CAIRN" md owner "$VOL" "$PV" "$RAW")
  say "$out"
  [ "$(printf '%s\n' "$out" | grep -c ', released$')" = 3 ] || fail "A's clean stop did not release all three: $out"
  start_cairn --no-control --key-file "$key" --owner-id host-b --luks "$VOL:sealed" --lvm "$PV" "$RAW:raw"
  local B_PID=$CAIRN_PID
  expect_eq "$(nbdsh -u "$(unix_uri sealed)" -c 'print(h.pread(4096, 0) == b"\xaa" * 4096)')" True "B reads A's data"
  nbdsh -u "$(unix_uri wvg/lv)" -c 'h.pwrite(b"\xbb" * 4096, 0); h.flush()'
  CAIRN_PID=$B_PID; stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "B stops cleanly"
  # A paused owner: C serves the LUKS volume and the raw export, is stopped with SIGSTOP,
  # D takes over with --force and writes; C resumed cannot write a block.
  start_cairn --no-control --key-file "$key" --owner-id host-c --luks "$VOL:sealed" "$RAW:raw"
  local C_PID=$CAIRN_PID C_SOCK=$CAIRN_SOCK C_LOG=$CAIRN_LOG
  nbdsh -u "$(unix_uri sealed)" -c 'h.pwrite(b"\xc0" * 4096, 0); h.flush()'
  kill -STOP "$C_PID"
  serve_refused "--force" --key-file "$key" --owner-id host-d --luks "$VOL:sealed"
  start_cairn --no-control --force --key-file "$key" --owner-id host-d --luks "$VOL:sealed" "$RAW:raw"
  local D_PID=$CAIRN_PID
  nbdsh -u "$(unix_uri sealed)" -c 'h.pwrite(b"\xd0" * 4096, 4096); h.flush()'
  nbdsh -u "$(unix_uri raw)" -c 'h.pwrite(b"\xd1" * 4096, 4096); h.flush()'
  sum=$(sha256sum "$SHM/wvol.img" "$SHM/wraw.img")
  kill -CONT "$C_PID"
  local e
  for e in sealed raw; do
    out=$(nbdsh -u "nbd+unix:///$e?socket=$C_SOCK" -c '
import nbd
for i in range(8):
    try:
        h.pwrite(b"\xee" * 4096, 4096 * i); print("LATE WRITE", i)
    except nbd.Error as e:
        print("refused", e.errno)
try:
    h.flush(); print("flushed")
except nbd.Error as e:
    print("flush refused", e.errno)' 2>&1) || true
    say "$e: $out"
    case $out in *"LATE WRITE"*) fail "the paused owner wrote to $e after the takeover" ;; esac
    expect_contains "$out" "refused EPERM" "the paused owner's writes to $e"
  done
  sleep 1
  expect_eq "$(sha256sum "$SHM/wvol.img" "$SHM/wraw.img")" "$sum" "the member data after the paused owner's tries"
  no_block_of 0xee "$SHM/wraw.img" || fail "a write of the paused owner reached the raw export"
  CAIRN_PID=$C_PID; stop_cairn
  CAIRN_PID=$D_PID; stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "D stops cleanly"
  expect_eq "$(py -c "import sys; f=open(sys.argv[1],'rb'); f.seek(4096); print(f.read(4096)==b'\xd1'*4096)" "$SHM/wraw.img")" True "D's block on the raw export"
  CAIRN_PID=$MPID; stop_cairn
  rm -f "$SHM"/w*.img "$SHM"/w*.img.cairn-owner
}

# The same with --etcd: the export's lease comes first; a paused owner whose lease ran
# out is replaced without --force, and cannot write a block when it wakes.
t_whole_export_etcd() {
  need_tool nbdsh
  start_etcd
  rm -f "$SHM/wraw.img" "$SHM/wraw.img.cairn-owner"
  truncate -s 32M "$SHM/wraw.img"
  member_server "$SHM/wraw.img"
  local RAW=${URIS[0]} out
  start_cairn -v --no-control --etcd "$ETCD" --etcd-ttl 2 --owner-id host-a "$RAW:raw"
  local A_PID=$CAIRN_PID A_SOCK=$CAIRN_SOCK A_LOG=$CAIRN_LOG
  grep -q "took /cairn/exports/" "$A_LOG" || fail "A took no lease: $(cat "$A_LOG")"
  case $(cat "$A_LOG") in *"no lease was taken"*) fail "A says it took no lease" ;; esac
  nbdsh -u "$(unix_uri raw)" -c 'h.pwrite(b"\xaa" * 4096, 0); h.flush()'
  serve_refused "served by another host" --etcd "$ETCD" --etcd-ttl 2 --owner-id host-b "$RAW:raw"
  kill -STOP "$A_PID"
  sleep 4
  start_cairn --no-control --etcd "$ETCD" --etcd-ttl 2 --owner-id host-b "$RAW:raw"
  local B_PID=$CAIRN_PID
  nbdsh -u "$(unix_uri raw)" -c 'h.pwrite(b"\xbb" * 4096, 4096); h.flush()'
  kill -CONT "$A_PID"
  out=$(nbdsh -u "nbd+unix:///raw?socket=$A_SOCK" -c '
import nbd
for i in range(8):
    try:
        h.pwrite(b"\xee" * 4096, 4096 * i); print("LATE WRITE", i)
    except nbd.Error as e:
        print("refused", e.errno)' 2>&1) || true
  say "$out"
  case $out in *"LATE WRITE"*) fail "the paused owner wrote after its lease ran out" ;; esac
  expect_contains "$out" "refused EPERM" "the paused owner's writes"
  sleep 1
  no_block_of 0xee "$SHM/wraw.img" || fail "a write of the paused owner reached the export"
  CAIRN_PID=$B_PID; stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "B stops cleanly"
  expect_eq "$(py -c "import sys; f=open(sys.argv[1],'rb'); print(f.read(8192)==b'\xaa'*4096+b'\xbb'*4096)" "$SHM/wraw.img")" True "A's block, then B's"
  CAIRN_PID=$A_PID; stop_cairn
  CAIRN_PID=$MPID; stop_cairn
  rm -f "$SHM/wraw.img" "$SHM/wraw.img.cairn-owner"
}

# Owner records that let go (issue 30 item 7): a failed `lvm lvcreate` over remote PVs
# leaves both records released (it left them "owned ... not released", so the next
# verb or host needed --force or the owner files deleted by hand); a daemon that removed
# the LV export it served from them reopens one of the PVs in another shape (served
# whole) instead of meeting its own claim; `cairn md owner` names the holder, and
# `--release` (`--force` for an owner that did not release) gives a killed owner's
# records up; the lvm verbs take over from it with --force, as serve does.
t_owners_let_go() {
  need_tool curl
  local out st ctl=$WORK/own-ctl.sock
  rm -f "$SHM"/lg*.img "$SHM"/lg*.img.cairn-owner
  truncate -s 32M "$SHM/lg0.img" "$SHM/lg1.img"
  member_server "$SHM/lg0.img" "$SHM/lg1.img"
  local P0=${URIS[0]} P1=${URIS[1]} MEMBER_PID=$CAIRN_PID
  "$CAIRN" lvm vgcreate vgl "$P0" "$P1" >/dev/null
  "$CAIRN" lvm lvcreate -n a -L 8M vgl "$P0" "$P1" >/dev/null
  st=0; out=$("$CAIRN" lvm lvcreate -n big -L 1G vgl "$P0" "$P1" 2>&1) || st=$?
  [ "$st" != 0 ] || fail "lvcreate of 1G on 64M of PVs succeeded"
  say "refused: $out"
  out=$("$CAIRN" md owner "$P0" "$P1")
  say "$out"
  [ "$(printf '%s\n' "$out" | grep -c ', released$')" = 2 ] ||
    fail "the failed lvcreate left the PVs' owner records not released: $out"
  # A daemon serves the LV, the export is removed, and the same daemon serves a PV
  # whole: its own claim on the PVs was given up with the export.
  start_cairn --control "$ctl" --owner-id host-d --lvm "$P0,$P1"
  local D_PID=$CAIRN_PID
  out=$("$CAIRN" md owner "$P0")
  expect_contains "$out" "owner host-d/" "the daemon holds the PV"
  case $out in *", released") fail "the serving daemon's record says released: $out" ;; esac
  st=$(curl -s -o "$WORK/api.json" -w '%{http_code}' --unix-socket "$ctl" -X DELETE "http://cairn/v1/exports/vgl/a")
  [ "$st" = 200 ] || fail "DELETE vgl/a: HTTP $st: $(cat "$WORK/api.json")"
  st=$(curl -s -o "$WORK/api.json" -w '%{http_code}' --unix-socket "$ctl" -X POST \
    -H 'Content-Type: application/json' --data-binary "{\"name\": \"pv0\", \"path\": \"$P0\"}" \
    "http://cairn/v1/exports")
  [ "$st" = 201 ] || fail "the daemon could not reopen its removed LV's PV whole: HTTP $st: $(cat "$WORK/api.json")"
  CAIRN_PID=$D_PID; stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "the daemon stops cleanly"
  # An owner killed with SIGKILL leaves its records; `md owner --release` names it and
  # keeps them without --force, releases them with it; the next owner needs no --force.
  start_cairn --no-control --owner-id host-k --lvm "$P0,$P1"
  stop_cairn KILL
  st=0; out=$("$CAIRN" md owner --release "$P0" "$P1" 2>&1) || st=$?
  [ "$st" != 0 ] || fail "--release of a killed owner's records without --force: $out"
  expect_contains "$out" "owned by host-k/" "--release names the holder"
  expect_contains "$out" "add --force" "--release without --force"
  out=$("$CAIRN" md owner --release --force "$P0" "$P1") || fail "--release --force: $out"
  say "$out"
  expect_contains "$out" "$P0: released (it was owned by host-k/" "--release --force"
  expect_contains "$out" "$P1: released (it was owned by host-k/" "--release --force"
  out=$("$CAIRN" md owner "$P0" "$P1")
  [ "$(printf '%s\n' "$out" | grep -c ', released$')" = 2 ] || fail "not released: $out"
  start_cairn --no-control --owner-id host-n --lvm "$P0,$P1"
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "the next owner starts without --force and stops cleanly"
  # The lvm verbs take the same --force: refused naming a killed owner, then taken over.
  start_cairn --no-control --owner-id host-q --lvm "$P0,$P1"
  stop_cairn KILL
  st=0; out=$("$CAIRN" lvm lvcreate -n b -L 4M vgl "$P0" "$P1" 2>&1) || st=$?
  [ "$st" != 0 ] || fail "lvcreate over a killed owner's PVs without --force succeeded"
  expect_contains "$out" "owned by host-q/" "lvcreate names the owner"
  expect_contains "$out" "--force" "lvcreate refusal"
  "$CAIRN" lvm lvcreate --force -n b -L 4M vgl "$P0" "$P1" >/dev/null || fail "lvcreate --force"
  out=$("$CAIRN" md owner "$P0" "$P1")
  [ "$(printf '%s\n' "$out" | grep -c ', released$')" = 2 ] || fail "lvcreate --force left: $out"
  # Released exports used whole are nobody's: a plain client (md create) writes them
  # again (it got EPERM for ever: "writes need the owner's fence token").
  "$CAIRN" md create --level 1 --raid-devices 2 --force "$P0" "$P1" >/dev/null 2>"$WORK/mdc.err" ||
    fail "md create over released former PVs: $(cat "$WORK/mdc.err")"
  CAIRN_PID=$MEMBER_PID; stop_cairn
  rm -f "$SHM"/lg*.img "$SHM"/lg*.img.cairn-owner
}

run_test member_server_fences t_member_server_fences
run_test fence_off_and_stacks t_fence_off_and_stacks
run_test etcd_lease t_etcd_lease
run_test etcd_tls t_etcd_tls
run_test etcd_takeover_over_member_servers t_etcd_takeover_over_member_servers
run_test etcd_lease_lost_stops_md_writes t_etcd_lease_lost_stops_md_writes
run_test whole_exports_owned t_whole_exports_owned
run_test whole_export_etcd t_whole_export_etcd
run_test owners_let_go t_owners_let_go
finish
