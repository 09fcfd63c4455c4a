#!/usr/bin/env bash
# What a client or another local user cannot do to a running cairn: hijack its default
# socket directory, exhaust its descriptors, hold connections without a handshake (or
# every slot with half-open handshakes from one address), grow its memory by not reading
# replies, or starve other clients by reading them slowly.
. "$(dirname "$0")/lib.sh"

# "${AS_NOBODY[@]}" CMD...: runs CMD as uid/gid 65534 with $XDG_RUNTIME_DIR set to $XDG
# (an exec chain, so `$!` of a background one is CMD's PID).
as_nobody() { AS_NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups env XDG_RUNTIME_DIR="$XDG"); }

# Another user made the default runtime directory first, mode 0777 (here root in the
# victim's $XDG_RUNTIME_DIR; /tmp/cairn-UID is the same check). The victim's cairn must not
# put its sockets there, and its client verbs must not connect to a socket there (checked
# before connecting: the fake socket records every connection, not only requests).
t_hijacked_runtime_dir() {
  need_root
  need_tool setpriv
  chmod 0711 "$WORK"
  XDG=$WORK/xdg
  as_nobody
  mkdir -m 0700 "$XDG"
  truncate -s 16M "$XDG/disk.img" "$XDG/disk2.img"
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
    # A connection alone is a leak (the victim looked here): recorded before any data.
    open(sys.argv[2], "ab").write(b"[connected]")
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
  # And an NBD socket asked for there is refused (another file: the server above holds
  # disk.img, and a second writer would be refused for that first).
  "${AS_NOBODY[@]}" "$CAIRN" serve --listen "unix:$XDG/cairn/nbd.sock" --no-control "$XDG/disk2.img" \
    >/dev/null 2>"$WORK/bad-nbd.log" &
  pid=$!
  register pid $pid
  for i in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  [ ! -e "$XDG/cairn/nbd.sock" ] || fail "cairn bound its NBD socket in a 0777 directory"
  expect_contains "$(cat "$WORK/bad-nbd.log")" "another user could replace" "serve's refusal"
}

# A raw NBD client for the tests below: `client.py SOCKET MODE [N]`.
#   idle N:    N connections that never speak; prints "ready", holds them until killed.
#   silent:    one connection that reads the greeting and sends nothing; prints the
#              seconds until the server closed it.
#   trickle:   the same, sending its handshake one byte every 0.5 s.
#   unread N:  N connections that each ask for four 32 MiB reads and never read the
#              replies; prints "ready", holds them until killed.
#   unread4k N: N connections that send 4 KiB reads in bursts of 64 (replies the
#              server gathers per burst) and never read the replies; prints "ready",
#              then the seconds until the server cut every one of them (a send fails).
write_client() {
  cat >"$WORK/client.py" <<'EOF'
import socket, struct, sys, time
path, mode = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
OPT = struct.pack(">I", 3) + struct.pack(">QII", 0x49484156454F5054, 1, 4) + b"disk"
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s
def greeting(s):
    hello = b""
    while len(hello) < 18:
        hello += s.recv(18 - len(hello))
if mode == "idle":
    held = [connect() for _ in range(n)]
    print("ready", flush=True)
    time.sleep(600)
elif mode in ("silent", "trickle"):
    t0 = time.monotonic()
    s = connect()
    greeting(s)
    s.settimeout(0.5)
    sent = 0
    while True:
        if mode == "trickle" and sent < len(OPT) - 1:
            try:
                s.send(OPT[sent:sent + 1])
                sent += 1
            except OSError:
                break
        try:
            if not s.recv(65536):
                break
        except socket.timeout:
            pass
        except OSError:
            break
        if time.monotonic() - t0 > 60:
            break
    print(f"{time.monotonic() - t0:.1f}", flush=True)
elif mode == "unread":
    held = []
    for i in range(n):
        s = connect()
        greeting(s)
        # Fixed newstyle, no zeroes; NBD_OPT_EXPORT_NAME "disk" -> size (8) + flags (2).
        s.sendall(OPT)
        got = b""
        while len(got) < 10:
            got += s.recv(10 - len(got))
        for k in range(4):
            s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, k, 0, 32 << 20))
        held.append(s)
    print("ready", flush=True)
    time.sleep(600)
