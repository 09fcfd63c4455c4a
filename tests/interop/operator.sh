#!/usr/bin/env bash
# The operator's view: the control socket's HTTP+JSON API through curl, `cairn status`
# (plain, --json, --watch, under a real terminal in tmux), `cairn top`, the Prometheus
# metrics checked against fio's own I/O counts, and the --on-event hook.
. "$(dirname "$0")/lib.sh"

# start_op ARGS...: start_cairn with a control socket, metrics on a free port and an event
# hook writing one line per event to $EVENTS; sets CTL and METRICS (host:port).
start_op() {
  CTL=$WORK/c$((CAIRN_N + 1)).sock
  EVENTS=$WORK/events$((CAIRN_N + 1)).log
  : >"$EVENTS"
  start_cairn --control "$CTL" --metrics tcp:127.0.0.1:0 \
    --on-event "echo \"\$CAIRN_EVENT|\$CAIRN_EXPORT|\$CAIRN_DEVICE|\$CAIRN_MEMBER|\$CAIRN_MESSAGE\" >>$EVENTS" "$@"
  METRICS=$(jq -r '.metrics | sub("^tcp:"; "")' "$CAIRN_JSON")
  expect_eq "$(jq -r .control "$CAIRN_JSON")" "$CTL" "control socket in the announcement"
}

# api METHOD PATH [BODY]: one request on the control socket; prints the HTTP status, the
# answer is in $WORK/api.json.
api() {
  local args=(-s -o "$WORK/api.json" -w '%{http_code}' --unix-socket "$CTL" -X "$1")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data-binary "$3")
  curl "${args[@]}" "http://cairn$2"
}

# expect_api WANT-STATUS METHOD PATH [BODY]: the status, and a JSON answer.
expect_api() {
  local want=$1 got
  shift
  got=$(api "$@")
  [ "$got" = "$want" ] || fail "$1 $2 ${3:-}: HTTP $got, expected $want: $(cat "$WORK/api.json")"
  jq -e . "$WORK/api.json" >/dev/null || fail "$1 $2: the answer is not JSON: $(cat "$WORK/api.json")"
  if [ "$want" -ge 400 ]; then
    jq -e '.error | type == "string" and length > 0' "$WORK/api.json" >/dev/null ||
      fail "$1 $2: a $want without an error sentence: $(cat "$WORK/api.json")"
    say "$1 $2 -> $want: $(jq -r .error "$WORK/api.json")"
  fi
}

# raw_http BYTES: sends BYTES as-is to the control socket, prints the status line.
raw_http() {
  py - "$CTL" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode().decode('unicode_escape').encode('latin-1'))
s.shutdown(socket.SHUT_WR)
out = b''
while True:
    b = s.recv(65536)
    if not b:
        break
    out += b
print(out.split(b'\r\n')[0].decode())
EOF
}

wait_for_event() { # NEEDLE: waits up to 10 s for a line in $EVENTS containing NEEDLE
  local i
  for i in $(seq 100); do
    grep -q "$1" "$EVENTS" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no event matching '$1' within 10 s; events: $(cat "$EVENTS")"
}

# metric NAME-AND-LABELS: the value of one series from /metrics.
metric() {
  curl -sf "http://$METRICS/metrics" | awk -v k="$1" '$1 == k {print $2}'
}

# within_1pct A B WHAT
within_1pct() {
  py -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 0.01 * max(a, b, 1) else 1)' "$1" "$2" ||
    fail "$3: $1 and $2 differ by more than 1 %"
  say "$3: $1 vs $2"
}

