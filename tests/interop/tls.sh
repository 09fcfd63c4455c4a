#!/usr/bin/env bash
# NBD over TLS with cairn serve as the server: libnbd's tools (nbdinfo, nbdcopy, nbdsh)
# and qemu-img as clients, X.509 and PSK; wrong PSK and wrong CA refused; --tls require
# answers a plaintext client with nothing but "TLS required" (no export list, no data);
# --tls on serves plaintext clients too; a non-loopback listener needs --tls require or
# --insecure-no-tls. cairn's own client against nbdkit --tls=require and qemu-nbd
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
assert t == {"mode": "required", "credentials": "X.509"}, t' "$CAIRN_JSON"
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
finish
