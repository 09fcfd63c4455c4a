#!/usr/bin/env bash
# NBD over TLS with cairn serve as the server: libnbd's tools (nbdinfo, nbdcopy, nbdsh)
# and qemu-img as clients, X.509 and PSK; wrong PSK and wrong CA refused; --tls require
# answers a plaintext client with nothing but "TLS required" (no export list, no data);
# --tls on serves plaintext clients too; a non-loopback listener needs --tls require or
# --insecure-no-tls. TLS 1.2 with strong suites only (openssl s_client); Debian's
# nbd-client over TLS 1.2; no anonymous X.509 clients off loopback unless
# --tls-anonymous-clients. cairn's own client against nbdkit --tls=require and qemu-nbd
# --tls-creds is crates/nbd/tests/tls.rs.
#
# Credentials: tests/interop/tls/make-creds.sh (certtool, psktool) into $WORK/creds.
. "$(dirname "$0")/lib.sh"

C=$WORK/creds

creds() {
  need_tool certtool psktool
  [ -d "$C/pki" ] || bash "$INTEROP_DIR/tls/make-creds.sh" "$C"
}

# serve_tls SERVE-ARGS...: cairn serve on $SHM/vol.img (16 MiB of random data) with its own
# control socket.
serve_tls() {
  [ -f "$SHM/vol.img" ] || random_file "$SHM/vol.img" $((16 << 20))
  start_cairn --control "$WORK/control$((CAIRN_N + 1)).sock" "$@" "$SHM/vol.img:vol"
}

# psk_tcp / psk_unix USER [FILE]: a PSK URI for user USER. The user goes in front of the
# host as well as in tls-username=: libnbd 1.14 reads only the former.
psk_tcp() {
  printf 'nbds://%s@127.0.0.1:%s/vol?tls-psk-file=%s&tls-username=%s' \
    "$1" "$CAIRN_PORT" "${2:-$C/psk/keys.psk}" "$1"
}
psk_unix() {
  printf 'nbds+unix://%s@/vol?socket=%s&tls-psk-file=%s&tls-username=%s' \
    "$1" "$CAIRN_SOCK" "${2:-$C/psk/keys.psk}" "$1"
}
tls_tcp() { printf 'nbds://127.0.0.1:%s/vol?%s' "$CAIRN_PORT" "$1"; }
tls_unix() { printf 'nbds+unix:///vol?socket=%s&%s' "$CAIRN_SOCK" "$1"; }

# refused CMD...: CMD fails (and does not hang).
refused() {
  local st=0
  timeout -k 5 60 "$@" >"$WORK/refused.out" 2>&1 || st=$?
  [ "$st" -ne 0 ] || fail "'$*' succeeded; expected a refusal"
  [ "$st" -ne 124 ] || fail "'$*' hung"
  say "refused as expected: $(tail -1 "$WORK/refused.out")"
}

t_psk_nbdinfo() {
  need_tool nbdinfo
  creds
  serve_tls --tls require --tls-psk "$C/psk/keys.psk"
  py -c 'import json,sys; j=json.load(open(sys.argv[1])); t=j["tls"];
assert t == {"mode": "required", "credentials": "PSK"}, t
assert all(u.startswith("nbds") and "tls-psk-file=" in u for u in j["exports"][0]["uris"]), j["exports"][0]["uris"]' "$CAIRN_JSON"
  for user in alice bob; do
    expect_eq "$(nbdinfo --size "$(psk_tcp $user)")" $((16 << 20)) "nbdinfo --size as $user"
  done
  expect_eq "$(nbdinfo --size "$(psk_unix alice)")" $((16 << 20)) "nbdinfo over the Unix socket"
  refused nbdinfo --size "$(psk_tcp alice "$C/wrong/keys.psk")"
  refused nbdinfo --size "$(psk_tcp carol)"
}

