#!/usr/bin/env python3
"""Turns bench/run.sh's fio JSON files into a Markdown table.

usage: report.py RESULTS-DIR SERVER...
       report.py --one FIO-JSON      (one line: IOPS, MiB/s, p99)

Reads RESULTS-DIR/JOB-SERVER.json (fio --output-format=json, group_reporting) and
RESULTS-DIR/machine.txt. Prints, per workload: IOPS, bandwidth and p99 completion latency
for each server, then cairn's ratios to the others (IOPS: >1 means cairn is faster;
p99: <1 means cairn's tail latency is lower).
"""

import json
import os
import sys

JOBS = ["randread-4k", "seqread-1m", "seqwrite-1m", "randwrite-4k"]


def load(path):
    """(iops, MiB/s, p99 µs) of the direction the job did, or None if it failed."""
    try:
        with open(path) as f:
            text = f.read()
        # fio may print warnings before the JSON object.
        job = json.loads(text[text.index("{"):])["jobs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    if job.get("error"):
        return None
    side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    pct = side.get("clat_ns", {}).get("percentile", {})
    p99 = pct.get("99.000000")
    return (side["iops"], side["bw"] / 1024, p99 / 1000 if p99 is not None else None)


def fmt(v, digits=0):
    return "—" if v is None else f"{v:,.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}"


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        r = load(sys.argv[2])
        if r is None:
            sys.exit("no result")
        print(f"{fmt(r[0]):>10} IOPS {fmt(r[1], 1):>9} MiB/s  p99 {fmt(r[2]):>7} µs")
        return
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, servers = sys.argv[1], sys.argv[2:]
    rows = {(j, s): load(os.path.join(out, f"{j}-{s}.json")) for j in JOBS for s in servers}
    machine = os.path.join(out, "machine.txt")
    if os.path.exists(machine):
        print("```")
        print(open(machine).read().rstrip())
        print("```")
        print()
    print("| workload | server | IOPS | MiB/s | p99 latency (µs) |")
    print("|---|---|---:|---:|---:|")
    for j in JOBS:
        for s in servers:
            r = rows[(j, s)]
            if r is None:
                print(f"| {j} | {s} | failed | | |")
            else:
                print(f"| {j} | {s} | {fmt(r[0])} | {fmt(r[1], 1)} | {fmt(r[2])} |")
    base = next((s for s in servers if s.startswith("cairn")), None)
    others = [s for s in servers if s != base]
    if base and others:
        print()
        head = " | ".join(f"{base}/{o} IOPS | {base}/{o} p99" for o in others)
        print(f"| workload | {head} |")
        print("|---|" + "---:|" * (2 * len(others)))
        for j in JOBS:
            c = rows[(j, base)]
            cells = []
            for o in others:
                r = rows[(j, o)]
                cells.append(ratio(c and c[0], r and r[0]))
                cells.append(ratio(c and c[2], r and r[2]))
            print(f"| {j} | " + " | ".join(cells) + " |")
    if base == "cairn-raid6" and "nbdkit" in servers:
        # The md issue's goals, RAID6 against a plain file.
        goals = {"seqwrite-1m": 0.5, "seqread-1m": 0.7, "randread-4k": 0.7, "randwrite-4k": None}
        print()
        print("| workload | cairn-raid6 / nbdkit-plain (IOPS) | goal | |")
        print("|---|---:|---:|---|")
        for j in JOBS:
            c, n = rows[(j, base)], rows[(j, "nbdkit")]
            r = c[0] / n[0] if c and n and n[0] else None
            g = goals[j]
            verdict = "reported as is" if g is None else (
                "—" if r is None else ("met" if r >= g else f"MISSED by {g - r:.2f}"))
            print(f"| {j} | {fmt(r, 2)} | {'—' if g is None else f'>= {g}'} | {verdict} |")
    if base == "cairn-luks" and "nbdkit-luks" in servers:
        # The LUKS issue's goals, against nbdkit's luks filter.
        goals = {"seqread-1m": 2.0, "seqwrite-1m": 2.0, "randread-4k": 1.3, "randwrite-4k": 1.3}
        print()
        print("| workload | cairn-luks / nbdkit-luks (IOPS) | goal | |")
        print("|---|---:|---:|---|")
        for j in JOBS:
            c, n = rows[(j, base)], rows[(j, "nbdkit-luks")]
            r = c[0] / n[0] if c and n and n[0] else None
            g = goals[j]
            verdict = "—" if r is None else ("met" if r >= g else f"MISSED by {g - r:.2f}")
            print(f"| {j} | {fmt(r, 2)} | >= {g} | {verdict} |")
        xts = os.path.join(out, "xts.txt")
        if os.path.exists(xts):
            print()
            print("XTS per core (crates/luks/examples/xts_bench.rs, same run):")
            print()
            print("```")
            print(open(xts).read().rstrip())
            print("```")
    failed = [k for k, v in rows.items() if v is None]
    if failed:
        print()
        print("failed runs: " + ", ".join(f"{j} on {s}" for j, s in failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
