#!/usr/bin/env bash
# What a client or another local user cannot do to a running cairn: hijack its default
# socket directory, exhaust its descriptors, hold connections without a handshake, or grow
# its memory by not reading replies.
. "$(dirname "$0")/lib.sh"

# "${AS_NOBODY[@]}" CMD...: runs CMD as uid/gid 65534 with $XDG_RUNTIME_DIR set to $XDG
# (an exec chain, so `$!` of a background one is CMD's PID).
as_nobody() { AS_NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups env XDG_RUNTIME_DIR="$XDG"); }

# Another user made the default runtime directory first, mode 0777 (here root in the
# victim's $XDG_RUNTIME_DIR; /tmp/cairn-UID is the same check). The victim's cairn must not
# put its sockets there, and its client verbs must not send requests to a socket there.
t_hijacked_runtime_dir() {
  need_root
  need_tool setpriv
  chmod 0711 "$WORK"
  XDG=$WORK/xdg
  as_nobody
  mkdir -m 0700 "$XDG"
  truncate -s 16M "$XDG/disk.img"
  chown -R 65534:65534 "$XDG"
  # First the good case: cairn makes the directory itself, owner-only.
  "${AS_NOBODY[@]}" "$CAIRN" serve --json --listen tcp:127.0.0.1:0 "$XDG/disk.img" \
    >"$WORK/ok.json" 2>"$WORK/ok.log" &
  local pid=$!
  register pid $pid
  local i
  for i in $(seq 100); do [ -S "$XDG/cairn/control.sock" ] && break; sleep 0.1; done
  [ -S "$XDG/cairn/control.sock" ] || fail "no control socket in a fresh runtime dir: $(cat "$WORK/ok.log")"
  expect_eq "$(stat -c '%a %u' "$XDG/cairn")" "700 65534" "a fresh runtime directory"
  expect_eq "$(stat -c '%a' "$XDG/cairn/control.sock")" "600" "the control socket's mode"
  "${AS_NOBODY[@]}" "$CAIRN" status >"$WORK/status.txt" 2>&1 || fail "status: $(cat "$WORK/status.txt")"
  kill -INT $pid
  wait $pid || fail "cairn serve exited $? after SIGINT"
  rmdir "$XDG/cairn"

  # Now the attacker's directory, with a socket that records what it is sent.
  mkdir -m 0777 "$XDG/cairn"
  chmod 0777 "$XDG/cairn"
  py - "$XDG/cairn/control.sock" "$WORK/stolen" <<'EOF' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(8)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    open(sys.argv[2], "ab").write(data)
    c.close()
EOF
  register pid $!
  for i in $(seq 50); do [ -S "$XDG/cairn/control.sock" ] && break; sleep 0.1; done
  if "${AS_NOBODY[@]}" "$CAIRN" status >"$WORK/hijack-status.txt" 2>&1; then
    fail "cairn status went through a hijacked runtime directory"
  fi
  [ ! -s "$WORK/stolen" ] || fail "the attacker's socket received: $(head -c 200 "$WORK/stolen")"
  expect_contains "$(cat "$WORK/hijack-status.txt")" "another user could replace" "status refusal"
  "${AS_NOBODY[@]}" "$CAIRN" md add --help >/dev/null # the verb exists; its request takes the same path
  if "${AS_NOBODY[@]}" "$CAIRN" md add r "$XDG/disk.img" >"$WORK/hijack-add.txt" 2>&1; then
    fail "cairn md add went through a hijacked runtime directory"
  fi
  [ ! -s "$WORK/stolen" ] || fail "the attacker's socket received: $(head -c 200 "$WORK/stolen")"

  # The server does not bind there either (the control socket is skipped with the reason).
  rm -f "$XDG/cairn/control.sock"
  "${AS_NOBODY[@]}" "$CAIRN" serve --json --listen tcp:127.0.0.1:0 "$XDG/disk.img" \
    >"$WORK/bad.json" 2>"$WORK/bad.log" &
  pid=$!
  register pid $pid
  for i in $(seq 100); do [ -s "$WORK/bad.json" ] && break; sleep 0.1; done
  [ ! -e "$XDG/cairn/control.sock" ] || fail "cairn bound its control socket in a 0777 directory"
  expect_contains "$(cat "$WORK/bad.log")" "another user could replace" "serve's warning"
  # And an NBD socket asked for there is refused.
  "${AS_NOBODY[@]}" "$CAIRN" serve --listen "unix:$XDG/cairn/nbd.sock" --no-control "$XDG/disk.img" \
    >/dev/null 2>"$WORK/bad-nbd.log" &
  pid=$!
  register pid $pid
  for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  [ ! -e "$XDG/cairn/nbd.sock" ] || fail "cairn bound its NBD socket in a 0777 directory"
  expect_contains "$(cat "$WORK/bad-nbd.log")" "another user could replace" "serve's refusal"
}

run_test hijacked-runtime-dir t_hijacked_runtime_dir
finish
