#!/usr/bin/env bash
# racecheck's hazards in the heads-in-M block, one by one (docs/conformance.md, twenty-seventh
# session): each hazard with its blocks, threads and shared-memory address over `conform --only
# latent`, then over hm_trace's launches of both builds (no programmatic dependent launch there),
# one wave of blocks (128 on the H200's 132 SMs; two waves did not finish under racecheck in 90 s).
# Needs .carry/ (scripts/pack_device.sh, hm_trace built); logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
race() {
  local name=$1; shift
  local t0=$SECONDS
  timeout 90 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 40 --report-api-errors no "$@" \
    > "$OUT/race_$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s; $(grep -c "hazard detected" "$OUT/race_$name.txt") hazards shown;" \
    "$(grep "RACECHECK SUMMARY" "$OUT/race_$name.txt")"
}
race conform_latent .carry/bin/metrale conform --backend cuda --no-golden --only latent
for mode in partial cluster; do
  race "hm_$mode" .carry/bin/hm_trace 32 4096 128 2048 "$mode"  # grid 2 × 2 × 32
done
