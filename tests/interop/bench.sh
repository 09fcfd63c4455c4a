#!/usr/bin/env bash
# Smoke run of bench/run.sh: every server starts, every workload runs, the table is made.
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

run_test quick t_bench_quick
finish
