#!/usr/bin/env python3
"""The tables of bench/pq/run.sh from its results directory.

pair.tsv (run, ndata, mode, contender, gbps, ratio, rounds): pq_bench pair's medians,
one process per run and case, ISA-L and cairn alternating pass by pass on the same
buffers; the table takes the median over runs.
raw.tsv (round, ndata, mode, contender, gbps): one process per measurement; each cell
is the median over rounds, the ratio beside it the median of the per-round ratios to
ISA-L (paired within a round, so a slow stretch of the machine slows both sides).

Usage: report.py RESULTS_DIR [CHUNK]
"""

import csv
import os
import statistics
import sys

GOAL = 1.0


def read_tsv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def ws_name(mode):
    return "in cache (1 stripe)" if mode == "cache" else "streaming (>= 256 MiB)"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def pair_table(rows):
    """Returns the table and the cases where cairn's best is below the goal."""
    cases, contenders, cell = [], [], {}
    seen = set()
    for r in rows:
        case = (int(r["ndata"]), r["mode"])
        if case not in cases:
            cases.append(case)
        name = r["contender"]
        # The second "isal" of a run and case is the A/A control.
        run_key = (r.get("run", "1"), case, name)
        key = "isal (control)" if name == "isal" and run_key in seen else name
        seen.add(run_key)
        if key not in contenders:
            contenders.append(key)
        cell.setdefault((case, key), []).append(
            (float(r["gbps"]), float(r["ratio"]), int(r["rounds"])))
    cairn = [c for c in contenders if c != "isal"]
    head = ["stripe", "working set", "runs x rounds", "ISA-L pq_gen"] + [
        c if c.startswith("isal") else f"cairn {c}" for c in cairn]
    out, below = [], []
    for case in cases:
        n, mode = case
        runs = cell[(case, "isal")]
        g = statistics.median(x[0] for x in runs)
        rounds = statistics.median(x[2] for x in runs)
        line = [f"{n}+2 ({n + 2} members)", ws_name(mode), f"{len(runs)} x {rounds:.0f}",
                f"{g:.2f}"]
        best = None
        for c in cairn:
            if (case, c) not in cell:
                line.append("-")
                continue
            runs = cell[(case, c)]
            g = statistics.median(x[0] for x in runs)
            ratio = statistics.median(x[1] for x in runs)
            lo, hi = min(x[1] for x in runs), max(x[1] for x in runs)
            line.append(f"{g:.2f} ({ratio:.2f}x; {lo:.2f}-{hi:.2f})")
            if c == "best":
                best = ratio
        ctl = [x[1] for x in cell.get((case, "isal (control)"), [])]
        if best is not None and best < GOAL:
            if ctl and best >= min(ctl):
                verdict = (f"{best:.3f}x, within the control's spread "
                           f"{min(ctl):.3f}-{max(ctl):.3f}: parity as far as this machine resolves")
            else:
                verdict = f"{best:.3f}x"
            below.append(f"{n}+2 {mode}: {verdict}")
        out.append(line)
    return table(head, out), below


def process_table(rows):
    rate, contenders, cases = {}, [], []
    for r in rows:
        case = (int(r["ndata"]), r["mode"])
        if case not in cases:
            cases.append(case)
        if r["contender"] not in contenders:
            contenders.append(r["contender"])
        rate[case + (r["contender"], int(r["round"]))] = float(r["gbps"])
    cairn = [c for c in contenders if c != "isal"]
    rounds = sorted({k[3] for k in rate})

    def med(case, c):
        return statistics.median(rate[case + (c, r)] for r in rounds if case + (c, r) in rate)

    def ratio(case, c):
        return statistics.median(rate[case + (c, r)] / rate[case + ("isal", r)]
                                 for r in rounds
                                 if case + (c, r) in rate and case + ("isal", r) in rate)

    head = ["stripe", "working set", "ISA-L pq_gen"] + [f"cairn {c}" for c in cairn]
    out = []
    for case in cases:
        n, mode = case
        line = [f"{n}+2 ({n + 2} members)", ws_name(mode), f"{med(case, 'isal'):.2f}"]
        line += [f"{med(case, c):.2f} ({ratio(case, c):.2f}x)" for c in cairn]
        out.append(line)
    return table(head, out), len(rounds)


def main() -> int:
    results, chunk = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "64K")
    print(f"RAID6 P/Q generation, {chunk} chunks; GB/s of data consumed per CPU second; "
          "(x) = cairn / ISA-L pq_gen, median of per-round ratios\n")
    below = None
    pair = os.path.join(results, "pair.tsv")
    if os.path.exists(pair):
        t, below = pair_table(read_tsv(pair))
        print("In process: ISA-L and cairn alternating pass by pass on the same buffers, "
              "random order per round; each cell the median over runs (processes) of each "
              "run's median; the range is the runs' lowest and highest ratio:\n")
        print(t + "\n")
    raw = os.path.join(results, "raw.tsv")
    if os.path.exists(raw):
        t, n = process_table(read_tsv(raw))
        print(f"Separate processes, rotating order, medians of {n} rounds:\n")
        print(t + "\n")
    if below is not None:
        if below:
            print(f"goal (cairn best >= {GOAL}x ISA-L, paired) not met in: " + "; ".join(below))
        else:
            print(f"goal (cairn best >= {GOAL}x ISA-L, paired) met in every case")
    return 0


if __name__ == "__main__":
    sys.exit(main())
