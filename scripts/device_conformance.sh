#!/usr/bin/env bash
# Hardware conformance on the device machine (see docs/conformance.md). The binaries are built on
# Debian with CUDA and carried in .carry/ (scripts/pack_device.sh); this runs the test suite on the
# GPU, metrale conform, the four compute-sanitizer tools over conform, the recorded case files and
# the benchmark, writing logs under $OUT. TESTS, where given, picks the suite's tests (a Catch2 test
# spec, e.g. "[wgmma],[latent]"; the whole suite, about 190 s on an H100, unless given).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" build/bin build/kernels /work
tar -C .carry -xzf .carry/pack.tgz  # scripts/pack_device.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export METRALE_GOLDEN_DIR=$PWD/.carry/golden
cp .carry/bin/* build/bin/ && cp -r .carry/kernels/. build/kernels/  # variants/ too, where packed
[ -e /work/main ] || ln -s "$PWD" /work/main  # the test binary's baked source path
cd /work/main || exit 1
M=build/bin/metrale
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  for f in build/kernels/*.fatbin; do echo "$f"; cuobjdump -lelf "$f"; cuobjdump -lptx "$f"; done
} > "$OUT/device.txt" 2>&1
step() { local name=$1; shift; local t0=$SECONDS; "$@" > "$OUT/$name.txt" 2>&1; echo "$name: exit $? in $((SECONDS - t0)) s"; }
step tests build/bin/metrale_tests ${TESTS:+"$TESTS"}
step conform $M conform --backend cuda --report "$OUT/conform" --golden .carry/golden
step cases $M case run cases/kernels --backend cuda
for tool in memcheck racecheck initcheck synccheck; do
  # The backend counts a kernel's parameters by asking cuFuncGetParamInfo for indices until one is
  # refused: one deliberate CUDA_ERROR_INVALID_VALUE per kernel, which is not a memory error.
  # synccheck tracks each mbarrier (cuda::barrier) the kernels use, and past its default count it
  # warns of an overflow and the launch fails under it (the heads-in-M block's four a block did).
  extra=()
  [ "$tool" = synccheck ] && extra=(--num-cuda-barriers 100000)
  step "sanitizer_$tool" env -u METRALE_GOLDEN_DIR compute-sanitizer --tool "$tool" "${extra[@]}" --report-api-errors no \
    --error-exitcode 9 --print-limit 20 $M conform --backend cuda --no-golden
done
step bench $M bench --backend cuda --json "$OUT/bench.json"
grep -B3 -A12 "FAILED" "$OUT/tests.txt" | head -60
tail -n 3 "$OUT/tests.txt" "$OUT/conform.txt" "$OUT/cases.txt"
for tool in memcheck racecheck initcheck synccheck; do tail -n 2 "$OUT/sanitizer_$tool.txt"; done
cat "$OUT/bench.txt"
# One archive of the logs: a call brings back only a few files (the twenty-third session lost the
# racecheck and memcheck logs to that limit).
logs=(conform tests.txt conform.txt cases.txt sanitizer_memcheck.txt sanitizer_racecheck.txt sanitizer_initcheck.txt
  sanitizer_synccheck.txt)
tar -C "$OUT" -czf "$OUT/reports.tgz" "${logs[@]}" && (cd "$OUT" && rm -rf "${logs[@]}")