t_x509_nbdinfo() {
  need_tool nbdinfo
  creds
  serve_tls --tls require --tls-certificates "$C/pki"
  py -c 'import json,sys; t=json.load(open(sys.argv[1]))["tls"]
assert t == {"mode": "required", "credentials": "X.509", "client_certificates": "off loopback"}, t' "$CAIRN_JSON"
  expect_eq "$(nbdinfo --size "$(tls_tcp "tls-certificates=$C/pki")")" $((16 << 20)) "nbdinfo X.509"
  nbdinfo "$(tls_tcp "tls-certificates=$C/pki")" | tee "$WORK/info"
  grep -q 'export-size: 16777216' "$WORK/info" || fail "nbdinfo output"
  # A client that trusts another CA does not accept the server's certificate.
  refused nbdinfo --size "$(tls_tcp "tls-certificates=$C/other")"
}

t_x509_verify_peer() {
  need_tool nbdinfo
  creds
  serve_tls --tls-certificates "$C/pki" --tls-verify-peer
  # --tls defaults to require when credentials are given.
  py -c 'import json,sys; t=json.load(open(sys.argv[1]))["tls"]
assert t["mode"] == "required", t' "$CAIRN_JSON"
  expect_eq "$(nbdinfo --size "$(tls_tcp "tls-certificates=$C/pki")")" $((16 << 20)) "client certificate"
  # No client certificate: refused by the server.
  refused nbdinfo --size "$(tls_tcp "tls-certificates=$C/ca-only")"
  # A client that trusts the right CA but shows a certificate from another: refused.
  refused nbdinfo --size "$(tls_tcp "tls-certificates=$C/mixed")"
  grep -q "TLS handshake failed" "$CAIRN_LOG" || fail "cairn did not log the refusal: $(cat "$CAIRN_LOG")"
}

t_require_speaks_no_plaintext() {
  need_tool nbdinfo nbdsh
  creds
  serve_tls --tls require --tls-psk "$C/psk/keys.psk"
  refused nbdinfo --size "$(tcp_uri vol)"
  grep -qi "tls" "$WORK/refused.out" || fail "nbdinfo's refusal does not mention TLS: $(cat "$WORK/refused.out")"
  refused nbdinfo --list "$(tcp_uri vol)"
  if grep -q '"vol"\|export=\|export-name' "$WORK/refused.out"; then
    fail "an export name leaked before TLS: $(cat "$WORK/refused.out")"
  fi
  # Option by option, in libnbd's option mode: every answer is TLS_REQD.
  nbdsh -c "
import nbd
h.set_opt_mode(True)
h.connect_uri('$(tcp_uri vol)')
names = []
for what, call in [('list', lambda: h.opt_list(lambda n, d: names.append(n))),
                   ('info', lambda: h.opt_info()),
                   ('go', lambda: h.opt_go())]:
    try:
        call()
        print(what, 'answered')
    except nbd.Error as e:
        print(what, 'refused:', e)
assert names == [], names
print('names:', names)
" | tee "$WORK/opts"
  for what in list info go; do
    grep -q "^$what refused" "$WORK/opts" || fail "$what was not refused before TLS"
  done
}

t_tls_on_serves_both() {
  need_tool nbdinfo
  creds
  serve_tls --tls on --tls-psk "$C/psk/keys.psk"
  py -c 'import json,sys; t=json.load(open(sys.argv[1]))["tls"]
assert t == {"mode": "on", "credentials": "PSK"}, t' "$CAIRN_JSON"
  expect_eq "$(nbdinfo --size "$(tcp_uri vol)")" $((16 << 20)) "plaintext client"
  expect_eq "$(nbdinfo --size "$(psk_tcp alice)")" $((16 << 20)) "TLS client"
}

t_nbdcopy() {
  need_tool nbdcopy
  creds
  random_file "$SHM/src.img" $((16 << 20))
  for mode in psk x509; do
    if [ $mode = psk ]; then
      serve_tls --tls-psk "$C/psk/keys.psk"
      up=$(psk_tcp bob) down=$(psk_unix bob)
    else
      serve_tls --tls-certificates "$C/pki"
      up=$(tls_tcp "tls-certificates=$C/pki") down=$(tls_unix "tls-certificates=$C/pki")
    fi
    timeout -k 5 120 nbdcopy "$SHM/src.img" "$up"
    rm -f "$SHM/back.img"
    timeout -k 5 120 nbdcopy "$down" "$SHM/back.img"
    cmp "$SHM/src.img" "$SHM/back.img" || fail "$mode: data read back differs"
    stop_cairn
    cmp "$SHM/src.img" "$SHM/vol.img" || fail "$mode: the file differs"
    rm -f "$SHM/vol.img"
    say "nbdcopy $mode: ok"
  done
}

