#!/usr/bin/env python3
"""The table of bench/pq/run.sh from its raw.tsv (round, ndata, mode, contender, gbps).

Each cell is the median GB/s over the rounds; the ratio beside it is the median of the
per-round ratios to ISA-L (paired within a round, so a slow stretch of the machine
slows both sides of a ratio alike).

Usage: report.py RAW.TSV [CHUNK]
"""

import csv
import statistics
import sys
from collections import defaultdict


def main() -> int:
    raw, chunk = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "64K")
    rate = {}  # (ndata, mode, contender, round) -> GB/s
    contenders = []
    cases = []
    with open(raw, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            case = (int(row["ndata"]), row["mode"])
            if case not in cases:
                cases.append(case)
            if row["contender"] not in contenders:
                contenders.append(row["contender"])
            rate[case + (row["contender"], int(row["round"]))] = float(row["gbps"])
    cairn = [c for c in contenders if c != "isal"]

    def cell(case, c):
        rounds = [r for (n, m, cc, r) in rate if (n, m) == case and cc == c]
        med = statistics.median(rate[case + (c, r)] for r in rounds)
        if c == "isal":
            return med, None
        ratios = [rate[case + (c, r)] / rate[case + ("isal", r)]
                  for r in rounds if case + ("isal", r) in rate]
        return med, statistics.median(ratios)

    rounds = len({r for (_, _, _, r) in rate})
    print(f"RAID6 P/Q generation, {chunk} chunks: GB/s of data consumed per CPU second, "
          f"median of {rounds} rounds; (x) = cairn / ISA-L pq_gen, median of per-round ratios\n")
    head = ["stripe", "working set", "ISA-L pq_gen"] + [f"cairn {c}" for c in cairn]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
    below = []
    for case in cases:
        n, mode = case
        ws = "in cache (1 stripe)" if mode == "cache" else "streaming (>= 256 MiB)"
        cells = [f"{n}+2 ({n + 2} members)", ws, f"{cell(case, 'isal')[0]:.2f}"]
        for c in cairn:
            med, ratio = cell(case, c)
            cells.append(f"{med:.2f} ({ratio:.2f}x)")
            if c == "best" and ratio < 1.0:
                below.append(f"{n}+2 {mode}: {ratio:.2f}x")
        print("| " + " | ".join(cells) + " |")
    print()
    if below:
        print("goal (cairn best >= 1.0x ISA-L) missed: " + ", ".join(below))
    else:
        print("goal (cairn best >= 1.0x ISA-L) met in every case")
    return 0


if __name__ == "__main__":
    sys.exit(main())
