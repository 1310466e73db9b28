// One DeepSeek-V4-Flash absorbed-MLA decode step on any backend (SPEC §3,
// golden README): every stage is a kernel of module `mla_absorbed`.
//
//   q_full [S,H,192] ─gemv W_UKᵀ─► q_absorbed[:, :, :512]
//                    ─scatter─► q_rope [S,H,64] ─rope─► writeback ─► q_absorbed[:, :, 512:]
//   k_rope ─rope─► assemble [c ‖ k_rope] / [c ‖ 0] ─store─► paged cache (slot mapping)
//   paged decode (fp8 | nvfp4) ─► o [S,H,576] ─gemv W_UV─► attn_out [S,H,128]
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/buffer.hpp"
#include "metrale/formats.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_fast.hpp"
#include "metrale/paged_cache.hpp"

namespace metrale {

/// MLA dimensions; the defaults are DeepSeek's.
struct MlaDims {
  std::uint32_t kv_lora = 512, rope = 64, nope = 128, v_head = 128;
  std::uint32_t hd() const { return nope + rope; }            // q head dim before absorption
  std::uint32_t cache_dim() const { return kv_lora + rope; }  // mla_cache_dim, 576
};

struct DeepseekMlaConfig {
  std::uint32_t heads = 0;
  MlaDims dims;
  float softmax_scale = 0.0f;  // 1/√(nope + rope) for DeepSeek
  float rope_theta = 10000.0f;
  bool rotate = true;  // false: no rotation anywhere (rope "none")
};

/// How long each stage of the last call took, host wall clock after a
/// synchronize, in milliseconds.
using StageTimes = std::vector<std::pair<std::string, double>>;

class DeepseekMlaDecoder {
 public:
  /// `w_uk` [heads, nope, kv_lora] and `w_uv` [heads, v_head, kv_lora], BF16
  /// (rows of HF's kv_b_proj). W_UK is kept transposed per head so absorption
  /// is one batched GEMV. Errors: `invalid_argument` for a weight size, a zero
  /// dimension (rope included), kv_lora + rope or nope + rope past 2^32 − 1,
  /// kv_lora + rope past kMaxKvCacheDim (1024), heads past 65535, an odd rope
  /// when rotating, a softmax_scale (or,
  /// when rotating, a rope_theta) that is not finite and > 0, a softmax_scale
  /// that times log2(e) (and, on an FP8 cache, times its k_scale) passes FP32's
  /// range (the decode kernels' base-2 logits), a cache whose
  /// kv_cache_dim is not kv_lora + rope, that has more than one KV head or that
  /// lives on another backend; the backend's.
  DeepseekMlaDecoder(GpuBackend& gpu, DeepseekMlaConfig cfg, std::span<const Bf16> w_uk, std::span<const Bf16> w_uv,
                     PagedKvCache& cache);

  /// Append earlier tokens to the cache through the decode step's own kernels
  /// (rope, assemble, store). Token i belongs to `seqs[i]` at `positions[i]`:
  /// kv_latent [n, kv_lora], k_rope [n, rope] (before rotation). All or
  /// nothing: on any error the cache is unchanged. Errors: `invalid_argument`
  /// for sizes, a NaN or infinite value in kv_latent or k_rope, or one past
  /// what the cache format holds (SPEC §3: E4M3's 448 × the row's scale, NVFP4's
  /// 448 × 6, up to where rounding reaches them; rotated, a k_rope pair's
  /// length), each named by index, or, rotating, a position past 2^24 (FP32
  /// holds no larger one exactly); `capacity_exceeded`, `not_found`, the backend's.
  void append_kv(std::span<const SeqId> seqs, std::span<const float> kv_latent, std::span<const float> k_rope,
                 std::span<const std::uint32_t> positions);

  struct StepInput {
    std::span<const SeqId> seqs;               // S distinct sequences
    std::span<const float> q_nope;             // [S, H, nope]
    std::span<const float> q_rope;             // [S, H, rope], before rotation
    std::span<const float> kv_latent;          // [S, kv_lora], the new token's
    std::span<const float> k_rope;             // [S, rope], before rotation
    std::span<const std::uint32_t> positions;  // [S]
  };
  struct StepOutput {
    std::vector<float> q_absorbed;  // [S, H, kv_lora + rope]
    std::vector<float> o_latent;    // [S, H, kv_lora]
    std::vector<float> attn_out;    // [S, H, v_head]
  };
  /// One decode step: each sequence's new token enters the cache and attends
  /// over it. On any error the cache is unchanged. Errors: as append_kv, plus
  /// `invalid_argument` for more than 65535 sequences (the decode's grid), a
  /// sequence listed twice or a NaN or infinity in q
  /// (every size and value checked before the first launch), and, after the
  /// kernels ran and before the token is kept, for a row whose scores could
  /// overflow FP32 (softmax_scale × ‖q_absorbed‖₁ × the cache's largest value
  /// reaches 2^126) or an output that is not finite.
  StepOutput step(const StepInput& in);

  const StageTimes& stage_times() const { return times_; }
  const DeepseekMlaConfig& config() const { return cfg_; }

 private:
  // The new tokens' sizes and values (append_kv's and step's rules), before any backend call.
  void check_new_tokens(std::size_t n, std::span<const float> kv_latent, std::span<const float> k_rope,
                        std::span<const std::uint32_t> positions) const;
  // Before a step commits: no row's scores can have overflowed FP32 and every output is finite.
  void check_step_output(const StepOutput& out) const;
  // Rope, assemble and store the new tokens (checked by the caller) into reserved slots.
  SlotReservation stage_kv(std::span<const SeqId> seqs, std::span<const float> kv_latent, std::span<const float> k_rope,
                           std::span<const std::uint32_t> positions);
  void attend(DevicePtr q_absorbed, DevicePtr o, std::span<const SeqId> seqs);
  void mark(const char* stage);

  GpuBackend& gpu_;
  DeepseekMlaConfig cfg_;
  PagedKvCache& cache_;
  MlaAbsorbedKernels k_;
  MlaFastKernels fast_;
  DeviceBuffer w_uk_t_;  // [H, kv_lora, nope] bf16
  DeviceBuffer w_uv_;    // [H, v_head, kv_lora] bf16
  StageTimes times_;
  double last_mark_ = 0.0;
};

}  // namespace metrale