t_control_api() {
  need_tool curl jq
  truncate -s 64M "$SHM/disk.img"
  truncate -s 32M "$SHM/extra.img"
  truncate -s 32M "$SHM/other.img"
  start_op "$SHM/disk.img"
  expect_eq "$(stat -c %a "$CTL")" 600 "control socket mode"

  expect_api 200 GET /v1/status
  expect_eq "$(jq -r '.exports[0].kind + " " + .exports[0].name + " " + .exports[0].children[0].kind' "$WORK/api.json")" \
    "export disk file" "status tree"
  expect_api 200 GET /v1/exports
  expect_eq "$(jq -r '.exports | length' "$WORK/api.json")" 1 "exports listed"
  expect_api 200 GET /v1/exports/disk
  expect_eq "$(jq -r '.stack.id + " " + (.size|tostring)' "$WORK/api.json")" "export:disk 67108864" "one export"
  expect_api 404 GET /v1/exports/nope
  expect_contains "$(jq -r .error "$WORK/api.json")" 'no export named "nope"' "unknown export"
  expect_api 200 GET /v1/stats
  jq -e '.nodes["export:disk"].stats.read.ops == 0 and (.monotonic_ns > 0)' "$WORK/api.json" >/dev/null ||
    fail "stats: $(cat "$WORK/api.json")"
  expect_api 200 GET /v1/events
  [ "$(api GET /metrics)" = 200 ] || fail "GET /metrics on the control socket"
  grep -q '^# TYPE cairn_io_requests_total counter' "$WORK/api.json" || fail "metrics text on the control socket"

  # Add an export twice: the second changes nothing and says so. It is served at once.
  local body
  body=$(printf '{"name": "extra", "path": "%s"}' "$SHM/extra.img")
  expect_api 201 POST /v1/exports "$body"
  expect_eq "$(jq -r .changed "$WORK/api.json")" true "first add changed"
  expect_api 200 POST /v1/exports "$body"
  expect_eq "$(jq -r '.changed|tostring' "$WORK/api.json")" false "second add changed nothing"
  expect_eq "$(jq -r .message "$WORK/api.json")" 'export "extra" already present; nothing to do' "second add says so"
  expect_eq "$(nbdinfo --size "$(unix_uri extra)")" 33554432 "the added export's size over NBD"
  # The same name over another file is a conflict, as is the same file under another name.
  expect_api 409 POST /v1/exports "$(printf '{"name": "extra", "path": "%s"}' "$SHM/other.img")"
  expect_api 409 POST /v1/exports "$(printf '{"name": "extra2", "path": "%s"}' "$SHM/extra.img")"
  # The generic action route does the same.
  expect_api 200 POST /v1/actions "$(printf '{"action": "add-export", "name": "extra", "path": "%s"}' "$SHM/extra.img")"
  expect_eq "$(jq -r '.changed|tostring' "$WORK/api.json")" false "add-export action is idempotent"
  wait_for_event "ExportAdded|extra|$SHM/extra.img"

  # Remove it twice; a client connected to it is closed, the other export stays.
  nbdsh -u "$(unix_uri extra)" -c 'import time; h.pwrite(b"x" * 512, 0); time.sleep(30)' &
  local held=$!
  register pid $held
  for _ in $(seq 50); do
    api GET /v1/status >/dev/null
    [ "$(jq '[.connections[] | select(.export == "extra")] | length' "$WORK/api.json")" = 1 ] && break
    sleep 0.1
  done
  expect_eq "$(jq '[.connections[] | select(.export == "extra")] | length' "$WORK/api.json")" 1 "connection listed"
  expect_api 200 DELETE /v1/exports/extra
  expect_eq "$(jq -r .changed "$WORK/api.json")" true "first delete changed"
  expect_contains "$(jq -r .message "$WORK/api.json")" "1 client connection closed" "delete closes its clients"
  expect_eq "$(head -c 1 "$SHM/extra.img")" x "the removed export's write reached the file"
  expect_api 200 DELETE /v1/exports/extra
  expect_eq "$(jq -r '.changed|tostring' "$WORK/api.json")" false "second delete changed nothing"
  expect_eq "$(jq -r .message "$WORK/api.json")" 'export "extra" is not present; nothing to do' "second delete says so"
  expect_status 1 nbdinfo --size "$(unix_uri extra)"
  expect_eq "$(nbdinfo --size "$(unix_uri disk)")" 67108864 "the other export still serves"
  wait_for_event "ExportRemoved|extra|$SHM/extra.img"

  # Bad requests: a 4xx with a sentence, and the daemon goes on.
  expect_api 400 POST /v1/exports '{"name": "x", '
  expect_api 422 POST /v1/exports '{"name": 3, "path": "/x"}'
  expect_api 422 POST /v1/exports '{"name": "x"}'
  expect_api 422 POST /v1/exports '{"name": "x", "path": "/x", "colour": "red"}'
  expect_api 422 POST /v1/exports '{"name": "x", "path": "relative.img"}'
  expect_api 422 POST /v1/exports "$(printf '{"name": "x", "path": "%s"}' "$SHM/missing.img")"
  expect_contains "$(jq -r .error "$WORK/api.json")" "does not exist" "missing file"
  expect_api 422 POST /v1/exports "$(printf '{"name": "a b", "path": "%s"}' "$SHM/other.img")"
  expect_api 422 POST /v1/actions '{"action": "explode"}'
  expect_api 404 GET /v1/nothing
  expect_api 404 GET /nothing
  expect_api 405 PUT /v1/status
  expect_api 405 DELETE /v1/exports
  expect_api 405 POST /v1/exports/disk '{}'
  expect_eq "$(raw_http 'POST /v1/exports HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n')" \
    "HTTP/1.1 413 Content Too Large" "huge Content-Length"
  expect_eq "$(raw_http 'POST /v1/exports HTTP/1.1\r\nHost: x\r\n\r\n')" "HTTP/1.1 411 Length Required" "no Content-Length"
  expect_eq "$(raw_http 'garbage\r\n\r\n')" "HTTP/1.1 400 Bad Request" "garbage request line"
  expect_eq "$(raw_http 'GET / HTTP/1.1\r\nX: '"$(head -c 20000 /dev/zero | tr '\0' a)"'\r\n\r\n')" \
    "HTTP/1.1 431 Request Header Fields Too Large" "huge header"
  expect_api 200 GET /v1/status

  # A second daemon on the same control socket is refused; with no daemon, one sentence.
  local out
  out=$("$CAIRN" serve --listen "unix:$WORK/second.sock" --control "$CTL" "$SHM/other.img" 2>&1) &&
    fail "a second daemon started on a live control socket"
  expect_contains "$out" "another cairn daemon answers on the control socket $CTL" "second daemon"
  out=$("$CAIRN" status --control "$WORK/none.sock" 2>&1) && fail "status without a daemon succeeded"
  expect_eq "$out" "cairn: no cairn daemon on $WORK/none.sock (start one with \`cairn serve --control $WORK/none.sock ...\`)" \
    "no daemon"

  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "exit status"
  [ ! -e "$CTL" ] || fail "the control socket was left behind"
  # A stale socket file (its daemon died) is replaced.
  py -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$WORK/stale.sock"
  "$CAIRN" serve --json --listen "unix:$WORK/third.sock" --control "$WORK/stale.sock" "$SHM/other.img" \
    >"$WORK/third.json" 2>"$WORK/third.log" &
  register pid $!
  for _ in $(seq 100); do [ -s "$WORK/third.json" ] && break; sleep 0.1; done
  CTL=$WORK/stale.sock expect_api 200 GET /v1/status
}

