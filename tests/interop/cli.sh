#!/usr/bin/env bash
# The cairn command as a new user meets it: quickstart with no arguments, and the example
# commands it prints actually work when pasted.
. "$(dirname "$0")/lib.sh"

# cairn with a private HOME and runtime directory, so defaults land in $WORK. (An array,
# not a function: a function run with & would be a subshell, whose PID is not cairn's.)
mkdir -p "$WORK/home" "$WORK/run"
PRIVATE_ENV=(env HOME="$WORK/home" XDG_RUNTIME_DIR="$WORK/run" XDG_DATA_HOME=)

# wait_for_line FILE REGEX: until a line of FILE matches REGEX (20 s at most; the text
# comes in pieces, and a loaded machine spaces them out).
wait_for_line() {
  local i
  for i in $(seq 200); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# wait_for FILE: until FILE has content (10 s at most).
wait_for() {
  local i
  for i in $(seq 100); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  fail "$1 stayed empty"
}

t_quickstart_pasted_commands() {
  need_tool nbdinfo qemu-img
  "${PRIVATE_ENV[@]}" "$CAIRN" quickstart >"$WORK/qs.out" 2>"$WORK/qs.err" &
  CAIRN_PID=$!
  register pid $CAIRN_PID
  wait_for "$WORK/qs.out"
  wait_for_line "$WORK/qs.out" '^  LOOP=.*mkfs.ext4' || true # the rest of the text
  cat "$WORK/qs.out"
  expect_contains "$(cat "$WORK/qs.out")" "$WORK/home/.local/share/cairn/demo-raid6-0.img" "demo member path"
  expect_contains "$(cat "$WORK/qs.out")" "raid6 4 members, chunk 64 KiB" "the status tree's md line"
  expect_contains "$(cat "$WORK/qs.out")" "└─ lv demo/home" "the status tree's LV line"
  expect_contains "$(cat "$WORK/qs.out")" "mkfs.ext4 -E stride=16,stripe_width=32" "the advise line"
  expect_contains "$(cat "$WORK/qs.out")" "RAID6 -> LUKS2 -> LVM (home, media)" "the classic stack"
  expect_contains "$(cat "$WORK/qs.out")" "demo/media" "the media LV is served too"
  expect_contains "$(cat "$WORK/qs.out")" "demo stack: RAID6 -> LUKS2" "the demo is encrypted"
  expect_contains "$(cat "$WORK/qs.out")" "DEMO KEY" "the demo key is labelled as such"
  expect_eq "$(stat -c %a "$WORK/home/.local/share/cairn/demo.key")" 600 "demo key file mode"
  # Paste the nbdinfo and qemu-img lines the way a user would.
  local line
  line=$(grep -m1 '^  nbdinfo ' "$WORK/qs.out") || fail "no nbdinfo example printed"
  out=$(eval "$line") || fail "the printed command failed: $line"
  expect_contains "$out" "export-size: 536870912" "output of: $line (home: half of 1 GiB)"
  line=$(grep -m1 '^  qemu-img info ' "$WORK/qs.out") || fail "no qemu-img example printed"
  out=$(eval "$line") || fail "the printed command failed: $line"
  expect_contains "$out" "virtual size: 512 MiB" "output of: $line"
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "quickstart exit status after Ctrl-C"
  [ ! -e "$WORK/run/cairn/nbd.sock" ] || fail "the socket was left behind"
  # The demo members stay sparse: quickstart wrote only superblocks and the LUKS2
  # header area (16 MiB over the array, zeroed as luksFormat does: 8 MiB per member).
  local m
  for m in "$WORK"/home/.local/share/cairn/demo-raid6-{0,1,2,3}.img; do
    [ "$(stat -c %b "$m")" -lt $((12 * 2048)) ] || fail "demo member $m is not sparse"
  done
}

# The printed nbdfuse line works too (root and FUSE only).
t_quickstart_nbdfuse_line() {
  need_root
  need_fuse
  "${PRIVATE_ENV[@]}" "$CAIRN" quickstart --size 64M --dir "$WORK/demo" >"$WORK/qs.out" 2>&1 &
  CAIRN_PID=$!
  register pid $CAIRN_PID
  wait_for "$WORK/qs.out"
  wait_for_line "$WORK/qs.out" '^  LOOP=.*mkfs.ext4' || true
  local line dir
  line=$(grep -m1 '^  mkdir -p .* nbdfuse ' "$WORK/qs.out") || fail "no nbdfuse example printed"
  dir=$(printf '%s\n' "$line" | sed -n 's/^  mkdir -p \([^ ]*\) .*/\1/p')
  register fuse "$dir"
  eval "$line"
  register pid $!
  for _ in $(seq 100); do [ -e "$dir/demo-home" ] && break; sleep 0.1; done
  expect_eq "$(stat -c %s "$dir/demo-home")" $((32 << 20)) "size of the nbdfuse file (home)"
  # The printed filesystem line, with the mount point moved out of /mnt: a loop device
  # with 4K sectors (LUKS2's), mkfs.ext4 aligned to the stripe, mount.
  need_tool mkfs.ext4 dumpe2fs
  line=$(grep -m1 '^  LOOP=.*mkfs.ext4' "$WORK/qs.out") || fail "no mkfs example printed"
  mkdir -p "$WORK/mnt"
  [ "${line% /mnt}" != "$line" ] || fail "the mkfs line does not end in /mnt: $line"
  line="${line% /mnt} $WORK/mnt"
  eval "$line"
  register loop "$LOOP"
  register mount "$WORK/mnt"
  echo "hello from a pasted command" >"$WORK/mnt/hello"
  umount "$WORK/mnt"
  dumpe2fs -h "$LOOP" 2>/dev/null | grep -E 'RAID stripe width:\s+32'
  losetup -d "$LOOP"
  fusermount3 -u "$dir"
  rmdir "$dir"
  stop_cairn INT
  expect_eq "$CAIRN_STATUS" 0 "quickstart exit status"
  # The data is in the array: serve its members again and read it back.
  local d=$WORK/demo
  start_cairn --md "$d/demo-raid6-0.img,$d/demo-raid6-1.img,$d/demo-raid6-2.img,$d/demo-raid6-3.img" \
    --luks --lvm --key-file "$d/demo.key"
  attach_export "$(unix_uri demo/home)"
  e2fsck -fn "$LOOP"
  mount -o ro "$LOOP" "$WORK/mnt"
  register mount "$WORK/mnt"
  expect_eq "$(cat "$WORK/mnt/hello")" "hello from a pasted command" "data in the demo's home"
  umount "$WORK/mnt"
  detach_export
  stop_cairn
}

# --json for scripts: one line, the real TCP port when 0 was asked for.
t_json_port_zero() {
  truncate -s 16M "$WORK/a.img"
  "$CAIRN" serve --json --listen tcp:127.0.0.1:0 "$WORK/a.img:alpha" >"$WORK/j" 2>"$WORK/e" &
  CAIRN_PID=$!
  register pid $CAIRN_PID
  wait_for "$WORK/j"
  py - "$WORK/j" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
j = json.loads(lines[0])
port = j["listen"][0]["port"]
assert j["listen"][0]["type"] == "tcp" and port > 0, j["listen"]
assert j["exports"][0]["uris"] == [f"nbd://127.0.0.1:{port}/alpha"], j["exports"]
print("ok:", lines[0])
EOF
  if command -v nbdinfo >/dev/null; then
    uri=$(py -c 'import json,sys; print(json.load(open(sys.argv[1]))["exports"][0]["uris"][0])' "$WORK/j")
    expect_eq "$(nbdinfo --size "$uri")" $((16 << 20)) "size via the announced URI"
  fi
  stop_cairn
  expect_eq "$CAIRN_STATUS" 0 "exit status"
}

# Mistakes get one sentence that says what to do, and a non-zero status.
t_errors() {
  local out status
  status=0
  out=$("$CAIRN" serve "$WORK/missing.img" 2>&1) || status=$?
  expect_eq "$status" 1 "exit status for a missing file"
  expect_contains "$out" "cairn: $WORK/missing.img does not exist" "missing file message"
  truncate -s 1M "$WORK/x.img"
  mkdir -p "$WORK/other"
  truncate -s 1M "$WORK/other/x.img"
  status=0
  out=$("$CAIRN" serve --listen "unix:$WORK/s" "$WORK/x.img" "$WORK/other/x.img" 2>&1) || status=$?
  expect_eq "$status" 1 "exit status for duplicate names"
  expect_contains "$out" 'two exports would be named "x"' "duplicate name message"
  status=0
  out=$("$CAIRN" quickstart --size 12 --dir "$WORK/q" 2>&1) || status=$?
  expect_eq "$status" 1 "exit status for a tiny quickstart"
  expect_contains "$out" "cairn: --array-size 12 is not usable" "quickstart size message (--size is its old name)"
  case $out in *panicked* | *backtrace*) fail "a panic reached the user: $out" ;; esac
  # A log that is not a terminal gets no colour codes, at any verbosity.
  truncate -s 1M "$WORK/c.img"
  timeout -s INT 2 "$CAIRN" -vv serve --listen "unix:$WORK/c.sock" --no-control "$WORK/c.img" \
    >/dev/null 2>"$WORK/c.log" || true
  [ -s "$WORK/c.log" ] || fail "no log from cairn -vv serve"
  if grep -q $'\x1b\[' "$WORK/c.log"; then fail "colour codes in a log file: $(head -3 "$WORK/c.log" | cat -v)"; fi
}

