#!/usr/bin/env bash
# What holds up the 16-head blocks at B = 32 × 4K × 16 heads (docs/performance.md, "Forty-first
# and forty-eighth sessions"): ncu's full set (warp states, scheduler, shared-memory wavefronts and
# bank conflicts, pipes), the SMs' least and most active cycles, and the stall samples per SASS
# line (bench/ncu_phases.py splits them before, in and after the loop; the --print-source cuda
# page lists the source without samples), for the warp-specialised mla_paged_decode_wgmma16_nvfp4 over one
# latent pool and the FP8 register-operand block (mla_paged_decode_wgmma16_rs_fp8, or its cluster
# entry _rs_combine_fp8 where the plan fuses the step) over one latent pool and over two pools
# (the row the 16-head target misses). If the card is an H200 and SWEEP=1, the sweep (scripts/device_perf.sh,
# TIMING=blocking, about two minutes) runs first. Needs .carry/ (scripts/pack_device.sh); logs and
# reports under $OUT, archived into ncu.tgz (read a report's samples with `ncu -i REPORT --page
# source --csv --print-source sass`). About 45 s on an H100; exits 1 if a profile failed.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
if [ "${SWEEP:-0}" = 1 ] && [[ $gpu == *H200* ]]; then
  TIMING=blocking OUT=$OUT bash scripts/device_perf.sh > "$OUT/perf.txt" 2>&1
  grep -E "^(torch baseline|sweep):" "$OUT/perf.txt"
fi
M=.carry/bin/metrale
row=(--batch 32 --context 4096 --heads 16)
failed=0
profile() {  # NAME KERNEL_REGEX CACHE LAYOUT
  local t0=$SECONDS
  timeout 120 ncu --set full --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg \
    --import-source yes --launch-skip 2 -c 1 -k "regex:$2" -o "$OUT/$1" -f \
    $M bench --backend cuda --sweep --cache "$3" --layout "$4" "${row[@]}" > "$OUT/$1_run.txt" 2>&1
  local rc=$?
  echo "$1: exit $rc in $((SECONDS - t0)) s"
  if [ "$rc" -ne 0 ] || [ ! -f "$OUT/$1.ncu-rep" ]; then failed=1; return; fi
  ncu -i "$OUT/$1.ncu-rep" --page details > "$OUT/$1_details.txt" 2>&1
  ncu -i "$OUT/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1_sass.csv" 2>&1
  ncu -i "$OUT/$1.ncu-rep" --page raw --csv --metrics sm__cycles_active.min,sm__cycles_active.max,\
sm__cycles_active.avg,gpc__cycles_elapsed.max > "$OUT/$1_active.csv" 2>&1
  grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Eligible Warps|Registers Per|DRAM Throughput" \
    "$OUT/$1_details.txt"
  cat "$OUT/$1_active.csv"
}
profile nvfp4_latent 'wgmma16_nvfp4$' nvfp4 latent
profile fp8_latent 'wgmma16_rs_(combine_)?fp8$' fp8 latent
profile fp8_separate 'wgmma16_rs_(combine_)?fp8$' fp8 separate
# One archive of the reports and logs (a call brings back at most eight files), the rest then removed.
cd "$OUT" || exit 1
files=()
for f in *.ncu-rep *_details.txt *_sass.csv *_active.csv *_run.txt perf.txt sweep.* torch.*; do [ ! -e "$f" ] || files+=("$f"); done
tar -czf ncu.tgz "${files[@]}" && rm -f ./*.ncu-rep ./*_sass.csv ./*_run.txt || failed=1
exit "$failed"
