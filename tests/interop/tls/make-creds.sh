#!/usr/bin/env bash
# make-creds.sh DIR: throwaway TLS credentials for the tests, made with GnuTLS's certtool
# and psktool (gnutls-bin), laid out as nbdkit, qemu and libnbd read them:
#
#   DIR/pki/      ca-cert.pem, server-cert.pem + server-key.pem (CN localhost, SAN
#                 localhost and 127.0.0.1), client-cert.pem + client-key.pem, all from one CA
#   DIR/ca-only/  ca-cert.pem alone: a client that trusts the CA but has no certificate
#   DIR/other/    the same layout from another CA: trusting it is trusting the wrong CA
#   DIR/mixed/    trusts the right CA, but its client certificate is from the other one
#   DIR/psk/keys.psk   users alice and bob (qemu's tls-creds-psk reads DIR/psk/keys.psk)
#   DIR/wrong/keys.psk alice with another key
#
# Valid for two days; nothing here protects anything real.
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"

certtool_q() { certtool "$@" >/dev/null 2>&1; }

make_ca() { # OUT-DIR NAME
  mkdir -p "$1"
  printf 'cn = %s\nca\ncert_signing_key\nexpiration_days = 2\n' "$2" >"$1/ca.info"
  certtool_q --generate-privkey --key-type=ecdsa --outfile "$1/ca-key.pem"
  certtool_q --generate-self-signed --load-privkey "$1/ca-key.pem" \
    --template "$1/ca.info" --outfile "$1/ca-cert.pem"
}

make_leaf() { # OUT-DIR server|client
  local d=$1 who=$2
  if [ "$who" = server ]; then
    printf 'organization = cairn tests\ncn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$d/$who.info"
  else
    printf 'organization = cairn tests\ncn = cairn-test-client\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$d/$who.info"
  fi
  certtool_q --generate-privkey --key-type=rsa --bits=2048 --outfile "$d/$who-key.pem"
  certtool_q --generate-certificate --load-privkey "$d/$who-key.pem" \
    --load-ca-certificate "$d/ca-cert.pem" --load-ca-privkey "$d/ca-key.pem" \
    --template "$d/$who.info" --outfile "$d/$who-cert.pem"
}

for d in pki other; do
  make_ca "$d" "cairn test CA ($d)"
  make_leaf "$d" server
  make_leaf "$d" client
  chmod 600 "$d"/*-key.pem
done
mkdir -p ca-only
cp pki/ca-cert.pem ca-only/
mkdir -p mixed
cp pki/ca-cert.pem mixed/
cp other/client-cert.pem other/client-key.pem mixed/

mkdir -p psk wrong
psktool -u alice -p psk/keys.psk >/dev/null
psktool -u bob -p psk/keys.psk >/dev/null
psktool -u alice -p wrong/keys.psk >/dev/null
chmod 600 psk/keys.psk wrong/keys.psk
