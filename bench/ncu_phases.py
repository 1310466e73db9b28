#!/usr/bin/env python3
"""Split a kernel's warp stall samples into before, in and after its main loop.

Usage: python3 bench/ncu_phases.py REPORT_sass.csv [--loop-min N]

REPORT_sass.csv is `ncu -i REPORT --page source --csv --print-source sass` (scripts/device_ncu16.sh
writes one per kernel). An instruction executed more than N times (default 3000, several times a
block's warps) belongs to the loop; the loop region spans the lowest to the highest such address,
and the instructions below and above it are the prologue and the epilogue. Prints each part's share
of the samples and its four largest stall reasons (docs/performance.md, "FP8 at 16 heads over two
pools").
"""
import argparse
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--loop-min", type=float, default=3000)
    args = ap.parse_args()
    with open(args.csv, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = next((r for r in rows if "Address" in r and "Instructions Executed" in r), None)
    if header is None:
        sys.exit(f"ncu_phases: {args.csv} has no Address and Instructions Executed columns (a --print-source sass page?)")
    at = rows.index(header)
    col = {name: i for i, name in enumerate(header)}
    stalls = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    items = []
    for r in rows[at + 1:]:
        try:
            address = int(r[col["Address"]], 16)
        except (ValueError, IndexError):
            continue
        number = lambda name: float(r[col[name]] or 0)
        items.append((address, number("Instructions Executed"), number("Warp Stall Sampling (All Samples)"),
                      {s: number(s) for s in stalls}))
    loop = [a for a, executed, _, _ in items if executed > args.loop_min]
    if not loop:
        sys.exit(f"ncu_phases: no instruction executed more than {args.loop_min:g} times")
    lo, hi = min(loop), max(loop)
    total = sum(samples for _, _, samples, _ in items) or 1
    for label, part in (("before the loop", [x for x in items if x[0] < lo]),
                        ("in the loop", [x for x in items if lo <= x[0] <= hi]),
                        ("after the loop", [x for x in items if x[0] > hi])):
        samples = sum(x[2] for x in part)
        reasons = {s: sum(x[3][s] for x in part) for s in stalls}
        top = sorted(reasons.items(), key=lambda kv: -kv[1])[:4]
        print(f"{label:16} {100 * samples / total:5.1f}% of the samples, {len(part)} instructions; "
              + ", ".join(f"{name[6:]} {100 * v / max(samples, 1):.0f}%" for name, v in top))


if __name__ == "__main__":
    main()
