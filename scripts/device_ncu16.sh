#!/usr/bin/env bash
# What holds up the warp-specialised 16-head block over one latent pool (docs/performance.md,
# "Forty-first session"): ncu's full set (warp states, scheduler, shared-memory wavefronts and bank
# conflicts, pipes) and its per-SASS-line stall samples for mla_paged_decode_wgmma16_nvfp4 at
# B = 32 × 4K × 16 heads over one latent pool, with the FP8 staged register-operand block
# (mla_paged_decode_wgmma16_rs_fp8, the entry FP8 takes there) and the NVFP4 two-pool step beside
# it. If the card is an H200, the sweep (scripts/device_perf.sh, TIMING=blocking) runs first.
# Needs .carry/ (scripts/pack_device.sh); logs under $OUT, archived into ncu.tgz.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
case "$gpu" in *H200*) TIMING=blocking OUT=$OUT bash scripts/device_perf.sh > "$OUT/perf.txt" 2>&1; echo "sweep: exit $?";; esac
M=.carry/bin/metrale
row=(--batch 32 --context 4096 --heads 16)
profile() {  # NAME KERNEL_REGEX CACHE LAYOUT
  t0=$SECONDS
  timeout 200 ncu --set full --import-source yes --launch-skip 2 -c 1 -k "regex:$2" -o "$OUT/$1" -f \
    $M bench --backend cuda --sweep --cache "$3" --layout "$4" "${row[@]}" > "$OUT/$1_run.txt" 2>&1
  echo "$1: exit $? in $((SECONDS - t0)) s"
  ncu -i "$OUT/$1.ncu-rep" --page details > "$OUT/$1_details.txt" 2>&1
  ncu -i "$OUT/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1_sass.csv" 2>&1
  grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Shared .*Bank|Stall|No Eligible|Active Warps Per|Eligible Warps" \
    "$OUT/$1_details.txt" | head -n 30
}
profile nvfp4_latent 'wgmma16_nvfp4$' nvfp4 latent
profile fp8_latent 'wgmma16_rs' fp8 latent
profile nvfp4_separate 'wgmma16_nvfp4$' nvfp4 separate
(cd "$OUT" && tar -czf ncu.tgz ./*.ncu-rep ./*_details.txt ./*_sass.csv ./*_run.txt ./perf.txt ./sweep.* ./torch.* 2>/dev/null;
  rm -f ./*.ncu-rep ./*_sass.csv ./*_run.txt)
ls -la "$OUT"