t_qemu_img() {
  need_tool qemu-img
  creds
  random_file "$SHM/src.img" $((8 << 20))
  for mode in psk x509; do
    if [ $mode = psk ]; then
      serve_tls --tls-psk "$C/psk/keys.psk"
      obj="tls-creds-psk,id=tls0,endpoint=client,dir=$C/psk,username=alice"
    else
      serve_tls --tls-certificates "$C/pki" --tls-verify-peer
      obj="tls-creds-x509,id=tls0,endpoint=client,dir=$C/pki"
    fi
    img="driver=nbd,host=127.0.0.1,port=$CAIRN_PORT,export=vol,tls-creds=tls0"
    timeout -k 5 60 qemu-img info --object "$obj" --image-opts "$img" | tee "$WORK/qinfo"
    grep -q "virtual size: 16 MiB" "$WORK/qinfo" || fail "$mode: qemu-img info"
    timeout -k 5 120 qemu-img convert -n -f raw --object "$obj" --target-image-opts \
      "$SHM/src.img" "$img"
    rm -f "$SHM/back.img"
    timeout -k 5 120 qemu-img convert --object "$obj" --image-opts "$img" -O raw "$SHM/back.img"
    cmp -n $((8 << 20)) "$SHM/src.img" "$SHM/back.img" || fail "$mode: qemu read back other data"
    stop_cairn
    rm -f "$SHM/vol.img"
    say "qemu-img $mode: ok"
  done
  # The wrong PSK: qemu is refused.
  serve_tls --tls-psk "$C/psk/keys.psk"
  refused qemu-img info --object "tls-creds-psk,id=tls0,endpoint=client,dir=$C/wrong,username=alice" \
    --image-opts "driver=nbd,host=127.0.0.1,port=$CAIRN_PORT,export=vol,tls-creds=tls0"
}

# nbdkit as the client: its nbd plugin reaches cairn over TLS and re-exports in plaintext
# on a private Unix socket, which nbdinfo reads (--run).
t_nbdkit_client() {
  need_tool nbdkit nbdinfo
  creds
  for mode in psk x509; do
    if [ $mode = psk ]; then
      serve_tls --tls-psk "$C/psk/keys.psk"
      tls=(tls=require "tls-psk=$C/psk/keys.psk" tls-username=alice)
    else
      serve_tls --tls-certificates "$C/pki" --tls-verify-peer
      tls=(tls=require "tls-certificates=$C/pki")
    fi
    got=$(timeout -k 5 60 nbdkit -U - nbd hostname=127.0.0.1 port="$CAIRN_PORT" export=vol \
      "${tls[@]}" --run 'nbdinfo --size "$uri"')
    expect_eq "$got" $((16 << 20)) "nbdkit ($mode) through cairn"
    stop_cairn
  done
  # The wrong key: nbdkit's client is refused.
  serve_tls --tls-psk "$C/psk/keys.psk"
  refused nbdkit -U - nbd hostname=127.0.0.1 port="$CAIRN_PORT" export=vol tls=require \
    "tls-psk=$C/wrong/keys.psk" tls-username=alice --run 'nbdinfo --size "$uri"'
  grep -q "TLS handshake failed" "$CAIRN_LOG" || fail "cairn did not log the refusal: $(cat "$CAIRN_LOG")"
}