# fio_json URI ARGS...: one fio run; sets FIO_READS and FIO_WRITES (I/Os fio completed).
fio_json() {
  local uri=$1
  shift
  timeout 300 fio --output-format=json --ioengine=nbd --uri="$uri" "$@" >"$WORK/fio.out" 2>"$WORK/fio.err" ||
    { cat "$WORK/fio.out" "$WORK/fio.err"; fail "fio $* failed"; }
  # The nbd engine says "fio: connected to NBD server" on stdout before the JSON.
  sed -n '/^{/,$p' "$WORK/fio.out" >"$WORK/fio.json"
  FIO_READS=$(jq '[.jobs[].read.total_ios] | add' "$WORK/fio.json")
  FIO_WRITES=$(jq '[.jobs[].write.total_ios] | add' "$WORK/fio.json")
  say "fio: $FIO_READS reads, $FIO_WRITES writes"
}

# top_total ID FIELD: a total from one `cairn top --json` sample.
top_total() {
  "$CAIRN" top --control "$CTL" --json -n 1 | jq --arg id "$1" --arg f "$2" '.devices[] | select(.id == $id) | .totals[$f]'
}

t_counts_match_fio() {
  need_tool curl jq fio
  truncate -s 256M "$SHM/disk.img"
  start_op "$SHM/disk.img"
  fio_json "$(unix_uri disk)" --name=counted --rw=randrw --rwmixread=60 --bs=4k --iodepth=8 \
    --numjobs=2 --size=64M --offset_increment=64M --number_ios=5000
  local l='export="disk",device="disk",kind="export"'
  within_1pct "$(metric "cairn_io_requests_total{$l,op=\"read\"}")" "$FIO_READS" "metrics reads vs fio"
  within_1pct "$(metric "cairn_io_requests_total{$l,op=\"write\"}")" "$FIO_WRITES" "metrics writes vs fio"
  within_1pct "$(metric "cairn_io_request_duration_seconds_count{$l,op=\"read\"}")" "$FIO_READS" "histogram count vs fio"
  within_1pct "$(top_total export:disk reads)" "$FIO_READS" "cairn top reads vs fio"
  within_1pct "$(top_total export:disk writes)" "$FIO_WRITES" "cairn top writes vs fio"
  # The file below saw the same requests.
  within_1pct "$(top_total "file:$SHM/disk.img" writes)" "$FIO_WRITES" "file writes vs fio"
  expect_eq "$(metric "cairn_io_in_flight{$l}")" 0 "nothing in flight after fio"
  # Text top: the header and both rows.
  local text
  text=$("$CAIRN" top --control "$CTL" -n 2 -d 0.3)
  expect_contains "$text" "aqu-sz" "top header"
  expect_contains "$text" "export disk" "top export row"
  expect_contains "$text" "  file $SHM/disk.img" "top file row"
}

