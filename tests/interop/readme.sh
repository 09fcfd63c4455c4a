#!/usr/bin/env bash
# The README's command blocks, run in order on scratch files, as a new user would paste
# them: every `cairn ...` line must work as written. The set-up block (quickstart.sh and
# test.sh) is cli.sh's; lines that need a real disk, a mount point or a path outside the
# scratch directory are listed as skipped, loudly, with the reason.
#
# What the harness changes, and only this:
#  - servers (`cairn serve ...`) run in the background until the next server line or the
#    next block, as a user keeps one running in another terminal and stops it with
#    Ctrl-C; a block whose prose line says "still served" keeps it, and one that says
#    "With `cairn serve X` ... running" starts that server first;
#  - terminal prompts get their answers from files: `luks format` gets -q and the key
#    file (with cheap PBKDF2 so the run is quick), a `--luks` server gets --key-file;
#  - /run/cairn (root's default runtime directory) is the scratch one ($XDG_RUNTIME_DIR),
#    and /srv/disks is the scratch directory, so nothing outside it is touched.
. "$(dirname "$0")/lib.sh"

KEY_TEXT='the passphrase you gave luks format'

t_readme_blocks() {
  need_tool nbdinfo nbdcopy qemu-img
  local dir=$SHM/readme bin=$WORK/bin
  mkdir -p "$dir" "$bin" "$WORK/home" "$WORK/run"
  ln -sf "$CAIRN" "$bin/cairn"
  # Files the README's lines assume a user has: images to copy in, two plain disks.
  head -c 1M /dev/urandom >"$dir/image.raw"
  head -c 1M /dev/urandom >"$dir/vm.raw"
  truncate -s 64M "$dir/a.img" "$dir/b.img"
  printf %s "$KEY_TEXT" >"$dir/key"
  chmod 600 "$dir/key"
  py - "$REPO/README.md" "$dir" "$WORK/run" >"$WORK/readme-run.sh" <<'EOF'
import re, shlex, sys
readme, scratch, rundir = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(readme).read().split("\n")

SKIP = [
    (r"/dev/sd|/dev/nbd", "needs a real block device"),
    (r"nbdfuse|losetup|mount ", "needs root, FUSE and a mount point (cli.sh runs quickstart's nbdfuse line)"),
    (r"/etc/", "reads the machine's own configuration"),
    (r"\.\.\. ", "an elided command line"),
    (r"--watch", "runs until Ctrl-C"),
]

def is_server(line):
    return re.match(r"cairn serve\b", line) and "--help" not in line

out = []
emit = out.append
blocks = 0
i = 0
prose = ""
while i < len(text):
    if not text[i].startswith("```sh"):
        if text[i].strip():
            prose = text[i]
        i += 1
        continue
    blocks += 1
    i += 1
    lines = []
    while not text[i].startswith("```"):
        lines.append(text[i])
        i += 1
    i += 1
    if blocks == 1:
        continue  # the set-up block: quickstart.sh and test.sh themselves (cli.sh)
    m = re.search(r"With `(cairn serve [^`]+)`.*running", prose)
    if m:
        emit(f"start_server {m.group(1)}")
    elif not re.search(r"still served|running", prose):
        # A new section: the user stopped the server of the last one (Ctrl-C), as
        # they must before changing what it serves (one writer per device).
        emit("stop_server")
    # Join continuation lines, drop comments.
    joined, cur = [], ""
    for l in lines:
        if l.rstrip().endswith("\\"):
            cur += l.rstrip()[:-1] + " "
            continue
        joined.append(cur + l)
        cur = ""
    for raw in joined:
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if not line or line.startswith("#"):
            continue
        why = next((w for pat, w in SKIP if re.search(pat, line)), None)
        if why:
            emit(f"skipped {shlex.quote(line)} {shlex.quote(why)}")
            continue
        line = line.replace("/run/cairn/", rundir + "/cairn/")
        line = line.replace("/srv/disks", scratch)
        if re.match(r"cairn luks format\b", line) and "--key-file" not in line:
            line += " -q --key-file key --pbkdf pbkdf2 --pbkdf-force-iterations 1000"
        if re.match(r"cairn top\b", line):
            line += " -n 1"
        if is_server(line):
            if "--luks" in line and "--key-file" not in line and "$S" not in line:
                line += " --key-file key"
            emit(f"say {shlex.quote('+ ' + raw.strip())}")
            emit(f"start_server {line}")
        else:
            emit(f"say {shlex.quote('+ ' + raw.strip())}")
            emit(line)
print(f"# {blocks} blocks")
print("\n".join(out))
EOF
  cat >"$WORK/readme-prelude.sh" <<EOF
set -euo pipefail
export PATH="$bin:\$PATH" HOME="$WORK/home" XDG_RUNTIME_DIR="$WORK/run"
unset XDG_DATA_HOME
cd "$dir"
SERVER=
say() { printf '%s\n' "\$*"; }
skipped() { printf 'SKIPPED LINE: %s  (%s)\n' "\$1" "\$2" | tee -a "$WORK/skipped"; }
stop_server() {
  [ -n "\$SERVER" ] || return 0
  kill -INT "\$SERVER" 2>/dev/null || true
  wait "\$SERVER" || { echo "the server before exited with \$?: \$(cat "$WORK/server.log")"; exit 1; }
  SERVER=
}
# start_server CMD...: runs a server line in the background; ready when it has printed its
# announcement (and its default socket, if it uses one, exists).
start_server() {
  stop_server
  : >"$WORK/server.log"
  "\$@" >"$WORK/server.log" 2>&1 &
  SERVER=\$!
  echo "pid \$SERVER" >>"$REGISTRY" # stopped after the test even if this run is killed
  local i
  for i in \$(seq 600); do
    kill -0 "\$SERVER" 2>/dev/null || { echo "server line failed: \$*"; cat "$WORK/server.log"; exit 1; }
    if grep -q '"listen"\|Listening\|listening' "$WORK/server.log"; then return 0; fi
    sleep 0.1
  done
  echo "server line did not announce itself in 60 s: \$*"; cat "$WORK/server.log"; exit 1
}
trap stop_server EXIT
EOF
  cat "$WORK/readme-run.sh"
  timeout -k 10 600 bash -c "$(cat "$WORK/readme-prelude.sh" "$WORK/readme-run.sh")" ||
    fail "a README command failed (the last '+' line above)"
  [ -s "$WORK/skipped" ] && say "!!! README lines not run: $(wc -l <"$WORK/skipped") (listed above)"
  return 0
}

run_test readme-blocks t_readme_blocks
finish