# cairn's own NBD_OPT_LIST / NBD_OPT_INFO (`cairn nbd ls|info`) against servers that
# require TLS (PSK): a cairn serve and an nbdkit. With an nbds:// URI they STARTTLS first
# and are answered; with nbd:// they are refused with "requires TLS"; a wrong key is
# refused too.
t_nbd_ls_tls() {
  need_tool nbdkit
  creds
  serve_tls --tls require --tls-psk "$C/psk/keys.psk"
  timeout -k 5 30 "$CAIRN" nbd ls "$(psk_tcp alice)" >"$WORK/ls" || fail "nbd ls over TLS: $(cat "$WORK/ls")"
  cat "$WORK/ls"
  grep -q "^vol	$((16 << 20))	" "$WORK/ls" || fail "nbd ls output: $(cat "$WORK/ls")"
  timeout -k 5 30 "$CAIRN" --json nbd info "$(psk_unix bob)" >"$WORK/info" || fail "nbd info over TLS"
  py -c 'import json,sys; j=json.load(open(sys.argv[1]))[0]
assert j["name"] == "vol" and j["size"] == 16 << 20, j' "$WORK/info"
  refused "$CAIRN" nbd ls "nbd://127.0.0.1:$CAIRN_PORT/"
  grep -q "requires TLS" "$WORK/refused.out" || fail "no clear refusal: $(cat "$WORK/refused.out")"
  refused "$CAIRN" nbd info "$(tcp_uri vol)"
  grep -q "requires TLS" "$WORK/refused.out" || fail "no clear refusal: $(cat "$WORK/refused.out")"
  refused "$CAIRN" nbd ls "$(psk_tcp alice "$C/wrong/keys.psk")"
  stop_cairn
  # nbdkit --tls=require: the same.
  [ -f "$SHM/vol.img" ] || random_file "$SHM/vol.img" $((16 << 20))
  local sock=$WORK/nbdkit-tls.sock
  nbdkit -f -U "$sock" --exportname=vol --tls=require --tls-psk="$C/psk/keys.psk" \
    file "$SHM/vol.img" >"$WORK/nbdkit.log" 2>&1 &
  register pid $!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || fail "nbdkit did not start: $(cat "$WORK/nbdkit.log")"
  local uri="nbds+unix:///vol?socket=$sock&tls-psk-file=$C/psk/keys.psk&tls-username=alice"
  timeout -k 5 30 "$CAIRN" nbd info "$uri" >"$WORK/info" || fail "nbd info to nbdkit over TLS"
  grep -q "	$((16 << 20))	" "$WORK/info" || fail "nbd info output: $(cat "$WORK/info")"
  timeout -k 5 30 "$CAIRN" nbd ls "$uri" >"$WORK/ls" || fail "nbd ls to nbdkit over TLS"
  cat "$WORK/ls"
  refused "$CAIRN" nbd ls "nbd+unix:///vol?socket=$sock"
  grep -q "requires TLS" "$WORK/refused.out" || fail "no clear refusal: $(cat "$WORK/refused.out")"
}

# A TCP listener off loopback: refused without --tls require, unless --insecure-no-tls.
t_non_loopback() {
  creds
  [ -f "$SHM/vol.img" ] || truncate -s 16M "$SHM/vol.img"
  local st=0
  timeout -k 5 30 "$CAIRN" serve --no-control --listen tcp:0.0.0.0:0 "$SHM/vol.img" \
    >"$WORK/out" 2>"$WORK/err" || st=$?
  [ "$st" -ne 0 ] && [ "$st" -ne 124 ] || fail "serve on 0.0.0.0 without TLS: status $st"
  grep -q -- "--insecure-no-tls" "$WORK/err" || fail "no hint: $(cat "$WORK/err")"
  st=0
  timeout -k 5 30 "$CAIRN" serve --no-control --listen tcp:0.0.0.0:0 --tls on \
    --tls-psk "$C/psk/keys.psk" "$SHM/vol.img" >"$WORK/out" 2>"$WORK/err" || st=$?
  [ "$st" -ne 0 ] && [ "$st" -ne 124 ] || fail "--tls on is not enough off loopback: status $st"
  # Either of these starts; the announcement says which.
  start_cairn --control "$WORK/ctl-a.sock" --listen tcp:0.0.0.0:0 --insecure-no-tls "$SHM/vol.img:vol"
  py -c 'import json,sys; assert json.load(open(sys.argv[1]))["tls"]["mode"] == "off"' "$CAIRN_JSON"
  stop_cairn
  start_cairn --control "$WORK/ctl-b.sock" --listen tcp:0.0.0.0:0 --tls-psk "$C/psk/keys.psk" "$SHM/vol.img:vol"
  py -c 'import json,sys; assert json.load(open(sys.argv[1]))["tls"]["mode"] == "required"' "$CAIRN_JSON"
  stop_cairn
  # The human announcement says it too.
  "$CAIRN" serve --no-control --listen "unix:$WORK/h.sock" --tls-psk "$C/psk/keys.psk" \
    "$SHM/vol.img:vol" >"$WORK/text" 2>"$WORK/text.err" &
  local pid=$!
  register pid "$pid"
  for _ in $(seq 100); do grep -q "Stop with" "$WORK/text" 2>/dev/null && break; sleep 0.1; done
  grep -q "TLS: required (PSK)" "$WORK/text" || fail "announcement: $(cat "$WORK/text")"
  kill -TERM "$pid"
  wait "$pid" || true
}

