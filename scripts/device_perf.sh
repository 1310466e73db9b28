#!/usr/bin/env bash
# The decode sweep on the device machine (docs/performance.md): the PyTorch baseline and both
# roofline ceilings first, then metrale's seed and split paths against them over both cache layouts,
# logs under $OUT.
# TORCH_ROWS=bench/torch_rows_h200.json measures only the ceilings and reuses those baseline rows
# (timed lone). TIMING: lone (the default), flush or blocking, for both (bench --timing).
set -u
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
t0=$SECONDS
TIMING=${TIMING:-lone}
PYTHONUNBUFFERED=1 python3 bench/torch_baseline.py "$OUT/torch.json" --timing "$TIMING" ${TORCH_ROWS:+--rows-from "$TORCH_ROWS"} > "$OUT/torch.txt" 2>&1
echo "torch baseline: exit $? in $((SECONDS - t0)) s"; tail -n 2 "$OUT/torch.txt"
t0=$SECONDS
.carry/bin/metrale bench --backend cuda --sweep --timing "$TIMING" --layout separate latent --torch "$OUT/torch.json" --json "$OUT/sweep.json" > "$OUT/sweep.txt" 2>&1
echo "sweep: exit $? in $((SECONDS - t0)) s"
cat "$OUT/sweep.txt"