# The README's set-up promise: scripts/quickstart.sh puts `cairn` on PATH. Installed into
# a scratch directory here (CAIRN_INSTALL_DIR), never into the machine's own.
t_quickstart_script_installs() {
  local out
  out=$(CAIRN_INSTALL_DIR="$WORK/bin" CARGO_TARGET_DIR="$(dirname "$(dirname "$CAIRN")")" \
    bash "$REPO/scripts/quickstart.sh" --help 2>&1) || fail "scripts/quickstart.sh --help failed: $out"
  expect_contains "$out" "installed $WORK/bin/cairn" "the install line"
  expect_contains "$out" "is not on your PATH" "the PATH hint for a directory not on PATH"
  [ -x "$WORK/bin/cairn" ] || fail "no $WORK/bin/cairn after quickstart.sh"
  PATH="$WORK/bin:$PATH" cairn --version >/dev/null || fail "the installed cairn does not run"
  head -30 "$REPO/README.md" | grep -q '~/.cargo/bin' || fail "the README's first lines do not say where cairn goes"
}

# Help text and README do not promise or deny what the code does: no "not yet", "being
# added" and the like, in every command's --help.
t_help_words() {
  local stale='not yet|being added|coming soon|does not resync|no rebuild yet|cannot resync|TODO'
  local cmds=("") seen=0 cmd sub out
  while [ "$seen" -lt "${#cmds[@]}" ]; do
    cmd=${cmds[$seen]}
    seen=$((seen + 1))
    # shellcheck disable=SC2086
    out=$("$CAIRN" $cmd --help 2>&1) || fail "cairn $cmd --help failed"
    if grep -inE "$stale" <<<"$out"; then fail "cairn $cmd --help has stale words (above)"; fi
    # The subcommands clap lists under "Commands:".
    for sub in $(awk '/^Commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{on=0}' <<<"$out"); do
      [ "$sub" = help ] && continue
      cmds+=("${cmd:+$cmd }$sub")
    done
  done
  [ "${#cmds[@]}" -gt 20 ] || fail "only ${#cmds[@]} commands found; the walk over --help is broken"
  say "checked --help of ${#cmds[@]} commands"
  if grep -inE "$stale" "$REPO/README.md"; then fail "README.md has stale words (above)"; fi
}

run_test quickstart-pasted-commands t_quickstart_pasted_commands
run_test quickstart-nbdfuse-line t_quickstart_nbdfuse_line
run_test json-port-zero t_json_port_zero
run_test errors t_errors
run_test quickstart-script-installs t_quickstart_script_installs
run_test help-words t_help_words
finish
