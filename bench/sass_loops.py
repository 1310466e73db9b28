"""Compare the main loops of two kernels' machine code (SASS): which instructions sit in other
places. A diagnostic for kernel work, not part of the product (docs/performance.md, "Twenty-fifth
session": the heads-in-M block's cluster build against its partials' build).

    cuobjdump -sass -fun ENTRY_A kernels.cubin > a.sass
    cuobjdump -sass -fun ENTRY_B kernels.cubin > b.sass
    python3 bench/sass_loops.py a.sass b.sass [--min 600 --max 1500] [--check LOOP:MOST ...]

scripts/sass_check.sh runs it on the heads-in-M block's two builds with --check.

The CUDA toolkit on the build machine has no disassembler; `pip download nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm` fetches one (cuobjdump -sass runs nvdisasm; scripts/sass_check.sh does it
all). The cubin: nvcc -cubin -gencode=arch=compute_90a,
code=sm_90a -Ikernels kernels/mla_wgmma.cu. A loop is the span from a backward branch's target to
the branch; those of --min to --max instructions that issue wgmma (HGMMA) are compared in order of
their place in the function, by opcode (places) and by whole text, branch targets aside.
"""
import argparse
import difflib
import re
import sys


def parse(path):
    """The instructions of a cuobjdump -sass listing: (address, text)."""
    out = []
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def main_loops(ins, least, most):
    index = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < a and target in index:
            body = ins[index[target] : i + 1]
            if least <= len(body) <= most and any("HGMMA" in t for _, t in body):
                loops.append(body)
    return loops


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--min", type=int, default=600, help="least instructions of a loop compared")
    ap.add_argument("--max", type=int, default=1500, help="most instructions of a loop compared")
    ap.add_argument("--check", action="append", default=[], metavar="LOOP:MOST",
                    help="exit 1 when loop LOOP has more than MOST instructions in other places (repeatable)")
    args = ap.parse_args()
    limits = {}
    for c in args.check:
        loop, _, most = c.partition(":")
        if not (loop.isdigit() and most.isdigit()):
            sys.exit(f"sass_loops: --check {c!r} is not LOOP:MOST (two non-negative integers)")
        limits[int(loop)] = int(most)
    a = main_loops(parse(args.a), args.min, args.max)
    b = main_loops(parse(args.b), args.min, args.max)
    if not a or len(a) != len(b):
        sys.exit(f"sass_loops: {len(a)} loops in {args.a}, {len(b)} in {args.b}: nothing to pair")
    failed = []
    for n, (x, y) in enumerate(zip(a, b)):
        xo, yo = [opcode(t) for _, t in x], [opcode(t) for _, t in y]
        ops = difflib.SequenceMatcher(None, xo, yo, autojunk=False).get_opcodes()
        moved = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
        strip = lambda body: [re.sub(r"0x[0-9a-f]+", "A", t) for _, t in body]
        same = sum(m.size for m in difflib.SequenceMatcher(None, strip(x), strip(y), autojunk=False).get_matching_blocks())
        checked = n in limits
        note = f" (checked: at most {limits[n]})" if checked else (" (not checked)" if args.check else "")
        print(f"loop {n}: {len(x)} and {len(y)} instructions; {moved} in other places; {same} the same text{note}")
        if checked and moved > limits.pop(n):
            failed.append(n)
    if limits:
        sys.exit(f"sass_loops: no loop {', '.join(map(str, sorted(limits)))} to check ({len(a)} paired)")
    if failed:
        sys.exit(f"sass_loops: loop {', '.join(map(str, failed))} past the limit of --check")


if __name__ == "__main__":
    main()
