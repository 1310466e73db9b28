// Plain float64 implementations of the math (SPEC terms: the *reference*),
// independent of the ports and the kernels: they share only the number-format
// decoders, which are checked against ml_dtypes' tables. Inputs are the values
// the kernels see (BF16 or cache codes); all arithmetic is float64 (Eigen).
// Errors, every function: `invalid_argument` ("reference: …") for a span shorter than its
// shape needs, naming it and both counts, and for a zero it would divide by (num_kv_heads,
// block_size, a rope width, dq), num_q_heads not a multiple of num_kv_heads, and q_head_dim
// past kv_cache_dim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "metrale/paged_cache.hpp"

namespace metrale::ref {

/// out[h, n] = Σ_{j<k} weight[h, n, j] · input[h·input_stride + j] → [num_heads, n_out].
std::vector<double> batched_gemv(std::span<const float> input, std::span<const float> weight, std::uint32_t n_out,
                                 std::uint32_t k, std::uint32_t num_heads, std::uint32_t input_stride);

/// Rotate pairs (2i, 2i+1) of each row of x [rows, rope] in place:
/// angle = pos · theta^(−2i/rope).
void rope_pairs(std::span<double> x, std::uint32_t rope, std::uint32_t pos, double theta);

/// Everything a paged decode launch reads, as host copies (SPEC §3).
struct PagedAttentionProblem {
  KvFormat format = KvFormat::fp8;
  std::span<const float> q;  // [num_seqs, num_q_heads, q_head_dim]
  std::span<const std::uint8_t> k_pool, v_pool;
  std::span<const std::int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  std::span<const std::int32_t> seq_lens;      // [num_seqs]
  std::uint32_t num_seqs = 0, max_blocks_per_seq = 0, num_q_heads = 0, num_kv_heads = 1, q_head_dim = 0,
                kv_cache_dim = 0, block_size = 0;
  double inv_sqrt_d = 0;
  // FP8
  double k_scale = 1, v_scale = 1;
  std::uint64_t cache_stride = 0;
  std::uint32_t sliding_window = 0;
  std::span<const float> sinks;             // [num_q_heads] or empty
  std::span<const std::uint8_t> comp_pool;  // [num_seqs, comp_block_count, 2, cache_stride] or empty
  std::uint32_t comp_block_count = 0;
  // NVFP4
  std::uint64_t block_stride_bytes = 0, data_section_bytes = 0;
};

/// o [num_seqs, num_q_heads, kv_cache_dim] in float64, by the definition:
/// gather the key set, softmax (with the sink in the denominator), weighted sum.
std::vector<double> paged_attention(const PagedAttentionProblem& p);

/// The split decode's per-chunk partials (mla_paged_decode_split_*) by their definition: the
/// key set of each sequence, in order, cut into chunks of `keys_per_split` keys; for chunk z of
/// head h, with logits s_j = (q_h·k_j)·logit_scale over the raw cache values (E4M3 codes without
/// k_scale and v_scale; NVFP4 with its block scales): m = max s_j, l = Σ e^(s_j − m),
/// O = Σ e^(s_j − m)·v_j; a chunk with no keys has m = −∞, l = 0 and O = 0.
struct SplitPartials {
  std::vector<double> o;   // [num_seqs, num_q_heads, num_splits, kv_cache_dim]
  std::vector<double> ml;  // [num_seqs, num_q_heads, num_splits, 2]: m, l
  // Magnitudes for a tolerance: the largest Σ_i |q_i·k_ji|·|logit_scale| and |s_j| over every
  // (sequence, head, key), and the largest Σ_j e^(s_j − m)·|v_jd| over every chunk and dim.
  double max_abs_qk = 0, max_abs_logit = 0, max_weighted_abs_v = 0;
};
SplitPartials split_partials(const PagedAttentionProblem& p, double logit_scale, std::uint32_t keys_per_split,
                             std::uint32_t num_splits);

/// The combine of the split decode by its definition: per (sequence, head), over the chunks with
/// keys (l ≠ 0, as the kernels count them: a NaN l counts), M = max(max m_z, sink),
/// o = v_scale·Σ e^(m_z−M)·O_z / (Σ e^(m_z−M)·l_z + e^(sink−M)), the sink only where some chunk
/// counts; zeros when none does. `max_abs_terms`: the largest v_scale·Σ e^(m_z−M)·|O_z| / denominator.
struct CombineResult {
  std::vector<double> o;  // [num_seqs, num_q_heads, kv_cache_dim]
  double max_abs_terms = 0;
};
CombineResult combine_partials(std::span<const float> o_partial, std::span<const float> ml_partial,
                               std::span<const float> sinks, std::uint32_t num_seqs, std::uint32_t num_q_heads,
                               std::uint32_t num_splits, std::uint32_t kv_cache_dim, double v_scale);

/// One K or V row of a cache pool decoded: `kv_cache_dim` values of KV head
/// `kv_head` at slot `slot` (block·block_size + offset); `scale` is the FP8
/// scale (unused for NVFP4). Errors: `internal` for a byte outside the pool.
std::vector<double> cache_row(const PagedAttentionProblem& p, std::span<const std::uint8_t> pool, std::int64_t slot,
                              std::uint32_t kv_head, double scale);

/// The DeepSeek absorbed-MLA decode step of one sequence by its definition
/// (golden README): q_absorbed = [W_UKᵀ q_nope ‖ rope(q_rope)], K_t = [c_t ‖ rope(k_rope_t)],
/// V_t = c_t, o = softmax(q_absorbed·Kᵀ·scale)·V, attn_out = W_UV·o.
struct DeepseekStepProblem {
  std::uint32_t heads = 0, tokens = 0, kv_lora = 512, rope = 64, nope = 128, v_head = 128;
  double softmax_scale = 0, rope_theta = 10000;
  bool rotate = true;                // false: the case's rope is "none"
  std::span<const float> q_nope;     // [heads, nope]
  std::span<const float> q_rope;     // [heads, rope]
  std::span<const float> kv_latent;  // [tokens, kv_lora]
  std::span<const float> k_rope;     // [tokens, rope], before rotation
  std::span<const float> w_uk;       // [heads, nope, kv_lora]
  std::span<const float> w_uv;       // [heads, v_head, kv_lora]
};
struct DeepseekStepResult {
  std::vector<double> q_absorbed;  // [heads, kv_lora + rope]
  std::vector<double> o_latent;    // [heads, kv_lora]
  std::vector<double> attn_out;    // [heads, v_head]
};
/// Token t is at position t; the last token is the query.
DeepseekStepResult deepseek_step(const DeepseekStepProblem& p);

// ---- Kimi K3 (SPEC §4) ----------------------------------------------------------

/// x [heads, nope + rope] with dims [nope, nope + rope) of each row rotated by
/// pairs (2i, 2i+1), angle = pos · theta^(−2i/rope) (an odd last dim, which the
/// launchers refuse when rotating, stays); unchanged when use_nope.
std::vector<double> k3_rope(const std::vector<float>& x, std::uint32_t heads, std::uint32_t nope, std::uint32_t rope,
                            std::uint32_t pos, double theta, bool use_nope);

struct K3SdpaProblem {
  std::uint32_t heads = 1, dq = 1, dv = 1, seq_len = 0;
  bool use_gate = false;
  std::vector<float> q, k, v, g;  // [heads, dq], [seq_len, heads, dq], [seq_len, heads, dv], [heads, dv]
};
/// out [heads, dv] by the definition: softmax over all keys with scale
/// 1/√dq, the weighted sum of V, then sigmoid(g) elementwise when use_gate;
/// zeros without keys.
std::vector<double> k3_sdpa_gate(const K3SdpaProblem& p);

/// The K3 split SDPA's partial results by their definition: chunk c of head h takes keys
/// [c·keys_per_chunk, (c+1)·keys_per_chunk) ∩ [0, seq_len), s_j = q·k_j/√dq, m = max s_j,
/// l = Σ e^(s_j − m), O = Σ e^(s_j − m)·v_j; a chunk with no keys has m = −∞, l = 0, O = 0.
/// Layout as the kernel's: o [num_chunks, heads, dv], ml [num_chunks, heads, 2]. The
/// magnitudes are for a tolerance: the largest Σ|q_i·k_ji|/√dq and the largest |v_jd|.
struct K3SplitPartials {
  std::vector<double> o, ml;
  double max_abs_qk = 0, max_abs_v = 0;
};
K3SplitPartials k3_split_partials(const K3SdpaProblem& p, std::uint32_t keys_per_chunk, std::uint32_t num_chunks);

}  // namespace metrale::ref
