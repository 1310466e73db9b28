#!/usr/bin/env bash
# The heads-in-M block in pairs (wgmma_hm_decode's kPair: the blocks of two head groups share each
# tile's loads and conversion through distributed shared memory) against the unpaired block, on
# the sweep's 128-head rows over one latent pool, at the dispatcher's chunk lengths: each pair mode
# checks its bits against the unpaired block's and prints both times (bench/hm_trace.cu). Then the
# same check on ragged sequences (empty chunks, partial tiles), the trace build of both,
# memcheck, racecheck and synccheck on small pairs, and ncu's sections for both blocks. Needs .carry/bin/hm_trace and hm_trace_cycles
# (`cmake --build build --target hm_trace`, then scripts/pack_device.sh); logs under $OUT. About
# four minutes; run it as `timeout 500 scripts/device_pair.sh`.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
run() {  # one command, at most a minute (a pair that never meets its peer would hang)
  echo "$(date +%T) $*"
  timeout 60 "$@" 2>&1 | tail -n 4
  echo "exit ${PIPESTATUS[0]}"
}
hm=.carry/bin/hm_trace
{
  # B L H KEYS_PER_SPLIT: the plan's chunks on the H200 (one block an SM, 132 SMs)
  for row in "32 4096 128 2048" "128 4096 128 4096" "32 16384 128 8192" "128 16384 128 16384" "32 65536 128 32768"; do
    run $hm $row pair-cluster
    run $hm $row pair
  done
  HM_TRACE_RAGGED=1 run $hm 24 1024 128 256 pair-cluster
  HM_TRACE_RAGGED=1 run $hm 24 1024 128 256 pair
  HM_TRACE_RAGGED=1 run $hm 16 4096 256 512 pair
  run .carry/bin/hm_trace_cycles 32 16384 128 8192 cluster
  run .carry/bin/hm_trace_cycles 32 16384 128 8192 pair-cluster
} 2>&1 | tee "$OUT/pair.txt"
for tool in memcheck racecheck "synccheck --num-cuda-barriers 100000"; do
  for mode in pair pair-cluster; do
    # shellcheck disable=SC2086  # the tool's options split on purpose
    HM_TRACE_RAGGED=1 HM_TRACE_CHECK_ONLY=1 timeout 120 compute-sanitizer --tool $tool $hm 6 512 128 128 $mode \
      > "$OUT/sanitizer.txt.part" 2>&1
    echo "compute-sanitizer $tool, $mode: exit $? — $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.txt.part" | head -n 1)"
    cat "$OUT/sanitizer.txt.part" >> "$OUT/sanitizer.txt"
  done
done 2>&1 | tee -a "$OUT/pair.txt"
rm -f "$OUT/sanitizer.txt.part"
# Where the two blocks' time goes: the first two launches of a pair-cluster run are the unpaired
# block (the bit check's reference) and the paired one.
timeout 150 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats -k regex:'latent_combine|hm_pair' -c 2 $hm 32 16384 128 8192 pair-cluster \
  > "$OUT/ncu_pair.txt" 2>&1
echo "ncu: exit $?" | tee -a "$OUT/pair.txt"
