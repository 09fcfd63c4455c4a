#!/usr/bin/env bash
# Smoke runs of bench/run.sh (plain and --luks): every server starts, every workload runs,
# the table is made.
# (Numbers from a 1-second run mean nothing; docs/BENCHMARKS.md has real ones.)
. "$(dirname "$0")/lib.sh"

t_bench_quick() {
  need_tool fio nbdkit qemu-nbd nbdinfo
  BENCH_SIZE=128M CAIRN=$CAIRN timeout 600 bash "$REPO/bench/run.sh" --quick | tee "$WORK/bench.out"
  local dir
  dir=$(sed -n 's/^bench: raw results in //p' "$WORK/bench.out")
  [ -s "$dir/table.md" ] || fail "no table in $dir"
  grep -q 'failed' "$dir/table.md" && fail "a benchmark run failed: $(cat "$dir/table.md")"
  grep -q '^| randwrite-4k | ' "$dir/table.md" || fail "no ratio rows in the table"
  rm -rf "$dir"
}

# The LUKS mode: cairn-luks, nbdkit-luks and qemu-nbd-luks start on the same data, the
# goal table and the XTS comparison are made.
t_bench_luks_quick() {
  need_tool fio nbdkit qemu-nbd qemu-img nbdinfo nbdcopy
  BENCH_SIZE=64M CAIRN=$CAIRN timeout 900 bash "$REPO/bench/run.sh" --quick --luks | tee "$WORK/bench.out"
  local dir
  dir=$(sed -n 's/^bench: raw results in //p' "$WORK/bench.out")
  [ -s "$dir/table.md" ] || fail "no table in $dir"
  grep -q 'failed' "$dir/table.md" && fail "a benchmark run failed: $(cat "$dir/table.md")"
  grep -q 'cairn-luks / nbdkit-luks' "$dir/table.md" || fail "no goal table"
  grep -q 'cairn / openssl' "$dir/table.md" || fail "no XTS comparison"
  rm -rf "$dir"
}

run_test quick t_bench_quick
run_test luks-quick t_bench_luks_quick
finish
