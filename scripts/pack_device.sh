#!/usr/bin/env bash
# Pack what scripts/device_conformance.sh needs into .carry/ (git-ignored): stripped binaries,
# the shared libraries the Debian build links (fmt, spdlog), the kernels' fatbins and PTX, and
# the golden cases.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/bin .carry/lib .carry/kernels .carry/golden
# fuzz_capacity: the test that kills a fuzz driver mid-run (all six drivers would pass the carry limit)
cp build/bin/metrale build/bin/metrale_tests build/bin/fuzz_capacity .carry/bin/ && strip .carry/bin/*
# hm_trace (scripts/device_latent.sh), where `cmake --build build --target hm_trace` built it
[ ! -x build/bin/hm_trace ] || cp build/bin/hm_trace .carry/bin/
cp -L /usr/lib/x86_64-linux-gnu/libfmt.so.9 /usr/lib/x86_64-linux-gnu/libspdlog.so.1.10 .carry/lib/
cp build/kernels/*.fatbin build/kernels/*.ptx .carry/kernels/
# The golden cases as the test suite finds them: METRALE_GOLDEN_DIR, else ../shared/golden, else the copies here.
golden=${METRALE_GOLDEN_DIR:-}
[ -n "$golden" ] || { [ -d ../shared/golden ] && golden=../shared/golden || golden=cases/golden; }
cp "$golden"/*.safetensors .carry/golden/
du -sh .carry
