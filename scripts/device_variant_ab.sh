#!/usr/bin/env bash
# A kernel experiment against the product's build on the device machine (docs/performance.md):
# each build of mla_wgmma under .carry/kernels/variants/<name>/ (loaded through
# METRALE_CUDA_FATBIN_DIR) takes turns with the built-in kernels on the same sweep rows, twice
# over (base, each variant, base, each variant), so that drift falls on all alike; then each
# variant under the GPU suite's wgmma and latent tests, `conform --only wgmma16` and memcheck,
# racecheck and synccheck over it. SWEEP holds the sweep's options (the 16-head rows of both
# formats and layouts unless given), TIMING the bench timing (blocking). Needs .carry/
# (scripts/pack_device.sh, after building the variant's fatbin there; docs/performance.md,
# "Method"); logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export METRALE_GOLDEN_DIR=$PWD/.carry/golden
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }  # the test binary's baked source path
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
M=.carry/bin/metrale
read -r -a sweep <<< "${SWEEP:---heads 16 --layout separate latent}"
variants=(.carry/kernels/variants/*/)
[ -d "${variants[0]}" ] || { echo "no variant builds under .carry/kernels/variants/ (see the header)" >&2; exit 2; }
{
  for rep in 1 2; do
    for dir in base "${variants[@]}"; do
      build=$(basename "$dir")
      fatbin=()  # the base: the kernels built into the binary
      [ "$build" = base ] || fatbin=("METRALE_CUDA_FATBIN_DIR=$PWD/$dir")
      t0=$SECONDS
      env "${fatbin[@]}" $M bench --backend cuda --sweep --timing "${TIMING:-blocking}" "${sweep[@]}" \
        --json "$OUT/${build}_$rep.json" > "$OUT/${build}_$rep.txt" 2>&1
      echo "$build rep $rep: exit $? in $((SECONDS - t0)) s"
    done
  done
} | tee "$OUT/ab.txt"
# Best of the two runs per row, the variant's time over the base's (below 1: the variant is faster).
python3 - "$OUT" <<'PY' | tee "$OUT/ab_table.txt"
import glob, json, os, sys
out = sys.argv[1]
def best(prefix):
    rows = {}
    for path in glob.glob(os.path.join(out, prefix + "_[12].json")):
        for r in json.load(open(path))["sweep"]:
            key = (r["cache"], r["layout"], r["B"], r["L"], r["H"])
            rows[key] = min(rows.get(key, float("inf")), r["split_us"])
    return rows
base = best("base")
for path in sorted(glob.glob(os.path.join(out, "*_1.json"))):
    name = os.path.basename(path)[:-7]
    if name == "base":
        continue
    for key, t in sorted(best(name).items()):
        if key in base:
            print(name, *key, f"{base[key]:.1f} -> {t:.1f} us ({t / base[key]:.3f}x)")
PY
# Then each variant under the checks, within CHECK_SECONDS (150 s unless given; a check not begun
# by then is left out). The checks' words are not globbed: "[wgmma],[latent]" is a test spec.
set -f
deadline=$((SECONDS + ${CHECK_SECONDS:-150}))
for dir in "${variants[@]}"; do
  name=$(basename "$dir")
  only="--only wgmma16"
  for check in "tests:.carry/bin/metrale_tests [wgmma],[latent]" \
    "conform:$M conform --backend cuda --no-golden $only" \
    "memcheck:compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $M conform --backend cuda --no-golden $only" \
    "racecheck:compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 9 $M conform --backend cuda --no-golden $only" \
    "synccheck:compute-sanitizer --tool synccheck --num-cuda-barriers 100000 --report-api-errors no --error-exitcode 9 $M conform --backend cuda --no-golden $only"; do
    left=$((deadline - SECONDS))
    [ "$left" -gt 5 ] || { echo "$name ${check%%:*}: not run (CHECK_SECONDS spent)"; continue; }
    t0=$SECONDS
    log="$OUT/${name}_${check%%:*}.txt"
    (cd /work/main && METRALE_CUDA_FATBIN_DIR=$PWD/$dir timeout "$left" ${check#*:}) > "$log" 2>&1
    echo "$name ${check%%:*}: exit $? in $((SECONDS - t0)) s; $(tail -n 1 "$log")"
  done
done | tee -a "$OUT/ab.txt"
set +f
# One archive of the logs, the single files then removed: a call brings back only a few files.
(cd "$OUT" && find . -maxdepth 1 -type f \( -name '*.txt' -o -name '*.json' \) ! -name ab.txt ! -name ab_table.txt |
  tar -czf logs.tgz -T - && find . -maxdepth 1 -type f ! -name logs.tgz ! -name ab.txt ! -name ab_table.txt -delete)