elif mode == "unread4k":
    held = []
    t0 = time.monotonic()
    for i in range(n):
        s = connect()
        greeting(s)
        s.sendall(OPT)
        got = b""
        while len(got) < 10:
            got += s.recv(10 - len(got))
        s.settimeout(0.2)
        held.append(s)
    print("ready", flush=True)
    burst = b"".join(struct.pack(">IHHQQI", 0x25609513, 0, 0, k, k * 4096, 4096) for k in range(64))
    cut = set()
    while len(cut) < n and time.monotonic() - t0 < 60:
        for i, s in enumerate(held):
            if i in cut:
                continue
            try:
                s.send(burst)
            except socket.timeout:
                pass
            except OSError:
                cut.add(i)
        time.sleep(0.05)
    print("cut" if len(cut) == n else "not cut", round(time.monotonic() - t0, 1), flush=True)
    time.sleep(600)
EOF
}

# wait_ready FILE: waits (30 s at most) for a client's "ready" line.
wait_ready() {
  local i
  for i in $(seq 300); do grep -q ready "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "the client did not get ready: $(cat "$1")"
}

# cpu_ticks PID: user + system CPU time of PID so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Out of descriptors (a low ulimit -n, 70 idle connections): accept must not spin or flood the
# log, and a new client gets in once the idle ones close.
t_descriptor_limit() {
  need_tool nbdinfo prlimit
  write_client
  truncate -s 16M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" "$WORK/disk.img"
  # The limit is met exactly by whole connections (30 descriptors past those open now, a
  # multiple of what one connection takes), so accept itself fails with EMFILE.
  prlimit --nofile=$(($(ls "/proc/$CAIRN_PID/fd" | wc -l) + 30)) --pid "$CAIRN_PID"
  /usr/bin/python3 "$WORK/client.py" "$CAIRN_SOCK" idle 70 >"$WORK/idle.out" 2>&1 &
  local idle=$!
  register pid $idle
  wait_ready "$WORK/idle.out"
  sleep 0.5
  local t0 lines0 ticks lines
  t0=$(cpu_ticks "$CAIRN_PID")
  lines0=$(wc -l <"$CAIRN_LOG")
  sleep 3
  ticks=$(($(cpu_ticks "$CAIRN_PID") - t0))
  lines=$(($(wc -l <"$CAIRN_LOG") - lines0))
  say "NOTE: out of descriptors for 3 s: $ticks CPU ticks, $lines log lines"
  [ "$lines" -le 5 ] || fail "$lines log lines in 3 s out of descriptors: $(head -3 "$CAIRN_LOG")"
  [ "$ticks" -le 50 ] || fail "$ticks CPU ticks in 3 s out of descriptors (accept spins)"
  kill $idle
  wait $idle 2>/dev/null || true
  timeout 20 nbdinfo --size "$(unix_uri disk)" >"$WORK/size.txt" ||
    fail "a new client did not get in after the idle ones closed"
  expect_eq "$(cat "$WORK/size.txt")" $((16 << 20)) "export size"
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# A client that never finishes the handshake is cut after --client-timeout, whether it
# says nothing or trickles a byte at a time.
t_handshake_timeout() {
  need_tool nbdsh
  write_client
  truncate -s 16M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" --client-timeout 2 "$WORK/disk.img"
  local mode secs
  for mode in silent trickle; do
    secs=$(timeout 90 /usr/bin/python3 "$WORK/client.py" "$CAIRN_SOCK" $mode)
    say "NOTE: a $mode client was cut after $secs s"
    py -c 'import sys; t = float(sys.argv[1]); assert 1.5 <= t <= 6, t' "$secs" ||
      fail "$mode client cut after $secs s, expected about 2"
  done
  # A client that does finish its handshake is not cut.
  nbdsh -u "$(unix_uri disk)" -c 'import time; time.sleep(4); assert len(h.pread(4096, 0)) == 4096' ||
    fail "an idle client past its handshake was cut"
}

# peak_rss_within MIB WHAT: cairn's peak resident memory so far is at most MIB (noted).
peak_rss_within() {
  local hwm
  hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$CAIRN_PID/status")
  say "NOTE: peak RSS with $2: $((hwm / 1024)) MiB"
  [ "$hwm" -le $(($1 << 10)) ] || fail "peak RSS $((hwm / 1024)) MiB with $2"
}

# Clients that ask for 32 MiB reads and never read the replies: the server's memory stays
# within its in-flight budget, they are cut after --client-timeout, and others are served.
t_unread_replies() {
  need_tool nbdsh
  write_client
  truncate -s 64M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" --client-timeout 3 "$WORK/disk.img"
  /usr/bin/python3 "$WORK/client.py" "$CAIRN_SOCK" unread 20 >"$WORK/unread.out" 2>&1 &
  local bad=$!
  register pid $bad
  wait_ready "$WORK/unread.out"
  sleep 2
  nbdsh -u "$(unix_uri disk)" -c 'assert len(h.pread(1 << 20, 0)) == 1 << 20' ||
    fail "a good client was not served beside the ones that do not read"
  peak_rss_within 400 "20 clients not reading 32 MiB replies"
  kill $bad
  wait $bad 2>/dev/null || true
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# Clients that send 4 KiB reads in bursts and never read the replies: the replies the
# server gathers per burst (crates/nbd/src/cork.rs) are bounded, the clients are cut after
# --client-timeout, memory stays small, and another client is served meanwhile.
t_unread_small_replies() {
  need_tool nbdsh
  write_client
  truncate -s 64M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" --client-timeout 3 "$WORK/disk.img"
  /usr/bin/python3 "$WORK/client.py" "$CAIRN_SOCK" unread4k 8 >"$WORK/unread4k.out" 2>&1 &
  local bad=$!
  register pid $bad
  wait_ready "$WORK/unread4k.out"
  sleep 1
  nbdsh -u "$(unix_uri disk)" -c 'assert len(h.pread(4096, 0)) == 4096' ||
    fail "a good client was not served beside the ones that do not read"
  local i
  for i in $(seq 600); do grep -q "cut" "$WORK/unread4k.out" && break; sleep 0.1; done
  say "NOTE: $(tail -1 "$WORK/unread4k.out")"
  grep -q "^cut" "$WORK/unread4k.out" || fail "clients that never read were not cut: $(cat "$WORK/unread4k.out")"
  peak_rss_within 200 "8 clients not reading 4 KiB replies"
  nbdsh -u "$(unix_uri disk)" -c 'assert len(h.pread(4096, 0)) == 4096' ||
    fail "no client served after the cut"
  kill $bad
  wait $bad 2>/dev/null || true
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# The control socket: a request sent a byte at a time is answered 408 and closed once
# its time (10 s) is up, not held for as long as the client keeps trickling.
t_control_deadline() {
  truncate -s 16M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" "$WORK/disk.img"
  local out
  out=$(timeout 60 /usr/bin/python3 - "$WORK/ctl.sock" <<'EOF'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(0.5)
t0 = time.monotonic()
req = b"GET /v1/status HTTP/1.1\r\nHost: cairn\r\n" + b"X-Slow: " + b"a" * 200
got = b""
i = 0
while time.monotonic() - t0 < 40:
    if i < len(req):
        try:
            s.send(req[i:i + 1])
            i += 1
        except OSError:
            break
    try:
        b = s.recv(4096)
        if not b:
            break
        got += b
    except socket.timeout:
        pass
    except OSError:
        break
print(f"{time.monotonic() - t0:.1f} {got.split(b' ')[1].decode() if got else 'none'}")
EOF
  )
  say "NOTE: a trickling control client: closed after ${out% *} s, status ${out#* }"
  py -c 'import sys; assert float(sys.argv[1]) <= 15, sys.argv[1]' "${out% *}" ||
    fail "a trickling control client was held ${out% *} s"
  expect_eq "${out#* }" 408 "the status it got"
  "$CAIRN" status --control "$WORK/ctl.sock" >/dev/null || fail "status after the slow client"
}

# Clients for the fairness tests: `slow.py ADDR MODE [N]`, ADDR a Unix socket path or
# HOST:PORT (optionally SRC/HOST:PORT to connect from SRC).
#   slow N:     N connections that each send two 32 MiB READs and then take 64 KiB of
#               the replies every second (a trickle, 64 KiB/s); prints "ready", then
#               "cut I SECS" as the server closes each (seconds since its READs).
#   unread:     one connection, one 32 MiB READ never read; prints the seconds until
#               the server closed it.
#   probe SECS: one connection doing a 4 KiB and a 1 MiB READ every 0.2 s for SECS;
#               prints "ops N max LATENCY" (or "stuck after N ops" when a reply took 15 s).
#   halfopen N: N connections that send NBD_OPT_STARTTLS, read its ACK and never start
#               TLS; prints "ready", then, a second later, "open K" (how many the server
#               kept), and holds them.
#   tlslist:    one connection that does STARTTLS (no certificate), lists the exports and
#               prints their names.
write_slow_client() {
  cat >"$WORK/slow.py" <<'EOF'
import select, socket, ssl, struct, sys, threading, time
addr, mode = sys.argv[1], sys.argv[2]
arg = sys.argv[3] if len(sys.argv) > 3 else "1"
MAGIC = 0x49484156454F5054
def connect():
    if ":" not in addr:
        s = socket.socket(socket.AF_UNIX)
        s.connect(addr)
        return s
    src, _, hp = addr.rpartition("/")
    host, port = hp.rsplit(":", 1)
    s = socket.socket()
    if src:
        s.bind((src, 0))
    s.connect((host, int(port)))
    return s
def recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("closed")
        b += c
    return b
def opt(s, o, data=b""):
    s.sendall(struct.pack(">QII", MAGIC, o, len(data)) + data)
def go(s):
    recvn(s, 18)
    s.sendall(struct.pack(">I", 3))
    # NBD_OPT_EXPORT_NAME "disk" -> size (8) + flags (2), no zeroes.
    opt(s, 1, b"disk")
    recvn(s, 10)
def read_req(s, cookie, off, n):
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, cookie, off, n))
def closed(s, timeout):
    p = select.poll()
    p.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(p.poll(timeout * 1000))
if mode == "slow":
    n = int(arg)
    conns = []
    for i in range(n):
        s = connect()
        go(s)
        read_req(s, 1, 0, 32 << 20)
        read_req(s, 2, 32 << 20, 32 << 20)
        conns.append((s, time.monotonic()))
    print("ready", flush=True)
    # One lock for the threads' lines: print() writes the text and its newline apart,
    # so two threads cut at once could run their lines together.
    out = threading.Lock()
    def trickle(i, s, t0):
        s.settimeout(5)
        try:
            # The cut is seen at once (RDHUP), not after what is buffered is read.
            while not closed(s, 0):
                if not s.recv(64 << 10):
                    break
                time.sleep(1)
        except OSError:
            pass
        with out:
            print(f"cut {i} {time.monotonic() - t0:.1f}", flush=True)
    for i, (s, t0) in enumerate(conns):
        threading.Thread(target=trickle, args=(i, s, t0), daemon=True).start()
    time.sleep(600)
elif mode == "unread":
    s = connect()
    go(s)
    read_req(s, 1, 0, 32 << 20)
    t0 = time.monotonic()
    closed(s, 120)
    print(f"{time.monotonic() - t0:.1f}", flush=True)
elif mode == "probe":
    s = connect()
    go(s)
    s.settimeout(15)
    t_end = time.monotonic() + float(arg)
    ops, worst = 0, 0.0
    try:
        while time.monotonic() < t_end:
            for n in (4096, 1 << 20):
                t0 = time.monotonic()
                read_req(s, ops, 0, n)
                magic, err, cookie = struct.unpack(">IIQ", recvn(s, 16))
                assert magic == 0x67446698 and err == 0, (hex(magic), err)
                recvn(s, n)
                worst = max(worst, time.monotonic() - t0)
                ops += 1
            time.sleep(0.2)
        print(f"ops {ops} max {worst:.2f}", flush=True)
    except (OSError, EOFError) as e:
        print(f"stuck after {ops} ops: {e}", flush=True)
elif mode == "halfopen":
    held = []
    for i in range(int(arg)):
        try:
            s = connect()
        except OSError:
            continue
        held.append(s)
        try:
            recvn(s, 18)
            s.sendall(struct.pack(">I", 3))
            opt(s, 5)
            recvn(s, 20)
        except (OSError, EOFError):
            pass
    print("ready", flush=True)
    time.sleep(1)
    print(f"open {sum(not closed(s, 0) for s in held)}", flush=True)
    time.sleep(600)
elif mode == "tlslist":
    s = connect()
    s.settimeout(10)
    recvn(s, 18)
    s.sendall(struct.pack(">I", 3))
    opt(s, 5)
    recvn(s, 20)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    t = ctx.wrap_socket(s)
    opt(t, 3)
    while True:
        magic, o, typ, ln = struct.unpack(">QIII", recvn(t, 20))
        data = recvn(t, ln)
        if typ != 2:
            break
        print(data[4:4 + struct.unpack(">I", data[:4])[0]].decode(), flush=True)
EOF
}

# Five clients that each ask for two 32 MiB reads and take the replies at 64 KiB/s: another
# client's reads keep completing within 2 s all along (the slow ones hold their fair share
# of the reply budget, not all of it), and the slow ones are cut once a reply moved less
# than 256 KiB/s over --client-timeout (30 s).
t_slow_readers() {
  write_slow_client
  truncate -s 64M "$WORK/disk.img"
  RUST_LOG=warn,cairn_nbd=info start_cairn --control "$WORK/ctl.sock" --client-timeout 30 "$WORK/disk.img"
  /usr/bin/python3 "$WORK/slow.py" "$CAIRN_SOCK" slow 5 >"$WORK/slow.out" 2>&1 &
  local bad=$!
  register pid $bad
  wait_ready "$WORK/slow.out"
  sleep 1
  local probe
  probe=$(timeout 60 /usr/bin/python3 "$WORK/slow.py" "$CAIRN_SOCK" probe 20)
  say "NOTE: a client beside five slow readers, 20 s: $probe"
  case $probe in
    ops*) py -c 'import sys; ops, worst = int(sys.argv[1]), float(sys.argv[2]); assert ops >= 40 and worst <= 2, (ops, worst)' \
      "$(echo "$probe" | cut -d' ' -f2)" "$(echo "$probe" | cut -d' ' -f4)" ||
      fail "the probe client was starved: $probe" ;;
    *) fail "the probe client was starved: $probe" ;;
  esac
  local i
  for i in $(seq 300); do [ "$(grep -c '^cut' "$WORK/slow.out")" -ge 5 ] && break; sleep 0.1; done
  say "NOTE: $(grep '^cut' "$WORK/slow.out" | tr '\n' ' ')"
  [ "$(grep -c '^cut' "$WORK/slow.out")" -eq 5 ] || fail "slow readers not cut within 50 s: $(cat "$WORK/slow.out")"
  grep '^cut' "$WORK/slow.out" | while read -r _ _ secs; do
    py -c 'import sys; assert 28 <= float(sys.argv[1]) <= 40, sys.argv[1]' "$secs" ||
      fail "a slow reader cut after $secs s, expected about 30"
  done
  grep -q "less than 256 KiB/s" "$CAIRN_LOG" || fail "the cut is not logged: $(tail -3 "$CAIRN_LOG")"
  kill $bad
  wait $bad 2>/dev/null || true
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# A client that never reads a 32 MiB reply is cut after --client-timeout (3 s) over the Unix
# socket, and after at most twice that over TCP (its buffers can take megabytes of the
# reply in the first 3 s, and then the kernel makes room a few bytes at a time).
t_unread_cut() {
  write_slow_client
  truncate -s 64M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" --client-timeout 3 "$WORK/disk.img"
  local where secs
  for where in "$CAIRN_SOCK" "127.0.0.1:$CAIRN_PORT"; do
    secs=$(timeout 150 /usr/bin/python3 "$WORK/slow.py" "$where" unread)
    say "NOTE: a client not reading over $where was cut after $secs s"
    py -c 'import sys; assert 2.5 <= float(sys.argv[1]) <= 8, sys.argv[1]' "$secs" ||
      fail "a client not reading over $where cut after $secs s, expected 3 to 6"
  done
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# 300 TLS handshakes (more than --max-connections) left half-open from 127.0.0.1 (STARTTLS acknowledged, no TLS hello):
# the server keeps 16 of them (HANDSHAKES_PER_PEER) and closes the rest at once, so a client
# from 127.0.0.2 still gets in, does TLS and lists the export, long before the 30 s timeout.
t_handshakes_per_peer() {
  need_tool certtool psktool
  write_slow_client
  [ -d "$WORK/creds/pki" ] || bash "$INTEROP_DIR/tls/make-creds.sh" "$WORK/creds"
  truncate -s 16M "$WORK/disk.img"
  start_cairn --control "$WORK/ctl.sock" --client-timeout 30 --tls-certificates "$WORK/creds/pki" \
    "$WORK/disk.img"
  /usr/bin/python3 "$WORK/slow.py" "127.0.0.1:$CAIRN_PORT" halfopen 300 >"$WORK/half.out" 2>&1 &
  local bad=$!
  register pid $bad
  wait_ready "$WORK/half.out"
  local t0=$SECONDS out
  out=$(timeout 20 /usr/bin/python3 "$WORK/slow.py" "127.0.0.2/127.0.0.1:$CAIRN_PORT" tlslist 2>&1) ||
    fail "a client from 127.0.0.2 was locked out by 300 half-open handshakes: $out"
  expect_eq "$out" disk "the export listed over TLS from 127.0.0.2"
  say "NOTE: listed from 127.0.0.2 in $((SECONDS - t0)) s beside 300 half-open handshakes"
  local i
  for i in $(seq 50); do grep -q '^open' "$WORK/half.out" && break; sleep 0.1; done
  say "NOTE: half-open handshakes the server kept: $(grep '^open' "$WORK/half.out")"
  expect_eq "$(grep '^open' "$WORK/half.out")" "open 16" "handshakes kept from one address"
  kill $bad
  wait $bad 2>/dev/null || true
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

run_test hijacked-runtime-dir t_hijacked_runtime_dir
run_test descriptor-limit t_descriptor_limit
run_test handshake-timeout t_handshake_timeout
run_test unread-replies t_unread_replies
run_test unread-small-replies t_unread_small_replies
run_test control-deadline t_control_deadline
run_test slow-readers t_slow_readers
run_test unread-cut t_unread_cut
run_test handshakes-per-peer t_handshakes_per_peer
finish