# starttls_relay: listens on a free port of 127.0.0.1 (set in $RELAY); each connection
# gets its own to cairn's
# TCP port, where the relay does the plaintext NBD part (newstyle, NBD_OPT_STARTTLS, its
# ACK) and then passes bytes both ways, so a plain TLS tool (openssl s_client) does the
# TLS handshake with cairn.
starttls_relay() {
  rm -f "$WORK/relay.port"
  py - "$WORK/relay.port" "$CAIRN_PORT" <<'EOF' &
import socket, struct, sys, threading
lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0)); lst.listen(8)
open(sys.argv[1] + ".tmp", "w").write(str(lst.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
def recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
def serve(c):
    u = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    recvn(u, 18)
    u.sendall(struct.pack(">I", 3) + struct.pack(">QII", 0x49484156454F5054, 5, 0))
    magic, opt, typ, ln = struct.unpack(">QIII", recvn(u, 20))
    assert typ == 1 and ln == 0, (typ, ln)
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    pump(u, c)
while True:
    c, _ = lst.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
EOF
  register pid $!
  local i
  for i in $(seq 50); do [ -s "$WORK/relay.port" ] && break; sleep 0.1; done
  RELAY=$(cat "$WORK/relay.port" 2>/dev/null) || fail "the STARTTLS relay did not start"
}

# s_client ARGS...: openssl s_client through the relay on $RELAY; output in $WORK/s_client.out.
s_client() {
  timeout -k 5 30 openssl s_client -connect "127.0.0.1:$RELAY" -servername localhost \
    -CAfile "$C/pki/ca-cert.pem" "$@" </dev/null >"$WORK/s_client.out" 2>&1
}

# TLS 1.2 with strong suites only, through openssl s_client after a STARTTLS relay:
# ECDHE with AES-GCM or ChaCha20 (and TLS 1.3) accepted; CBC, RSA or DHE key exchange
# and TLS 1.1 refused.
t_tls12_suites() {
  need_tool openssl
  creds
  serve_tls --tls-certificates "$C/pki"
  starttls_relay
  s_client -tls1_2 -cipher ECDHE-RSA-AES128-GCM-SHA256 ||
    fail "TLS 1.2 with ECDHE-RSA-AES128-GCM-SHA256 refused: $(tail -5 "$WORK/s_client.out")"
  grep -q "Protocol *: TLSv1.2" "$WORK/s_client.out" || fail "not TLS 1.2: $(grep -i protocol "$WORK/s_client.out")"
  grep -q "Cipher is ECDHE-RSA-AES128-GCM-SHA256" "$WORK/s_client.out" ||
    fail "cipher: $(grep -i cipher "$WORK/s_client.out")"
  s_client -tls1_2 -cipher ECDHE-RSA-CHACHA20-POLY1305 || fail "TLS 1.2 with ChaCha20-Poly1305 refused"
  s_client -tls1_3 || fail "TLS 1.3 refused"
  local s
  for s in ECDHE-RSA-AES128-SHA ECDHE-RSA-AES256-SHA384 AES128-GCM-SHA256 AES256-SHA \
    DHE-RSA-AES128-GCM-SHA256; do
    if s_client -tls1_2 -cipher "$s"; then
      fail "TLS 1.2 with the weak suite $s was accepted"
    fi
    say "refused as expected: TLS 1.2 $s"
  done
  if s_client -tls1_1 -cipher 'DEFAULT:@SECLEVEL=0'; then
    fail "TLS 1.1 was accepted"
  fi
  grep -q "TLS handshake failed" "$CAIRN_LOG" || fail "cairn did not log the refusals"
}

# Debian's nbd-client (GnuTLS, TLS 1.2): lists the exports over TLS with X.509, and with a
# device gets through the whole negotiation over TLS; without the kernel's nbd module that
# is as far as it goes, so that is what is checked: nbd-client prints the size, cairn logs
# the export it chose for the client.
t_nbd_client() {
  need_tool nbd-client
  creds
  # Info lines: the protocol each TLS session agreed and the export each client chose.
  RUST_LOG=warn,cairn_nbd=info serve_tls --tls-certificates "$C/pki"
  local tls=(-cacertfile "$C/pki/ca-cert.pem" -certfile "$C/pki/client-cert.pem" -keyfile "$C/pki/client-key.pem" -tlshostname localhost)
  timeout -k 5 30 nbd-client -l 127.0.0.1 "$CAIRN_PORT" "${tls[@]}" >"$WORK/list" 2>&1 ||
    fail "nbd-client -l over TLS: $(cat "$WORK/list")"
  cat "$WORK/list"
  grep -Eq "^vol(:|$)" "$WORK/list" || fail "nbd-client -l did not list vol: $(cat "$WORK/list")"
  grep -q "TLSv1.2" "$CAIRN_LOG" || fail "nbd-client did not speak TLS 1.2: $(grep TLS "$CAIRN_LOG")"
  # Trusting another CA, it refuses the server.
  refused nbd-client -l 127.0.0.1 "$CAIRN_PORT" -cacertfile "$C/other/ca-cert.pem" -tlshostname localhost
  # The whole negotiation up to the device. nbd-client opens the device first, so a
  # plain file stands in for /dev/nbd0: the negotiation runs, and the first ioctl on it
  # (NBD_SET_SOCK) fails, which is where the kernel module would take over.
  : >"$WORK/fake-nbd0"
  local st=0
  timeout -k 5 30 nbd-client 127.0.0.1 "$CAIRN_PORT" "$WORK/fake-nbd0" -N vol -nonetlink "${tls[@]}" \
    >"$WORK/connect" 2>&1 || st=$?
  say "NOTE: nbd-client 127.0.0.1 (a file for /dev/nbd0) -N vol: status $st: $(tail -2 "$WORK/connect" | tr '\n' ' ')"
  for _ in $(seq 50); do grep -q 'export "vol"' "$CAIRN_LOG" && break; sleep 0.1; done
  grep -q 'export "vol"' "$CAIRN_LOG" || fail "nbd-client did not finish the negotiation: $(cat "$WORK/connect")"
  grep -q "size = 16MB" "$WORK/connect" || fail "nbd-client did not get the size: $(cat "$WORK/connect")"
}

# X.509 without --tls-verify-peer: a client off loopback (here 10.231.200.1 on the
# namespace's lo: not a loopback address) must present a certificate the CA signed; on
# loopback none is asked. --tls-anonymous-clients lets anyone in, and the announcement
# says so; without ca-cert.pem and without that flag, an off-loopback listener refuses to
# start.
t_anonymous_off_loopback() {
  need_root
  need_tool ip nbd-client
  creds
  local ns=crtls$$ ip=10.231.200.1
  ip netns add "$ns" || fail "ip netns add $ns"
  register netns "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$ip/32" dev lo
  [ -f "$SHM/vol.img" ] || random_file "$SHM/vol.img" $((16 << 20))
  local list=(ip netns exec "$ns" timeout -k 5 30 nbd-client -l)
  CAIRN_WRAP="ip netns exec $ns" start_cairn --control "$WORK/ctl-n1.sock" \
    --listen "tcp:$ip:10809" --tls-certificates "$C/pki" "$SHM/vol.img:vol"
  refused "${list[@]}" "$ip" 10809 -cacertfile "$C/pki/ca-cert.pem" -tlshostname localhost
  py -c 'import json,sys; t=json.load(open(sys.argv[1]))["tls"]
assert t["client_certificates"] == "off loopback", t' "$CAIRN_JSON"
  "${list[@]}" "$ip" 10809 -cacertfile "$C/pki/ca-cert.pem" -certfile "$C/pki/client-cert.pem" \
    -keyfile "$C/pki/client-key.pem" -tlshostname localhost >"$WORK/list" 2>&1 ||
    fail "a client with a certificate off loopback: $(cat "$WORK/list")"
  grep -Eq "^vol(:|$)" "$WORK/list" || fail "list: $(cat "$WORK/list")"
  # A certificate from another CA is no better than none.
  refused "${list[@]}" "$ip" 10809 -cacertfile "$C/pki/ca-cert.pem" -certfile "$C/other/client-cert.pem" \
    -keyfile "$C/other/client-key.pem" -tlshostname localhost
  # On loopback (the same server, 127.0.0.1 in the namespace) no certificate is asked.
  "${list[@]}" 127.0.0.1 "$CAIRN_PORT" -cacertfile "$C/pki/ca-cert.pem" -tlshostname localhost >"$WORK/list" 2>&1 ||
    fail "an anonymous client on loopback: $(cat "$WORK/list")"
  stop_cairn
  # Said out loud: anonymous clients off loopback are served, and the announcement says so.
  CAIRN_WRAP="ip netns exec $ns" start_cairn --control "$WORK/ctl-n2.sock" \
    --listen "tcp:$ip:10809" --tls-certificates "$C/pki" --tls-anonymous-clients "$SHM/vol.img:vol"
  py -c 'import json,sys; t=json.load(open(sys.argv[1]))["tls"]
assert t["client_certificates"] == "none", t' "$CAIRN_JSON"
  "${list[@]}" "$ip" 10809 -cacertfile "$C/pki/ca-cert.pem" -tlshostname localhost >"$WORK/list" 2>&1 ||
    fail "--tls-anonymous-clients: an anonymous client off loopback: $(cat "$WORK/list")"
  stop_cairn
  ip netns exec "$ns" "$CAIRN" serve --no-control --listen "unix:$WORK/h.sock" \
    --listen "tcp:$ip:10809" --tls-certificates "$C/pki" --tls-anonymous-clients \
    "$SHM/vol.img:vol" >"$WORK/text" 2>"$WORK/text.err" &
  local pid=$!
  register pid "$pid"
  for _ in $(seq 100); do grep -q "Stop with" "$WORK/text" 2>/dev/null && break; sleep 0.1; done
  grep -q "TLS clients: ANONYMOUS" "$WORK/text" || fail "announcement: $(cat "$WORK/text")"
  kill -TERM "$pid"
  wait "$pid" || true
  # No ca-cert.pem to check client certificates with: refused, naming both ways out.
  mkdir -p "$WORK/noca"
  cp "$C/pki/server-cert.pem" "$C/pki/server-key.pem" "$WORK/noca/"
  local st=0
  ip netns exec "$ns" timeout -k 5 30 "$CAIRN" serve --no-control --listen "tcp:$ip:10809" \
    --tls-certificates "$WORK/noca" "$SHM/vol.img:vol" >"$WORK/out" 2>"$WORK/err" || st=$?
  [ "$st" -ne 0 ] && [ "$st" -ne 124 ] || fail "served off loopback with no way to check clients: status $st"
  grep -q -- "--tls-anonymous-clients" "$WORK/err" || fail "no hint: $(cat "$WORK/err")"
  cat "$WORK/err"
}

run_test psk-nbdinfo t_psk_nbdinfo
run_test x509-nbdinfo t_x509_nbdinfo
run_test x509-verify-peer t_x509_verify_peer
run_test require-speaks-no-plaintext t_require_speaks_no_plaintext
run_test tls-on-serves-both t_tls_on_serves_both
run_test nbdcopy t_nbdcopy
run_test qemu-img t_qemu_img
run_test nbdkit-client t_nbdkit_client
run_test non-loopback t_non_loopback
run_test nbd-ls-tls t_nbd_ls_tls
run_test tls12-suites t_tls12_suites
run_test nbd-client t_nbd_client
run_test anonymous-off-loopback t_anonymous_off_loopback
finish
