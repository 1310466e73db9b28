#!/usr/bin/env bash
# The heads-in-M block's prepared experiments against its build, on the device machine
# (docs/performance.md, "Thirty-third session"): hm_trace_pin (warpgroup 1's loads of tile i + 2
# kept after the kHmBarP wait), hm_trace_preg (warpgroup 1's P·V with P's A fragments in registers,
# loaded once by ldmatrix), hm_trace_pin_preg (both) and hm_trace_grouped (NVFP4's tile in its
# codes' nibble order, MODE nvfp4 only), each beside hm_trace (the product's build) on the
# 128-head rows at batch ≥ 32 from 4K keys (the chunks as the plan cuts them). MODE fp8 and
# nvfp4 time each format's heads-in-M partial entry beside its register-operand block and compare
# their partials ("agree" or "DIFFER"); MODE cluster times the FP8 cluster entry. The builds take
# turns on each row, twice over, so that drift falls on all of them alike. Needs .carry/
# (scripts/pack_device.sh after `cmake --build build --target hm_trace`); logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
# B L H KEYS_PER_SPLIT
rows=("32 4096 128 2048" "128 4096 128 4096" "32 16384 128 8192" "128 16384 128 16384")
for rep in 1 2; do
  for row in "${rows[@]}"; do
    for mode in fp8 cluster nvfp4; do
      builds=(hm_trace hm_trace_pin hm_trace_preg hm_trace_pin_preg)
      [ "$mode" != nvfp4 ] || builds+=(hm_trace_grouped)
      for build in "${builds[@]}"; do
        # fp8 and nvfp4 print three lines: the heads-in-M block, the register-operand block, the comparison
        echo "$build $row $mode: $(.carry/bin/$build $row $mode 2>&1 | tail -n 3 | tr '\n' ' ')"
      done
    done
  done
done | tee "$OUT/hm_variants.txt"
