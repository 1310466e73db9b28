// Generated kernel cases: random inputs over chosen shapes and edge cases, the
// outputs poisoned with NaN (or a byte pattern), and the expected outputs from
// the float64 reference (metrale/reference.hpp) with a tolerance that states
// why. The tests, `metrale conform` and the fuzz drivers share these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metrale/kernel_case.hpp"
#include "metrale/paged_cache.hpp"
#include "metrale/reference.hpp"

namespace metrale::gen {

/// A paged-decode launch: a pool filled with random codes, block tables over
/// permuted physical blocks, every field of the launcher.
struct PagedSpec {
  KvFormat format = KvFormat::fp8;
  std::uint32_t num_seqs = 1, num_q_heads = 1, num_kv_heads = 1, q_head_dim = 8, kv_cache_dim = 8, block_size = 4;
  std::uint32_t max_blocks_per_seq = 4, num_blocks = 8;
  std::vector<std::int32_t> seq_lens;  // one per sequence; may be negative or past the table
  std::int32_t fill = -1;              // unused block-table columns
  float inv_sqrt_d = 0.125f;
  float q_range = 1.0f;  // q drawn from [−q_range, q_range], then rounded to BF16
  float k_scale = 0.75f, v_scale = 1.25f;  // FP8
  std::uint64_t cache_stride = 0;          // FP8; 0: the row width
  std::uint32_t sliding_window = 0;        // FP8
  bool sinks = false;                      // FP8
  bool comp_pool = false;                  // FP8
  std::uint32_t comp_block_count = 0;      // FP8
  std::uint32_t zero_groups_every = 0;     // NVFP4: every n-th group all zero (scale 0)
  /// Logits that rise or fall along the keys. Nonzero, FP8: every K code (and compressed entry)
  /// below 1 in magnitude, then dim 0 of the K row at position t of each sequence the E4M3 code of
  /// key_ramp·t (saturating at 448), so a head's logits move by about
  /// inv_sqrt_d·k_scale·key_ramp·q[0] per key — an online softmax must rescale after its first
  /// tile, and heads with q[0] < 0 never. NVFP4: the K row's first group at position t holds dim
  /// 0 alone, E2M1 6 under the scale E4M3(key_ramp·t/6) (so about key_ramp·t, saturating at 2688).
  float key_ramp = 0.0f;
  /// One pool as both caches (FlashMLA's latent layout): the case's v_cache aliases k_cache
  /// (KernelCase::aliases), so V = K row for row and o's last dims are P·K_rope.
  bool latent = false;
  /// Every K value 0 (FP8: the K pool's codes and the compressed entries' K rows; NVFP4: the K
  /// pool's bytes, scales included), after key_ramp: every logit 0 whatever Q and the scale, so
  /// the softmax is uniform (with latent, V is 0 too).
  bool zero_k = false;
  std::uint64_t seed = 1;