# RAID5 over four member files: the export's counts match fio's, and the members carry the
# work as RAID5 spreads it.
t_raid_members() {
  need_tool curl jq fio
  local m=()
  for i in 0 1 2 3; do m+=("$SHM/r$i.img"); done
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 4 --size 64M --name r5 "${m[@]}" >/dev/null
  start_op --md "$(IFS=,; echo "${m[*]}"):r5"
  fio_json "$(unix_uri r5)" --name=w --rw=randwrite --bs=4k --iodepth=8 --size=128M --number_ios=4000
  fio_json "$(unix_uri r5)" --name=r --rw=randread --bs=64k --iodepth=8 --size=128M --number_ios=2000
  "$CAIRN" top --control "$CTL" --json -n 1 >"$WORK/top.json"
  within_1pct "$(jq '.devices[] | select(.id == "export:r5") | .totals.writes' "$WORK/top.json")" 4000 "export writes"
  within_1pct "$(jq '.devices[] | select(.id == "export:r5") | .totals.reads' "$WORK/top.json")" 2000 "export reads"
  expect_eq "$(jq '[.devices[] | select(.kind == "member")] | length' "$WORK/top.json")" 4 "four member rows"
  expect_eq "$(jq '[.devices[] | select(.kind == "member" and .array == "r5" and .totals.writes > 0)] | length' "$WORK/top.json")" \
    4 "every member was written"
  # A 4 KiB RAID5 write writes the data and the parity: members write at least 2x the bytes
  # (plus superblock/bitmap updates), at most a full stripe's worth per write.
  py - "$WORK/top.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))["devices"]
exp = next(x for x in d if x["id"] == "export:r5")["totals"]
mem = [x["totals"] for x in d if x["kind"] == "member"]
w = sum(m["write_bytes"] for m in mem)
r = sum(m["read_bytes"] for m in mem)
print(f"export wrote {exp['write_bytes']}, read {exp['read_bytes']}; members wrote {w}, read {r}")
assert 2 * exp["write_bytes"] <= w <= 4 * exp["write_bytes"] + (64 << 20), "member writes"
# Reads of a healthy RAID5 come from the data members only, byte for byte; the writes'
# read-modify-write reads come on top.
assert r >= exp["read_bytes"], "member reads"
EOF
  expect_eq "$(metric 'cairn_md_degraded{export="r5",device="r5",level="raid5"}')" 0 "not degraded"
  expect_eq "$(metric 'cairn_md_active_devices{export="r5",device="r5",level="raid5"}')" 4 "active members"
}

