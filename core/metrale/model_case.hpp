// Model cases (SPEC §5): a golden safetensors file holding one decode step of
// a real attention layer, driven through the whole decode chain and compared
// with the file's tensors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/paged_cache.hpp"
#include "metrale/safetensors.hpp"

namespace metrale {

/// ‖out − ref‖₂ / ‖ref‖₂ and max |out − ref| of one output tensor, against its
/// documented tolerance on rel_l2. NaN never passes.
struct CaseMetric {
  std::string name;
  double rel_l2 = 0, max_abs = 0, tolerance = 0;
  bool pass = false;
};

/// Compare `out` with `ref` (same length; `internal` otherwise).
CaseMetric compare(std::string name, std::span<const float> out, std::span<const float> ref, double tolerance);

struct ReplayOptions {
  KvFormat kv_cache = KvFormat::fp8;
  std::uint32_t block_size = 16;
};

struct ReplayResult {
  std::string case_name, backend;
  KvFormat kv_cache = KvFormat::fp8;
  std::uint32_t block_size = 0;
  std::vector<CaseMetric> metrics;  // q_absorbed, o_latent, attn_out
  StageTimes stages;                // load → prefill → each decode stage
  bool pass = false;
};

/// The rel_l2 tolerance of a DeepSeek replay metric ("q_absorbed", "o_latent",
/// "attn_out") for a cache format (docs/tolerances.md says why).
double replay_tolerance(std::string_view metric, KvFormat format);

/// Replay a DeepSeek golden case: tokens 0..T−2 enter the cache through the
/// rope/assemble/store kernels, token T−1 runs the decode step; its rope_theta,
/// softmax_scale and rope ("pairs(2i,2i+1)" or "none") metadata are honoured.
/// FP8 scales are the case's amax / 448 (a per-tensor calibration). Errors:
/// `invalid_argument` / `not_found` naming a missing or malformed tensor or
/// metadata key; `unsupported` for another rope layout; the backend's.
ReplayResult replay_deepseek_case(GpuBackend& gpu, const SafeTensors& file, std::string case_name,
                                  const ReplayOptions& options);

}  // namespace metrale
