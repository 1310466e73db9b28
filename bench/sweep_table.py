#!/usr/bin/env python3
"""Print `metrale bench --sweep --json` output as the Markdown table of docs/performance.md.

Usage: python3 bench/sweep_table.py sweep.json > table.md

Every figure is derived from the JSON's measured times, bytes and FLOPs: TFLOP/s and GB/s are the
split path's, the roofline the larger of bytes over the copy rate and FLOPs over the matmul rate
measured in the same run (the JSON's roofline_us), and the × columns are time ratios (> 1: the
split path is faster).
"""
import json
import sys


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def ratio(other, split, digits=2):
    return "—" if other is None else f"{other / split:.{digits}f}"


def main(path):
    with open(path) as f:
        run = json.load(f)
    print(f"Copy {run['copy_gbps']:.1f} GB/s, BF16 matmul {run['matmul_tflops']:.0f} TFLOP/s (this run).\n")
    print("| cache | layout | B | L | H | split µs | TFLOP/s | GB/s | roofline µs | % of roofline | seed µs | × seed "
          "| PyTorch µs | × PyTorch | mma.sync µs | × mma.sync |")
    print("|" + "---|" * 16)
    for r in run["sweep"]:
        t = r["split_us"]
        cells = [r["cache"], r["layout"], r["B"], r["L"], r["H"], fmt(t), fmt(r["flops"] / t / 1e6),
                 f"{r['bytes'] / t / 1e3:.0f}", fmt(r["roofline_us"]), f"{100 * r['roofline_us'] / t:.1f}%",
                 fmt(r.get("seed_us")), ratio(r.get("seed_us"), t, 1), fmt(r.get("torch_us")),
                 ratio(r.get("torch_us"), t), fmt(r.get("mma_us")), ratio(r.get("mma_us"), t)]
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
