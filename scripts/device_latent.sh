#!/usr/bin/env bash
# The heads-in-M block's cluster build against its partials' build on the device machine
# (docs/performance.md, "Twenty-sixth session"): hm_trace times the block alone in both builds on
# the latent 64-head rows the dispatcher runs on it (the chunks as its plan cuts them), then the
# latent sweep times each step through the dispatcher. If the cluster build's block is faster than
# the unfused step on a row the dispatcher leaves unfused, kLatentFusedMaxKeys (core/mla_fast.cpp)
# is holding it back. Needs .carry/bin/hm_trace (scripts/pack_device.sh packs it when
# `cmake --build build --target hm_trace` has built it); logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
# B L H KEYS_PER_SPLIT: the sweep's batch ≥ 32 rows from 4K keys at 128 heads, and one at 64.
rows=("32 4096 128 2048" "128 4096 128 4096" "32 16384 128 8192" "128 16384 128 16384" "32 65536 128 32768"
  "128 65536 128 65536" "128 4096 64 4096")
for row in "${rows[@]}"; do
  for mode in partial cluster; do
    echo "hm_trace $row $mode: $(.carry/bin/hm_trace $row $mode 2>&1 | tail -n 1)"
  done
done | tee "$OUT/hm_trace.txt"
t0=$SECONDS
# The ceilings (the matmul rate) in this call; the PyTorch rows from the file.
python3 bench/torch_baseline.py "$OUT/torch.json" --rows-from bench/torch_rows_h200.json > "$OUT/torch.txt" 2>&1
echo "ceilings: exit $? in $((SECONDS - t0)) s"
t0=$SECONDS
.carry/bin/metrale bench --backend cuda --sweep --cache fp8 --layout latent --batch 32,128 --context 4096,16384,65536 \
  --heads 64,128 --torch "$OUT/torch.json" --json "$OUT/sweep_latent.json" > "$OUT/sweep_latent.txt" 2>&1
echo "latent sweep: exit $? in $((SECONDS - t0)) s"
cat "$OUT/sweep_latent.txt"