# RAID6 with a member file gone: status says so, in text, JSON, metrics and an event.
t_degraded_status() {
  need_tool curl jq
  local m=()
  for i in 0 1 2 3; do m+=("$SHM/d$i.img"); done
  "$CAIRN" md create --level 6 --chunk 64K --raid-devices 4 --size 64M --name demo "${m[@]}" >/dev/null
  mv "$SHM/d2.img" "$SHM/d2.hidden"
  start_op --md "$(IFS=,; echo "${m[*]}"):demo"
  wait_for_event "DegradedArray|demo|demo||"
  local text
  text=$("$CAIRN" status --control "$CTL")
  say "$text"
  grep -Eq "^export demo  [0-9.]+ MiB  active  \(nbd://127.0.0.1:$CAIRN_PORT/demo\)$" <<<"$text" ||
    fail "export line: $text"
  grep -Eq '^└─ md demo  [0-9.]+ MiB  raid6 4 members, chunk 64 KiB  clean, degraded$' <<<"$text" ||
    fail "md line: $text"
  expect_contains "$text" "   ├─ $SHM/d0.img  " "first member line"
  expect_contains "$text" "   ├─ (missing)  removed" "missing member line"
  expect_contains "$text" "   └─ $SHM/d3.img  " "last member line"
  expect_contains "$text" "DegradedArray" "recent events"
  "$CAIRN" status --control "$CTL" --json >"$WORK/status.json"
  jq -e '.exports[0].children[0] | .kind == "md" and .state == "clean, degraded" and .md.level == "raid6"
         and .md.chunk_bytes == 65536 and .md.data_disks == 2' "$WORK/status.json" >/dev/null ||
    fail "status --json md node: $(jq -c '.exports[0].children[0] | del(.children)' "$WORK/status.json")"
  expect_eq "$(jq -r '[.exports[0].children[0].children[].state] | join(",")' "$WORK/status.json")" \
    "active sync,active sync,removed,active sync" "member states"
  expect_eq "$(jq -r '.events[0].event' "$WORK/status.json")" DegradedArray "event in status"
  expect_eq "$(metric 'cairn_md_degraded{export="demo",device="demo",level="raid6"}')" 1 "degraded gauge"
  expect_eq "$(metric 'cairn_md_failed_devices{export="demo",device="demo",level="raid6"}')" 1 "failed gauge"
  expect_eq "$(metric 'cairn_events_total{event="DegradedArray"}')" 1 "event counter"
  # A fail and an immediate remove: md pushes both as they happen, in order (a look
  # once a second would see only the end); meanwhile status says why and since when.
  "$CAIRN" md fail demo "$SHM/d3.img" --control "$CTL" >/dev/null
  "$CAIRN" status --control "$CTL" --json >"$WORK/status.json"
  jq -e --arg m "$SHM/d3.img" '.exports[0].children[0].children[] | select(.name == $m) |
         .state == "faulty" and (.failure.reason | contains("marked faulty by the operator"))
         and (.failure.since | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T"))' "$WORK/status.json" >/dev/null ||
    fail "no failure reason and time in status --json: $(jq -c '.exports[0].children[0].children' "$WORK/status.json")"
  text=$("$CAIRN" status --control "$CTL")
  say "$text"
  expect_contains "$text" "$SHM/d3.img  " "faulty member line"
  grep -Eq "d3.img .*faulty \(since [0-9T:-]+Z: marked faulty by the operator" <<<"$text" ||
    fail "the faulty member's line does not say why and since when: $text"
  "$CAIRN" md remove demo "$SHM/d3.img" --control "$CTL" >/dev/null
  wait_for_event "MemberRemoved|demo|demo|$SHM/d3.img|"
  local order
  order=$(grep -n -E "^(Fail|MemberRemoved)\|demo\|demo\|$SHM/d3.img\|" "$EVENTS" | cut -d'|' -f1 | tr '\n' ' ')
  say "events: $order"
  grep -Eq '^[0-9]+:Fail [0-9]+:MemberRemoved $' <<<"$order" || fail "Fail then MemberRemoved expected: $(cat "$EVENTS")"
  mv "$SHM/d2.hidden" "$SHM/d2.img"
}

# --watch without a terminal: blocks separated by a blank line; under tmux: a redrawn
# screen with the tree.
t_status_terminal() {
  need_tool curl jq tmux
  truncate -s 64M "$SHM/disk.img"
  start_op "$SHM/disk.img"
  local out
  out=$(timeout 2 "$CAIRN" status --control "$CTL" --watch 0.5 || true)
  [ "$(grep -c '^export disk' <<<"$out")" -ge 2 ] || fail "--watch printed fewer than 2 blocks: $out"
  grep -q '^$' <<<"$out" || fail "--watch blocks not separated by a blank line: $out"
  local sock=cairn-op-$$
  tmux -L "$sock" new-session -d -x 120 -y 30 "$CAIRN status --control $CTL --watch 0.5"
  register pid "$(tmux -L "$sock" display -p '#{pid}')"
  local screen=
  for _ in $(seq 50); do
    screen=$(tmux -L "$sock" capture-pane -p)
    grep -q '└─ file' <<<"$screen" && break
    sleep 0.1
  done
  say "$screen"
  expect_contains "$screen" "export disk  64 MiB  active" "export line on the terminal"
  expect_contains "$screen" "└─ file $SHM/disk.img  64 MiB  active" "tree on the terminal"
  [ "$(grep -c '^export disk' <<<"$screen")" = 1 ] || fail "the terminal was not redrawn in place: $screen"
  tmux -L "$sock" kill-server
}

# Background work: an array created over members holding data resyncs while served;
# status shows its progress (a bar on a terminal, a line otherwise), metrics its ratio.
t_resync_progress() {
  need_tool curl jq tmux
  local m=()
  for i in 0 1 2 3; do
    random_file "$SHM/p$i.img" 64M
    m+=("$SHM/p$i.img")
  done
  "$CAIRN" md create --level 5 --chunk 64K --raid-devices 4 --name slow "${m[@]}" >/dev/null
  start_op --speed-limit-min 1000 --speed-limit-max 4000 --md "$(IFS=,; echo "${m[*]}"):slow"
  local text=
  for _ in $(seq 50); do
    text=$("$CAIRN" status --control "$CTL")
    grep -q '% done' <<<"$text" && break
    sleep 0.1
  done
  say "$text"
  grep -Eq '^   │  resync [0-9]+\.[0-9]% done \([^)]* of [0-9.]+ MiB\), [^,]+, ETA [0-9?]' <<<"$text" ||
    fail "no plain progress line under the md node: $text"
  wait_for_event "RebuildStarted|slow|slow"
  local ratio
  ratio=$(metric 'cairn_background_progress_ratio{export="slow",device="slow",action="resync"}')
  py -c 'import sys; r = float(sys.argv[1]); sys.exit(0 if 0 <= r < 1 else 1)' "$ratio" || fail "progress ratio $ratio"
  local sock=cairn-op-$$-p
  tmux -L "$sock" new-session -d -x 120 -y 30 "$CAIRN status --control $CTL --watch 0.5"
  register pid "$(tmux -L "$sock" display -p '#{pid}')"
  local screen=
  for _ in $(seq 50); do
    screen=$(tmux -L "$sock" capture-pane -p)
    grep -q 'resync' <<<"$screen" && break
    sleep 0.1
  done
  say "$screen"
  grep -Eq '^   │  \[=*>? *\] +[0-9]+\.[0-9]% resync  (.+/s|speed \?)  ETA ([0-9]+:[0-9]{2}|\?)' <<<"$screen" ||
    fail "no progress bar on the terminal: $screen"
  tmux -L "$sock" kill-server
}

# Two daemons with the default control socket (a private runtime directory): the second
# answers on control-PID.sock; the md verbs and advise find the daemon that serves what
# they name; plain `status` lists both instead of showing one without saying whose.
t_two_daemons() {
  need_tool jq
  local run=$WORK/xrun m=() i a b out status
  mkdir -p "$run"
  for i in 0 1 2 3; do m+=("$SHM/t$i.img"); done
  "$CAIRN" md create --level 6 --chunk 64K --raid-devices 4 --size 32M --name arr "${m[@]}" >/dev/null
  truncate -s 32M "$SHM/plain.img"
  XDG_RUNTIME_DIR=$run "$CAIRN" serve --json --listen "unix:$WORK/a.sock" \
    --md "$(IFS=,; echo "${m[*]}"):arr" >"$WORK/a.json" 2>"$WORK/a.log" &
  a=$!
  register pid $a
  for i in $(seq 100); do [ -S "$run/cairn/control.sock" ] && break; sleep 0.1; done
  XDG_RUNTIME_DIR=$run "$CAIRN" serve --json --listen "unix:$WORK/b.sock" "$SHM/plain.img" \
    >"$WORK/b.json" 2>"$WORK/b.log" &
  b=$!
  register pid $b
  for i in $(seq 100); do [ -S "$run/cairn/control-$b.sock" ] && break; sleep 0.1; done
  [ -S "$run/cairn/control-$b.sock" ] || fail "no control-$b.sock for the second daemon: $(cat "$WORK/b.log")"
  expect_eq "$(jq -r .control "$WORK/b.json")" "$run/cairn/control-$b.sock" "second daemon's control socket"
  status=0
  out=$(XDG_RUNTIME_DIR=$run "$CAIRN" status 2>&1) || status=$?
  expect_eq "$status" 1 "plain status with two daemons"
  expect_contains "$out" "2 cairn daemons are running" "status names the choice"
  expect_contains "$out" "PID $a: exports arr" "status lists the first daemon"
  expect_contains "$out" "PID $b: exports plain" "status lists the second daemon"
  out=$(XDG_RUNTIME_DIR=$run "$CAIRN" status --control "$run/cairn/control-$b.sock")
  expect_contains "$(head -1 <<<"$out")" "PID $b, control socket $run/cairn/control-$b.sock" "whose status"
  # The verbs that name an array or export reach the daemon that serves it.
  XDG_RUNTIME_DIR=$run "$CAIRN" md check arr --wait >"$WORK/check.out" ||
    fail "md check arr with two daemons: $(cat "$WORK/check.out")"
  XDG_RUNTIME_DIR=$run "$CAIRN" advise plain >"$WORK/advise.out" ||
    fail "advise plain with two daemons: $(cat "$WORK/advise.out")"
  # A spare that does not exist: one sentence that says what to do, no OS error code.
  out=$(XDG_RUNTIME_DIR=$run "$CAIRN" md add arr "$SHM/no-such-spare.img" 2>&1) &&
    fail "md add of a missing file succeeded"
  expect_contains "$out" "no-such-spare.img does not exist; make it first" "md add of a missing file"
  case $out in *"os error"*) fail "an OS error code reached the user: $out" ;; esac
  # A spare shows its size, not "0 bytes".
  truncate -s 32M "$SHM/t-spare.img"
  XDG_RUNTIME_DIR=$run "$CAIRN" md add arr "$SHM/t-spare.img" >/dev/null
  out=$(XDG_RUNTIME_DIR=$run "$CAIRN" status --control "$run/cairn/control.sock")
  expect_contains "$out" "t-spare.img  32 MiB  spare" "the spare's line in status"
  kill -INT $b $a
  wait $b $a || fail "a daemon did not stop cleanly"
  [ ! -e "$run/cairn/control-$b.sock" ] || fail "control-$b.sock left behind"
}