  /// Every field, for a failing case's report.
  std::string vars() const;
};

/// The case of a paged decode launch, expected o from the float64 reference.
/// Tolerance: BF16 rounding of o (2^-8 relative) plus 1e-5 of the largest |V|
/// for the FP32 softmax — far below what one missing or extra key changes. Errors:
/// `invalid_argument` for a spec the generator cannot build: a count or size of 0, num_kv_heads
/// not dividing num_q_heads, seq_lens not one a sequence, an FP8 cache_stride below the row
/// width, an NVFP4 row width not a multiple of 16 (as split_path_case's and the other cases'
/// built on it).
KernelCase paged_decode_case(const PagedSpec& spec);

/// The same launch through the split path of module mla_fast (entry
/// paged_decode_<format>_split_path). Tolerance: the reference's plus the rounding
/// of P (≤ 2^-9 of the largest |V|, BF16's; the kernel rounds P to FP16, finer);
/// against another backend, the same 2^-9 (one P element rounding the other way)
/// or one BF16 ulp.
KernelCase split_path_case(const PagedSpec& spec);

/// Which raw split entry a case runs: mla_fast's split or 16-head entry, or mla_wgmma's 64-head
/// or 16-head entry, its staged 16-head entry, or its 64-head entry over one latent pool (heads
/// in M).
enum class SplitEntry { split, split16, wgmma, wgmma16, wgmma16_rs, wgmma_latent };

/// The raw split kernel over the inputs of paged_decode_case(spec) (one KV head, the split
/// path's dimensions): entry mla_paged_decode_split_<format>, mla_paged_decode_split16_<format>
/// or (module mla_wgmma, 576-dim rows) mla_paged_decode_wgmma_<format> or
/// mla_paged_decode_wgmma16_<format> or mla_paged_decode_wgmma16_rs_<format> or
/// mla_paged_decode_wgmma_latent_<format> as `entry` says;
/// keys_per_split = tiles_per_split tiles of 32 keys (wgmma: 64), one chunk more than the table
/// holds (a chunk with no keys). Expected: ref::split_partials. Tolerance, against the reference
/// and against another backend alike: o_partial the FP16 rounding of P (2^-10) plus 3δ and the
/// FP32 sum, of the largest Σ e^(s−m)·|v|; ml_partial δ and, for l, 3δ relative — δ the FP32
/// logit error (4·√q_head_dim ulps of Σ|q·k|·|scale|). Errors: `invalid_argument` for
/// tiles_per_split 0 or past 2^24, and for wgmma_latent a spec that is not one latent pool
/// without compressed entries.
KernelCase split_kernel_case(const PagedSpec& spec, std::uint32_t tiles_per_split, SplitEntry entry);

/// mla_paged_decode_wgmma16_rs_combine_fp8 (up to 32 heads) or mla_paged_decode_wgmma_combine_fp8
/// (more: the 64-head blocks) — with `heads_in_m`, mla_paged_decode_wgmma_latent_combine_<format> —
/// FP8 (or NVFP4 with `heads_in_m`) with 576-dim rows, over the inputs of paged_decode_case(spec):
/// keys_per_split = 64·tiles_per_split, one chunk more than the table holds (a chunk with no
/// keys), at most 8. Expected o and tolerance: split_path_case(spec)'s. Errors:
/// `invalid_argument` for an NVFP4 spec without `heads_in_m`, other rows, or more than 8 chunks;
/// with `heads_in_m`, for 32 heads or fewer, or a spec that is not one latent pool without
/// compressed entries.
KernelCase fused_decode_case(const PagedSpec& spec, std::uint32_t tiles_per_split, bool heads_in_m = false);

/// The combine over random partials (a quarter of them empty chunks: m = −∞, l = 0), with
/// or without sinks. Expected: ref::combine_partials. Tolerance: BF16 output (2^-8 relative)
/// plus the FP32 sums' error of the largest Σ|weight·O| / denominator. Errors: `invalid_argument`
/// for a count of 0.
KernelCase combine_case(std::uint32_t num_seqs, std::uint32_t heads, std::uint32_t dim, std::uint32_t num_splits,
                        bool sinks, std::uint64_t seed);

/// `mla_batched_gemv` over [heads, n_out, k] with padded strides. Tolerance:
/// BF16 output rounding plus k·2^-23·max Σ|w·x| for FP32 accumulation. Errors:
/// `invalid_argument` for n_out, k or heads 0.
KernelCase gemv_case(std::uint32_t n_out, std::uint32_t k, std::uint32_t heads, std::uint32_t in_pad,
                     std::uint32_t out_pad, std::uint64_t seed);
/// The copy kernels: exact.
KernelCase q_rope_scatter_case(std::uint32_t nq, std::uint32_t nope, std::uint32_t rope, std::uint32_t kv_lora,
                               std::uint32_t extra_hd, std::uint32_t extra_cd, std::uint64_t seed);
KernelCase q_rope_writeback_case(std::uint32_t nq, std::uint32_t rope, std::uint32_t kv_lora, std::uint32_t extra_cd,
                                 std::uint64_t seed);
KernelCase cache_assemble_case(std::uint32_t kv_lora, std::uint32_t rope, std::uint32_t mla_cache_dim,
                               std::uint64_t seed);
/// `rope_pairs_bf16`. Tolerance: BF16 rounding plus the FP32 angle error (pos·2^-24 rad).
KernelCase rope_case(std::uint32_t rows, std::uint32_t rope, std::uint32_t pos, float theta, std::uint64_t seed);
/// The cache stores: exact bytes (the codecs are the reference, checked against ml_dtypes).
/// Errors: `invalid_argument` for block_size, num_blocks or row_width 0, more tokens than
/// slots, an FP8 pitch below row_width, an NVFP4 row_width not a multiple of 16.
KernelCase cache_store_case(KvFormat format, std::uint32_t num_tokens, std::uint32_t row_width,
                            std::uint32_t block_size, std::uint32_t num_blocks, std::uint64_t pitch,
                            std::uint64_t seed);

/// `k3_mla_maybe_rope_f32` on random q and k rows. Tolerance: FP32 rounding
/// plus the FP32 angle error (pos·2^-24 rad).
KernelCase k3_rope_case(std::uint32_t heads, std::uint32_t nope, std::uint32_t rope, std::uint32_t pos, float theta,
                        bool use_nope, std::uint64_t seed);
/// A random K3 SDPA problem from `seed`: q uniform in ±4 (logits spread enough that the softmax
/// is not flat), k, v and the gate logits g uniform in ±1.
ref::K3SdpaProblem k3_sdpa_problem(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len,
                                   bool use_gate, std::uint64_t seed);
/// `k3_mla_sdpa_gate_f32` over k3_sdpa_problem, or with `split_path` the same problem through
/// the split path (`k3_fast.k3_sdpa_split_path`: k3_sdpa's split and combine; dq, dv ≤ 256).
/// Tolerance: k3_sdpa_bound.
KernelCase k3_sdpa_case(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len, bool use_gate,
                        std::uint64_t seed, bool split_path = false);
/// `k3_mla_sdpa_split_f32` over k3_sdpa_problem (the same as k3_sdpa_case's) in `num_chunks` chunks
/// (a multiple of 4) of `keys_per_chunk` keys: the partials against ref::k3_split_partials,
/// within the FP32 logit error and a few roundings per key.
KernelCase k3_split_case(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len,
                         std::uint32_t keys_per_chunk, std::uint32_t num_chunks, std::uint64_t seed);
/// `k3_mla_sdpa_combine_f32` of random partials (a quarter of the chunks empty, their O NaN:
/// a chunk without keys must not count whatever its row holds) and gate
/// logits, against the float64 combine (ref::combine_partials) and sigmoid.
KernelCase k3_combine_case(std::uint32_t heads, std::uint32_t dv, std::uint32_t num_chunks, bool use_gate,
                           std::uint64_t seed);
/// The FP32 error bound of head h's SDPA output: a logit error δ (dq/32 + 8
/// rounded additions per lane sum and butterfly, over Σ|q·k|) moves each weight
/// by ≲ 2δ relatively; the online rescaling adds a few roundings per key to the
/// accumulators and the denominator.
double k3_sdpa_bound(const ref::K3SdpaProblem& p, std::size_t h);
/// How far two FP32 backends' head-h outputs may differ: each logit's δ (as k3_sdpa_bound) moves
/// a weight by ≲ 2δ relatively, and the exponentials (CUDA's expf and libm's exp differ by up to
/// 2 ulps) a few units of 2^-24, over the largest |V|.
double k3_sdpa_backend_bound(const ref::K3SdpaProblem& p, std::size_t h);

/// Every kernel with a launcher over its sweep of shapes and edge cases
/// (odd sizes, the model's dimensions, empty and block-edge sequences,
/// garbage in unused table columns, windows, sinks, compressed pools, zero
/// groups, scales that are not powers of two). Deterministic in `seed`.
std::vector<KernelCase> conformance_sweep(std::uint64_t seed = 1);

}  // namespace metrale::gen
