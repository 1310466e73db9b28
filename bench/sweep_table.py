#!/usr/bin/env python3
"""Print `metrale bench --sweep --json` output as the Markdown table of docs/performance.md.

Usage: python3 bench/sweep_table.py sweep.json > table.md

Every figure is derived from the JSON's measured times, bytes and FLOPs: TFLOP/s and GB/s are the
split path's, the roofline the larger of bytes over the copy rate and FLOPs over the matmul rate
measured in the same run (the JSON's roofline_us), and the × columns are time ratios (> 1: the
split path is faster). A sweep run without `--torch` has no matmul rate: its roofline counts the
bytes alone, so the table leaves "% of roofline" out ("—"). A file that is not such a sweep is
refused with a message naming the file, the row and the field (exit 2).
"""
import argparse
import json
import math
import sys

CACHES = ("fp8", "nvfp4")
LAYOUTS = ("separate", "latent")


class BadSweep(Exception):
    pass


def positive(value, what):
    """`value` as a positive finite number, else BadSweep naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadSweep(f"{what} is {json.dumps(value)}, not a positive number")
    return float(value)


def whole(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadSweep(f"{what} is {json.dumps(value)}, not a positive integer")
    return value


def member(value, allowed, what):
    if value not in allowed:
        raise BadSweep(f"{what} is {json.dumps(value)}, not one of {', '.join(allowed)}")
    return value


def optional(row, key, what):
    """A time that may be absent or null (not measured): None, else a positive number."""
    value = row.get(key)
    return None if value is None else positive(value, what)


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def ratio(other, split, digits=2):
    return "—" if other is None else f"{other / split:.{digits}f}"


def table(run):
    """The table's lines for a parsed sweep JSON; BadSweep where it is not one."""
    if not isinstance(run, dict):
        raise BadSweep(f"the top level is a JSON {type(run).__name__}, not an object")
    if "sweep" not in run:
        raise BadSweep("no 'sweep' rows (a file of `metrale bench --sweep --json`)")
    rows = run["sweep"]
    if not isinstance(rows, list):
        raise BadSweep(f"'sweep' is a JSON {type(rows).__name__}, not an array of rows")
    copy = positive(run.get("copy_gbps"), "'copy_gbps'")
    matmul = run.get("matmul_tflops")
    timing = run.get("timing", "lone")  # (files before the thirty-seventh session: lone)
    how = {"lone": "each run's start event on an idle stream, the host's launch latency in the time",
           "flush": "each run queued behind a 256 MiB memset, as triton.testing.do_bench",
           "blocking": "each run's stream held while its launches queue, as nvbench's blocking kernel"}
    if timing not in how:
        raise BadSweep(f"'timing' is {timing!r}, not 'blocking', 'flush' or 'lone'")
    lines = [f"Timing: {timing} ({how[timing]})."]
    if matmul is None:
        lines.append(f"Copy {copy:.1f} GB/s; no matmul rate (the sweep ran without --torch), so no % of roofline.\n")
    else:
        matmul = positive(matmul, "'matmul_tflops'")
        lines.append(f"Copy {copy:.1f} GB/s, BF16 matmul {matmul:.0f} TFLOP/s (this run).\n")
    lines.append("| cache | layout | B | L | H | split µs | TFLOP/s | GB/s | roofline µs | % of roofline | seed µs "
                 "| × seed | PyTorch µs | × PyTorch | mma.sync µs | × mma.sync |")
    lines.append("|" + "---|" * 16)
    for n, r in enumerate(rows):
        at = f"row {n}"
        if not isinstance(r, dict):
            raise BadSweep(f"{at} is a JSON {type(r).__name__}, not an object")
        t = positive(r.get("split_us"), f"{at}: 'split_us'")
        roof = positive(r.get("roofline_us"), f"{at}: 'roofline_us'")
        flops, moved = positive(r.get("flops"), f"{at}: 'flops'"), positive(r.get("bytes"), f"{at}: 'bytes'")
        wgmma = r.get("wgmma", True)
        if not isinstance(wgmma, bool):
            raise BadSweep(f"{at}: 'wgmma' is {json.dumps(wgmma)}, not true or false")
        # No wgmma entry ran: no mma.sync time of its own (bench before the twenty-eighth session
        # wrote the split time there).
        mma = optional(r, "mma_us", f"{at}: 'mma_us'") if wgmma else None
        seed, torch = optional(r, "seed_us", f"{at}: 'seed_us'"), optional(r, "torch_us", f"{at}: 'torch_us'")
        cells = [member(r.get("cache"), CACHES, f"{at}: 'cache'"), member(r.get("layout"), LAYOUTS, f"{at}: 'layout'"),
                 whole(r.get("B"), f"{at}: 'B'"), whole(r.get("L"), f"{at}: 'L'"), whole(r.get("H"), f"{at}: 'H'"),
                 fmt(t), fmt(flops / t / 1e6), f"{moved / t / 1e3:.0f}", fmt(roof),
                 "—" if matmul is None else f"{100 * roof / t:.1f}%", fmt(seed), ratio(seed, t, 1), fmt(torch),
                 ratio(torch, t), fmt(mma), ratio(mma, t)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def fail(message):
    print(f"sweep_table.py: {message}", file=sys.stderr)
    sys.exit(2)


def main(path):
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        lines = table(run)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"{path}: not JSON ({e})")
    except BadSweep as e:
        fail(f"{path}: {e}")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_json", help="the JSON of `metrale bench --sweep --json FILE`")
    main(parser.parse_args().sweep_json)