# Stacks of any shape added at run time through the control API (issue 14): an md array,
# a LUKS volume with its key file, the LVs of a volume group. What is written through
# each is read back by another server started from the command line, after the API
# removed the export (so the array was closed and the file released).
t_control_api_stacks() {
  need_tool curl jq nbdcopy nbdinfo
  local KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000) body i
  truncate -s 16M "$SHM/disk.img"
  for i in 0 1 2; do truncate -s 32M "$SHM/m$i.img"; done
  "$CAIRN" md create -l 5 -n 3 -c 64K --name apimd "$SHM"/m{0,1,2}.img >/dev/null
  truncate -s 32M "$SHM/vol.img"
  printf %s "api stack key" >"$WORK/key"
  printf %s "not the key" >"$WORK/badkey"
  "$CAIRN" luks format -q "${KDF[@]}" --key-file "$WORK/key" "$SHM/vol.img" >/dev/null
  truncate -s 64M "$SHM/pv.img"
  "$CAIRN" lvm pvcreate "$SHM/pv.img" >/dev/null
  "$CAIRN" lvm vgcreate apivg "$SHM/pv.img" >/dev/null
  "$CAIRN" lvm lvcreate -n a -L 8M apivg "$SHM/pv.img" >/dev/null
  "$CAIRN" lvm lvcreate -n b -L 12M apivg "$SHM/pv.img" >/dev/null
  # A VG whose LV "c" holds LUKS2: formatted on a file of the LV's size, copied to where
  # the LV lies (its first extent at the PV's 1 MiB pe_start).
  truncate -s 32M "$SHM/pv2.img"
  "$CAIRN" lvm pvcreate "$SHM/pv2.img" >/dev/null
  "$CAIRN" lvm vgcreate encvg "$SHM/pv2.img" >/dev/null
  "$CAIRN" lvm lvcreate -n c -L 20M encvg "$SHM/pv2.img" >/dev/null
  truncate -s 20M "$WORK/lvc.img"
  "$CAIRN" luks format -q "${KDF[@]}" --key-file "$WORK/key" "$WORK/lvc.img" >/dev/null
  dd if="$WORK/lvc.img" of="$SHM/pv2.img" bs=1M seek=1 conv=notrunc status=none
  rm -f "$WORK/lvc.img"
  random_file "$WORK/data" 1M
  start_op "$SHM/disk.img"

  # md: added, written, removed (the array closes clean), served again by the CLI.
  body=$(printf '{"name": "arr", "stack": {"md": ["%s", "%s", "%s"]}}' "$SHM"/m{0,1,2}.img)
  expect_api 201 POST /v1/exports "$body"
  expect_eq "$(jq -r .changed "$WORK/api.json")" true "md add changed"
  expect_api 200 GET /v1/exports/arr
  expect_eq "$(jq -r '.stack.children[0].kind' "$WORK/api.json")" md "the added export's tree has the md layer"
  nbdcopy "$WORK/data" "$(unix_uri arr)"
  wait_for_event "ExportAdded|arr|"
  # LUKS: refused without a key (the daemon has no terminal) and with a wrong one.
  body=$(printf '{"name": "vol", "stack": {"luks": {"on": {"file": "%s"}}}}' "$SHM/vol.img")
  expect_api 422 POST /v1/exports "$body"
  expect_contains "$(jq -r .error "$WORK/api.json")" "no key is available" "LUKS without a key"
  body=$(printf '{"name": "vol", "stack": {"luks": {"on": {"file": "%s"}, "key_file": "%s"}}}' "$SHM/vol.img" "$WORK/badkey")
  expect_api 422 POST /v1/exports "$body"
  expect_contains "$(jq -r .error "$WORK/api.json")" "No key available with this passphrase" "LUKS with a wrong key"
  body=$(printf '{"name": "vol", "stack": {"luks": {"on": {"file": "%s"}, "key_file": "%s"}}}' "$SHM/vol.img" "$WORK/key")
  expect_api 201 POST /v1/exports "$body"
  nbdcopy "$WORK/data" "$(unix_uri vol)"
  # LVM: one export per LV, named VG/LV; a name is refused.
  body=$(printf '{"name": "x", "stack": {"lvm": [{"file": "%s"}]}}' "$SHM/pv.img")
  expect_api 422 POST /v1/exports "$body"
  body=$(printf '{"stack": {"lvm": [{"file": "%s"}]}}' "$SHM/pv.img")
  expect_api 201 POST /v1/exports "$body"
  expect_eq "$(jq -r '[.export[].name] | sort | join(" ")' "$WORK/api.json")" "apivg/a apivg/b" "LV exports in the answer"
  expect_eq "$(nbdinfo --size "$(unix_uri apivg/a)")" 8388608 "LV a's size over NBD"
  expect_eq "$(nbdinfo --size "$(unix_uri apivg/b)")" 12582912 "LV b's size over NBD"
  # LUKS over one LV (the "lv" shape names it): opened, described layer by layer, written.
  body=$(printf '{"name": "sec", "stack": {"luks": {"on": {"lv": {"on": [{"file": "%s"}], "name": "encvg/c"}}, "key_file": "%s"}}}' "$SHM/pv2.img" "$WORK/key")
  expect_api 201 POST /v1/exports "$body"
  expect_api 200 GET /v1/exports/sec
  expect_eq "$(jq -r '[.. | objects | select(has("kind")) | .kind] | join(" ")' "$WORK/api.json" | sed 's/^export //')" \
    "luks lv file" "LUKS over LV over file in the tree"
  expect_eq "$(nbdinfo --size "$(unix_uri sec)")" 4194304 "the LUKS payload inside the LV"
  nbdcopy "$WORK/data" "$(unix_uri sec)"
  nbdcopy "$(unix_uri sec)" "$WORK/back"
  cmp -n 1048576 "$WORK/data" "$WORK/back" || fail "LUKS over LV did not read back what was written"
  rm -f "$WORK/back"
  expect_api 200 DELETE /v1/exports/sec
  # Shapes that cannot be opened, and relative paths, are refused before anything opens.
  expect_api 422 POST /v1/exports "$(printf '{"name": "y", "stack": {"luks": {"on": {"lvm": [{"file": "%s"}]}}}}' "$SHM/pv.img")"
  expect_contains "$(jq -r .error "$WORK/api.json")" "not supported" "LUKS on LVM"
  expect_api 422 POST /v1/exports '{"name": "y", "stack": {"md": ["m0.img", "m1.img"]}}'
  expect_api 422 POST /v1/exports "$(printf '{"name": "y", "path": "%s", "stack": {"file": "%s"}}' "$SHM/disk.img" "$SHM/disk.img")"
  expect_api 200 GET /v1/exports
  expect_eq "$(jq -r '[.exports[].name] | sort | join(" ")' "$WORK/api.json")" "apivg/a apivg/b arr disk vol" "every export listed"

  expect_api 200 DELETE /v1/exports/arr
  expect_api 200 DELETE /v1/exports/vol
  stop_cairn
  if command -v mdadm >/dev/null; then
    mdadm --examine "$SHM/m0.img" | grep -q "State : clean" || fail "the md array was not closed clean: $(mdadm --examine "$SHM/m0.img")"
  fi
  start_cairn --md "$SHM/m0.img,$SHM/m1.img,$SHM/m2.img:arr" --luks "$SHM/vol.img:vol" --key-file "$WORK/key"
  for i in arr vol; do
    nbdcopy "$(unix_uri $i)" "$WORK/back"
    cmp -n 1048576 "$WORK/data" "$WORK/back" || fail "what was written through the API-added $i export did not come back"
    rm -f "$WORK/back"
  done
  stop_cairn
}

run_test control-api t_control_api
run_test control-api-stacks t_control_api_stacks
run_test counts-match-fio t_counts_match_fio
run_test raid-members t_raid_members
run_test degraded-status t_degraded_status
run_test status-terminal t_status_terminal
run_test resync-progress t_resync_progress
run_test two-daemons t_two_daemons
finish
