#!/usr/bin/env bash
# On the device machine: run the carried binaries (built on Debian) against the GPU.
set -u
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export METRALE_GOLDEN_DIR=$PWD/.carry/golden
B=.carry/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/smi.txt
$B/metrale info 2>&1 | tee $OUT/info.txt
for kv in fp8 nvfp4; do
  for f in dsv3_h16_t37 dsv3_h8_t300_theta50k k3_nope_gate_h8_t65; do
    $B/metrale replay .carry/golden/$f.safetensors --backend cuda --kv-cache $kv 2>&1 | tee -a $OUT/replay.txt | grep -E "rel|q_abs|o_lat|attn|PASS|FAIL|error"
  done
done
