#!/usr/bin/env bash
# Where a memory-bound 16-head step's fixed cost goes (docs/performance.md, "FP8 at 16 heads over
# two pools"): bench/step_trace.cu's stamps of the staged FP8 block in its clusters at the plans
# the H200's dispatcher takes and beside them, then the product's own rows timed `blocking` in the
# same call. Needs .carry/ (scripts/pack_device.sh after `cmake --build build --target
# step_trace`); logs under $OUT. Built in the forty-ninth session, which got no device: not yet run.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
# B L KEYS_PER_SPLIT [REPS MODE]: B = 32 × 4K as planned (7 splits of 10 tiles in clusters) and
# in 8, 4 and 2 splits, and its split kernel alone in 8 splits (256 blocks of 8 tiles: the walk
# balanced) and 16; B = 128 × 1K as planned (2 splits of 8); B = 8 × 4K and B = 1 × 1K in
# clusters of 8; B = 32 × 16K in clusters of 8 and its split kernel alone as planned (8 splits).
for row in "32 4096 640" "32 4096 512" "32 4096 1024" "32 4096 2048" "32 4096 512 20 partial" \
  "32 4096 256 20 partial" "128 1024 512" "8 4096 512" "1 1024 128" "32 16384 2048" "32 16384 2048 20 partial"; do
  echo "== step_trace $row"
  timeout 60 .carry/bin/step_trace $row 2>&1
done | tee "$OUT/step_trace.txt"
timeout 120 .carry/bin/metrale bench --backend cuda --sweep --timing blocking --cache fp8 --layout separate \
  --batch 1,8,32,128 --context 1024,4096 --heads 16 2>&1 | tee "$OUT/bench.txt"
