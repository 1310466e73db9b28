#!/usr/bin/env bash
# Why B = 128 × 64K × 128 heads takes longer as a `metrale bench` sweep step than the same block
# alone in hm_trace (docs/performance.md, "Twenty-seventh session"). Both programs on that row and
# on a control row (128 × 16K × 128); hm_trace also on bench's data (HM_TRACE_AS_BENCH=1); bench
# also in groups of 5 launches and after the two-pool problem of the same row (as in the sweep);
# then ncu's kernel duration at base clocks in both programs; the SM clock and power logged
# throughout. Needs .carry/bin/hm_trace (scripts/pack_device.sh); logs under $OUT. About five
# minutes; run it as `timeout 400 scripts/device_step_gap.sh`. Its answer (thirty-first session,
# docs/performance.md): the split plan, which then cut that row into 18 unfused chunks; it now runs
# one fused chunk, so on a build from then on both programs time the same launches.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 100 > "$OUT/clocks.csv" 2>&1 &
smi=$!
hm() { echo "$(date +%T) hm_trace $*: $(.carry/bin/hm_trace "$@" 2>&1 | tail -n 1)"; }
step() {  # LAYOUTS then bench's sweep options
  echo "$(date +%T) bench --layout $*:"
  .carry/bin/metrale bench --backend cuda --sweep --cache fp8 --layout "$@" 2>&1 | grep -E "latent|separate|rror" | head -n 4
}
{
  hm 128 65536 128 65536 cluster
  HM_TRACE_AS_BENCH=1 hm 128 65536 128 65536 cluster
  step latent --batch 128 --context 65536 --heads 128
  step latent --batch 128 --context 65536 --heads 128 --group 5
  step separate,latent --batch 128 --context 65536 --heads 128  # as the sweep: the two pools' problem first
  hm 128 16384 128 16384 cluster
  step latent --batch 128 --context 16384 --heads 128
} 2>&1 | tee "$OUT/gap.txt"
metrics=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
ncu --clock-control base --metrics $metrics -k regex:latent_combine -c 2 .carry/bin/hm_trace 128 65536 128 65536 cluster \
  > "$OUT/ncu_hm.txt" 2>&1
echo "ncu hm_trace: exit $?"
ncu --clock-control base --metrics $metrics -k regex:latent_combine -c 2 .carry/bin/metrale bench --backend cuda --sweep \
  --cache fp8 --layout latent --batch 128 --context 65536 --heads 128 > "$OUT/ncu_bench.txt" 2>&1
echo "ncu bench: exit $?"
kill $smi
grep -E "Duration|duration|elapsed|bytes_read|hit_rate" "$OUT"/ncu_*.txt
