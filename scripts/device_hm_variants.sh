#!/usr/bin/env bash
# The heads-in-M block's experiments against its build, on the device machine (docs/performance.md,
# "Thirty-third session" and "Thirty-fourth session"): hm_trace_preg (warpgroup 1's P·V with P's A
# fragments in registers, loaded once by ldmatrix) and hm_trace_grouped (NVFP4's tile in its
# codes' nibble order, MODE nvfp4 only), each beside hm_trace (the product's build) on the
# 128-head rows at batch ≥ 32 from 4K keys (the chunks as the plan cuts them). MODE fp8 and
# nvfp4 time each format's heads-in-M partial entry beside its register-operand block and compare
# their partials ("agree" or "DIFFER"); MODE cluster times the FP8 cluster entry. The builds take
# turns on each row, twice over, so that drift falls on all of them alike (TIMING_SECONDS, 330
# unless given, bounds it). Needs .carry/
# (scripts/pack_device.sh after `cmake --build build --target hm_trace`); logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
# B L H KEYS_PER_SPLIT
rows=("32 4096 128 2048" "128 4096 128 4096" "32 16384 128 8192" "128 16384 128 16384")
stop=$(($(date +%s) + ${TIMING_SECONDS:-330}))  # the timing's bound: a row not begun by then is left out
for rep in 1 2; do
  for row in "${rows[@]}"; do
    [ "$(date +%s)" -lt "$stop" ] || { echo "rep $rep $row: not run (TIMING_SECONDS spent)"; continue; }
    for mode in fp8 cluster nvfp4; do
      builds=(hm_trace hm_trace_preg)
      [ "$mode" != nvfp4 ] || builds+=(hm_trace_grouped)
      for build in "${builds[@]}"; do
        # fp8 and nvfp4 print three lines: the heads-in-M block, the register-operand block, the comparison
        echo "$build $row $mode: $(.carry/bin/$build $row $mode 2>&1 | tail -n 3 | tr '\n' ' ')"
      done
    done
  done
done | tee "$OUT/hm_variants.txt"
# Then each experiment's own build of the module (kernels/variants/<name>/mla_wgmma.fatbin, loaded
# through METRALE_CUDA_FATBIN_DIR) under the GPU suite's wgmma and latent tests, `conform`'s
# heads-in-M cases and memcheck and racecheck over them: a switch that wins is checked as built.
# CHECK_SECONDS bounds the lot (150 s unless given).
export METRALE_GOLDEN_DIR=$PWD/.carry/golden
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }  # the test binary's baked source path
deadline=$((SECONDS + ${CHECK_SECONDS:-150}))
for dir in .carry/kernels/variants/*/; do
  name=$(basename "$dir")
  for check in "tests:.carry/bin/metrale_tests [wgmma],[latent]" \
    "conform:.carry/bin/metrale conform --backend cuda --no-golden --only wgmma_latent" \
    "memcheck:compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 .carry/bin/metrale conform --backend cuda --no-golden --only wgmma_latent" \
    "racecheck:compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 9 .carry/bin/metrale conform --backend cuda --no-golden --only wgmma_latent"; do
    left=$((deadline - SECONDS))
    [ "$left" -gt 5 ] || { echo "$name ${check%%:*}: not run (CHECK_SECONDS spent)"; continue; }
    t0=$SECONDS
    log="$OUT/checks/${name}_${check%%:*}.txt"
    mkdir -p "$OUT/checks"
    (cd /work/main && METRALE_CUDA_FATBIN_DIR=$PWD/$dir timeout "$left" ${check#*:}) > "$log" 2>&1
    echo "$name ${check%%:*}: exit $? in $((SECONDS - t0)) s; $(tail -n 1 "$log")"
  done
done | tee "$OUT/hm_variant_checks.txt"
# One archive of the check logs: a call brings back only a few files (the thirty-fourth session's
# first call lost hm_variants.txt behind sixteen of them).
[ ! -d "$OUT/checks" ] || { tar -C "$OUT" -czf "$OUT/checks.tgz" checks && rm -rf "$OUT/checks"; }
