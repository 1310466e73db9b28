#!/usr/bin/env bash
# Pack what the device scripts (scripts/device_*.sh) need into .carry/pack.tgz (git-ignored):
# stripped binaries, the shared libraries the Debian build links (fmt, spdlog), the kernels'
# fatbins (built into the binaries as well; cuobjdump lists these files) and PTX
# (ptx_signature_test reads it), and the golden cases. The working tree and the carry travel
# under 64 MiB together, so the carry goes compressed; the device scripts unpack it into .carry/.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d) && trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,lib,kernels,golden}
# fuzz_capacity: the test that kills a fuzz driver mid-run; fuzz_argorder, fuzz_validation: the test of the
# launcher families on the devices the emulator plays; fuzz_paged: the test of a failure's report.txt
# (all six drivers would pass the carry limit)
cp build/bin/metrale build/bin/metrale_tests build/bin/fuzz_capacity build/bin/fuzz_argorder build/bin/fuzz_validation build/bin/fuzz_paged "$stage/bin/"
# hm_trace's builds (scripts/device_latent.sh, device_step_gap.sh, device_hm_variants.sh) and
# step_trace (device_step_trace.sh), where `cmake --build build --target hm_trace step_trace` built them
for tool in hm_trace hm_trace_cycles hm_trace_preg hm_trace_grouped step_trace; do
  [ ! -x "build/bin/$tool" ] || cp "build/bin/$tool" "$stage/bin/"
done
strip "$stage"/bin/*
cp -L /usr/lib/x86_64-linux-gnu/libfmt.so.9 /usr/lib/x86_64-linux-gnu/libspdlog.so.1.10 "$stage/lib/"
cp build/kernels/*.fatbin build/kernels/*.ptx "$stage/kernels/"
# the experiments' builds of mla_wgmma (kernels/variants/<name>/, METRALE_CUDA_FATBIN_DIR), where built
[ ! -d build/kernels/variants ] || cp -r build/kernels/variants "$stage/kernels/"
# The golden cases as the test suite finds them: METRALE_GOLDEN_DIR, else ../shared/golden, else the copies here.
golden=${METRALE_GOLDEN_DIR:-}
[ -n "$golden" ] || { [ -d ../shared/golden ] && golden=../shared/golden || golden=cases/golden; }
cp "$golden"/*.safetensors "$stage/golden/"
rm -rf .carry && mkdir .carry && tar -C "$stage" -czf .carry/pack.tgz .
du -sh .carry/pack.tgz
