#!/usr/bin/env bash
# Pack what scripts/device_conformance.sh needs into .carry/ (git-ignored): stripped binaries,
# the shared libraries the Debian build links (fmt, spdlog), the kernels' fatbins and PTX, and
# the golden cases from ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir -p .carry/bin .carry/lib .carry/kernels .carry/golden
cp build/bin/metrale build/bin/metrale_tests .carry/bin/ && strip .carry/bin/*
cp -L /usr/lib/x86_64-linux-gnu/libfmt.so.9 /usr/lib/x86_64-linux-gnu/libspdlog.so.1.10 .carry/lib/
cp build/kernels/*.fatbin build/kernels/*.ptx .carry/kernels/
cp "${METRALE_GOLDEN_DIR:-../shared/golden}"/*.safetensors .carry/golden/
du -sh .carry
