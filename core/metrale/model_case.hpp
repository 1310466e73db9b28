// Model cases (SPEC §5): a golden safetensors file holding one decode step of
// a real attention layer, driven through the whole decode chain and compared
// with the file's tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/paged_cache.hpp"
#include "metrale/safetensors.hpp"

namespace metrale {

/// ‖out − ref‖₂ / ‖ref‖₂ (where ref is all zeros: 0 for an all-zero out, else infinite) and
/// max |out − ref| of one output tensor, against its documented tolerance on rel_l2. NaN never
/// passes.
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
  bool latent = false;  // one pool for K and V (PagedCacheConfig::latent)
};

struct ReplayResult {
  std::string case_name, backend;
  KvFormat kv_cache = KvFormat::fp8;
  std::uint32_t block_size = 0;
  bool latent = false;
  std::vector<CaseMetric> metrics;  // q_absorbed, o_latent, attn_out
  StageTimes stages;                // load → prefill → each decode stage
  bool pass = false;
  /// What the replay found in the case's values that bears on the result: the K and V values the
  /// paged cache stores as zeros (an nvfp4 group whose E4M3 scale rounds to 0, SPEC §3; more than
  /// 1% of the values under an fp8 scale). `metrale replay` and `conform` print them beside it.
  std::vector<std::string> notes;
};

/// Whether `file` is a model case (a golden case of docs/conformance.md: a q_nope tensor and
/// heads metadata), which `metrale replay` takes, rather than a kernel case or another file.
bool is_model_case(const SafeTensors& file);

/// The checks of a model case both replays make that need no tensor's values, made on a header
/// (SafeTensors::read_header) before its data is read: the metadata heads, tokens, kv_lora_rank,
/// qk_rope_head_dim, qk_nope_head_dim and v_head_dim (1 to 1,000,000), rope, softmax_scale and
/// rope_theta, position (tokens − 1 where given), and the shapes of q_nope [heads, nope], q_rope
/// [heads, rope], kv_latent [tokens, kv_lora], k_rope [tokens, rope], w_uk [heads, nope, kv_lora],
/// w_uv [heads, v_head, kv_lora], and, where the file has them, q_absorbed [heads, kv_lora + rope],
/// o_latent [heads, kv_lora], attn_out, gate and attn_out_gated [heads, v_head]. Errors: as the
/// replays', `invalid_argument` or `not_found` naming the key or tensor (docs/conformance.md).
void check_model_case_header(const SafeTensors& header);

/// Whether `file` is the golden folder's number-format tables (ml_dtypes' E4M3 and E2M1 casts,
/// cases/golden/quant_codecs.safetensors: an fp8_e4m3fn_decode tensor), which the formats tests
/// read and no command runs.
bool is_format_tables(const SafeTensors& file);

/// The rel_l2 tolerance of a DeepSeek replay metric ("q_absorbed", "o_latent",
/// "attn_out") for a cache format (docs/tolerances.md says why).
double replay_tolerance(std::string_view metric, KvFormat format);

/// Replay a DeepSeek golden case: tokens 0..T−2 enter the cache through the
/// rope/assemble/store kernels, token T−1 runs the decode step; its rope_theta,
/// softmax_scale and rope ("pairs(2i,2i+1)" or "none") metadata are honoured.
/// FP8 scales are the case's amax / 448 (a per-tensor calibration; latent: one
/// scale, K's, for the shared rows). w_uk and
/// w_uv must be BF16 (the model's weights). Errors: `invalid_argument` /
/// `not_found` naming a missing or malformed tensor or metadata key (a tensor
/// of the wrong dtype or size included); the decoder's (a softmax_scale that is
/// not finite and > 0); `unsupported` for another rope layout; the backend's.
ReplayResult replay_deepseek_case(GpuBackend& gpu, const SafeTensors& file, std::string case_name,
                                  const ReplayOptions& options);

/// The rel_l2 tolerance of a Kimi K3 replay: the chain is FP32 with an
/// unquantised KV, so only FP32 rounding separates it from the file (it
/// measures ≈ 2e-7; docs/k3.md).
inline constexpr double kKimiReplayTolerance = 1e-4;

/// Replay a Kimi K3 golden case (SPEC §4, golden README) through the
/// `K3MlaDecoder`, token by token at positions 0..T−1: token t's k = [w_uk[h] ·
/// kv_latent[t] ‖ k_rope[t]] and v = w_uv[h] · kv_latent[t] per head (float64
/// on the host, then FP32); the earlier tokens' q and gate are zeros (their
/// outputs are not compared); the last token's q = [q_nope ‖ q_rope] and gate
/// from the file. Rope "none" is NoPE, "pairs(2i,2i+1)" rotates at rope_theta.
/// One metric, named after the tensor it compares: attn_out_gated when the file
/// has a gate, else attn_out, within kKimiReplayTolerance. `device_path`: the KV
/// lives on the device (MlaDeviceKv), else on the host (MlaKv). The result's
/// kv_cache/block_size fields do not apply (block_size 0). Errors:
/// `invalid_argument` / `not_found` naming a missing or malformed tensor or
/// metadata key, or tokens × heads × (qk_head_dim + v_head_dim) past 2^28 (the
/// K and V values the replay holds, checked before any tensor is read);
/// `unsupported` for another rope layout or a softmax_scale that is not
/// 1/√(qk_nope_head_dim + qk_rope_head_dim) (the kernel's); the decode's. `progress`, when
/// given, is called after each token with the tokens decoded and the file's token count (a
/// replay near its work bound runs for minutes: the caller can say how far it is).
ReplayResult replay_kimi_case(GpuBackend& gpu, const SafeTensors& file, std::string case_name, bool device_path,
                              const std::function<void(std::uint32_t done, std::uint32_t tokens)>& progress = {});

}  // namespace metrale
