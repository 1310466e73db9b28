#!/usr/bin/env bash
# The heads-in-M block's cluster build against its partials' build, in their machine code: the two
# warpgroups' main loops must stay as the partials' build schedules them. When the cluster build
# put the combine's arithmetic on warpgroup 1's path, ptxas scheduled that walk apart and it ran
# 6–8% slower on the H200 (docs/performance.md, "Twenty-fifth session", "Twenty-sixth session").
# Run after changing kernels/mla_wgmma.cu. Needs nvcc, and the network once: the CUDA toolkit here
# has no cuobjdump (nor the nvdisasm it runs), so NVIDIA's wheels of both are fetched with pip into
# ~/.cache/metrale/sass_tools (CUOBJDUMP names another cuobjdump). Exits 1 when either loop has
# more than MAX (default 32) instructions in other places (bench/sass_loops.py).
#   scripts/sass_check.sh [MAX]
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-32}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -z "$cuobjdump" ] || ! command -v nvdisasm > /dev/null; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/metrale/sass_tools
  find_tool() { find "$cache" -name "$1" -type f 2>/dev/null | head -n 1 || true; }
  if [ -z "$(find_tool nvdisasm)" ] || [ -z "$(find_tool cuobjdump)" ]; then
    mkdir -p "$cache"
    python3 -m pip download --quiet --no-deps --dest "$cache" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for wheel in "$cache"/*.whl; do (cd "$cache" && python3 -m zipfile -e "$wheel" .); done
  fi
  chmod +x "$(find_tool nvdisasm)" "$(find_tool cuobjdump)"
  export PATH=$(dirname "$(find_tool nvdisasm)"):$PATH
  cuobjdump=${cuobjdump:-$(find_tool cuobjdump)}
fi
# The module's flags (cmake/cuda.cmake), its sm_90a image alone.
nvcc -std=c++20 -O3 -lineinfo -Ikernels -cubin -gencode=arch=compute_90a,code=sm_90a -o "$tmp/mla_wgmma.cubin" \
  kernels/mla_wgmma.cu
"$cuobjdump" -sass -fun mla_paged_decode_wgmma_latent_fp8 "$tmp/mla_wgmma.cubin" > "$tmp/partial.sass"
"$cuobjdump" -sass -fun mla_paged_decode_wgmma_latent_combine_fp8 "$tmp/mla_wgmma.cubin" > "$tmp/cluster.sass"
python3 bench/sass_loops.py "$tmp/partial.sass" "$tmp/cluster.sass" --check 0:"$max" --check 1:"$max"
