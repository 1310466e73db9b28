#include "metrale/reference.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "metrale/error.hpp"
#include "metrale/formats.hpp"
#include "validate.hpp"

namespace metrale::ref {

using Eigen::MatrixXd;
using Eigen::VectorXd;

namespace {

VectorXd to_vec(std::span<const float> x) {
  VectorXd v(static_cast<Eigen::Index>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) v[static_cast<Eigen::Index>(i)] = x[i];
  return v;
}

using detail::saturating_product;

// The oracle's own argument checks ("reference: …"): shapes its spans cannot hold, or a zero it
// would divide by, are named rather than read past or divided by.
constexpr detail::Validator kArgs{"reference"};
void require_size(const char* name, std::size_t size, std::uint64_t needed) {
  kArgs.check(size >= needed, "{} holds {} values, short of the {} its shape needs", name, size, needed);
}

void check(const PagedAttentionProblem& p) {
  kArgs.check(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0,
              "num_q_heads {} is not a multiple of num_kv_heads {}", p.num_q_heads, p.num_kv_heads);
  kArgs.check(p.block_size > 0, "block_size is 0");
  kArgs.check(p.q_head_dim <= p.kv_cache_dim, "q_head_dim {} exceeds kv_cache_dim {}", p.q_head_dim, p.kv_cache_dim);
  require_size("q", p.q.size(), saturating_product({p.num_seqs, p.num_q_heads, p.q_head_dim}));
  require_size("seq_lens", p.seq_lens.size(), p.num_seqs);
  require_size("block_tables", p.block_tables.size(), saturating_product({p.num_seqs, p.max_blocks_per_seq}));
  if (!p.sinks.empty()) require_size("sinks", p.sinks.size(), p.num_q_heads);
}

// e^(x − m) for x ≤ m the maximum, and 1 where x = m: as a sink's term, a +inf sink (m = +inf)
// takes the whole denominator, so o = 0, the formula's limit (SPEC §3's e^(sink − m) is NaN
// there); the kernels' exp_below.
double exp_below(double x, double m) { return x == m ? 1.0 : std::exp(x - m); }

// Softmax-weighted sum of V's rows by logits (plus an optional sink in the denominator).
VectorXd attend(const VectorXd& logits, const MatrixXd& v, bool has_sink, double sink) {
  if (logits.size() == 0) return VectorXd::Zero(v.cols());
  double m = logits.maxCoeff();
  if (has_sink) m = std::max(m, sink);
  const VectorXd e = (logits.array() - m).exp().matrix();
  const double denom = e.sum() + (has_sink ? exp_below(sink, m) : 0.0);
  return v.transpose() * e / denom;
}

}  // namespace

std::vector<double> batched_gemv(std::span<const float> input, std::span<const float> weight, std::uint32_t n_out,
                                 std::uint32_t k, std::uint32_t num_heads, std::uint32_t input_stride) {
  if (num_heads > 0) require_size("input", input.size(), std::uint64_t{num_heads - 1} * input_stride + k);
  require_size("weight", weight.size(), saturating_product({num_heads, n_out, k}));
  std::vector<double> out(std::size_t{num_heads} * n_out);
  for (std::uint32_t h = 0; h < num_heads; ++h) {
    MatrixXd w(n_out, k);
    for (std::uint32_t n = 0; n < n_out; ++n)
      for (std::uint32_t j = 0; j < k; ++j) w(n, j) = weight[(std::size_t{h} * n_out + n) * k + j];
    const VectorXd y = w * to_vec(input.subspan(std::size_t{h} * input_stride, k));
    std::copy(y.begin(), y.end(), out.begin() + static_cast<std::ptrdiff_t>(std::size_t{h} * n_out));
  }
  return out;
}

void rope_pairs(std::span<double> x, std::uint32_t rope, std::uint32_t pos, double theta) {
  if (x.empty()) return;
  kArgs.check(rope > 0 && x.size() % rope == 0, "{} values are not rows of rope {}", x.size(), rope);
  for (std::size_t r = 0; r < x.size() / rope; ++r) {
    for (std::uint32_t i = 0; i < rope / 2; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / rope);
      double& a = x[r * rope + 2 * i];
      double& b = x[r * rope + 2 * i + 1];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(angle) - b0 * std::sin(angle);
      b = b0 * std::cos(angle) + a0 * std::sin(angle);
    }
  }
}

namespace {

std::uint8_t byte_at(std::span<const std::uint8_t> pool, std::uint64_t at) {
  if (at >= pool.size()) fail(Errc::internal, "reference: cache byte {} outside a pool of {} bytes", at, pool.size());
  return pool[at];
}

// kv_cache_dim E4M3 codes of KV head kv_head in the row at byte `offset`, times `scale`.
std::vector<double> fp8_row(const PagedAttentionProblem& p, std::span<const std::uint8_t> pool, std::uint64_t offset,
                            std::uint32_t kv_head, double scale) {
  std::vector<double> row(p.kv_cache_dim);
  for (std::uint32_t d = 0; d < p.kv_cache_dim; ++d)
    row[d] = e4m3_decode(byte_at(pool, offset + std::uint64_t{kv_head} * p.kv_cache_dim + d)) * scale;
  return row;
}

// The same for NVFP4: element e of slot i of block b is nibble e of the data row times scale e/16.
std::vector<double> nvfp4_row(const PagedAttentionProblem& p, std::span<const std::uint8_t> pool, std::int64_t slot,
                              std::uint32_t kv_head) {
  std::vector<double> row(p.kv_cache_dim);
  const std::uint64_t width = std::uint64_t{p.num_kv_heads} * p.kv_cache_dim;
  const std::uint64_t base = static_cast<std::uint64_t>(slot) / p.block_size * p.block_stride_bytes;
  const std::uint64_t i = static_cast<std::uint64_t>(slot) % p.block_size;
  for (std::uint32_t d = 0; d < p.kv_cache_dim; ++d) {
    const std::uint64_t e = std::uint64_t{kv_head} * p.kv_cache_dim + d;
    const std::uint8_t byte = byte_at(pool, base + i * width / 2 + e / 2);
    const std::uint8_t scale = byte_at(pool, base + p.data_section_bytes + i * width / 16 + e / 16);
    row[d] = double{e2m1_decode(e % 2 == 0 ? byte & 0xF : byte >> 4)} * e4m3_decode(scale);
  }
  return row;
}

}  // namespace

std::vector<double> cache_row(const PagedAttentionProblem& p, std::span<const std::uint8_t> pool, std::int64_t slot,
                              std::uint32_t kv_head, double scale) {
  if (slot < 0) fail(Errc::internal, "reference: negative slot {}", slot);
  if (p.format == KvFormat::nvfp4) return nvfp4_row(p, pool, slot, kv_head);
  return fp8_row(p, pool, static_cast<std::uint64_t>(slot) * p.cache_stride, kv_head, scale);
}

namespace {

// The key set of sequence s for KV head kv_head, in order (compressed entries, then the window's
// tokens), as rows of K and V with the given FP8 scales.
std::pair<MatrixXd, MatrixXd> gather_keys(const PagedAttentionProblem& p, std::uint32_t s, std::uint32_t kv_head,
                                          double k_scale, double v_scale) {
  const std::int64_t cap = std::int64_t{p.max_blocks_per_seq} * p.block_size;
  const std::int64_t len = std::clamp<std::int64_t>(p.seq_lens[s], 0, cap);
  const std::int64_t start = p.sliding_window > 0 && len > p.sliding_window ? len - p.sliding_window : 0;
  const std::uint32_t comp = p.comp_pool.empty() ? 0 : p.comp_block_count;
  const auto n_keys = static_cast<Eigen::Index>(comp + (len - start));
  MatrixXd k(n_keys, p.kv_cache_dim), v(n_keys, p.kv_cache_dim);
  Eigen::Index row = 0;
  auto put = [&](const std::vector<double>& kr, const std::vector<double>& vr) {
    for (std::uint32_t d = 0; d < p.kv_cache_dim; ++d) {
      k(row, d) = kr[d];
      v(row, d) = vr[d];
    }
    ++row;
  };
  for (std::uint32_t c = 0; c < comp; ++c) {  // compressed entries: a K row, then its V row
    const std::uint64_t entry = (std::uint64_t{s} * comp + c) * 2 * p.cache_stride;
    put(fp8_row(p, p.comp_pool, entry, kv_head, k_scale),
        fp8_row(p, p.comp_pool, entry + p.cache_stride, kv_head, v_scale));
  }
  for (std::int64_t t = start; t < len; ++t) {
    const std::int32_t phys = p.block_tables[std::size_t{s} * p.max_blocks_per_seq + t / p.block_size];
    const std::int64_t slot = std::int64_t{phys} * p.block_size + t % p.block_size;
    put(cache_row(p, p.k_pool, slot, kv_head, k_scale), cache_row(p, p.v_pool, slot, kv_head, v_scale));
  }
  return {std::move(k), std::move(v)};
}

VectorXd query(const PagedAttentionProblem& p, std::uint32_t s, std::uint32_t h) {
  return to_vec(p.q.subspan((std::size_t{s} * p.num_q_heads + h) * p.q_head_dim, p.q_head_dim));
}

}  // namespace

std::vector<double> paged_attention(const PagedAttentionProblem& p) {
  check(p);
  std::vector<double> o(std::size_t{p.num_seqs} * p.num_q_heads * p.kv_cache_dim);
  const std::uint32_t group = p.num_q_heads / p.num_kv_heads;
  for (std::uint32_t s = 0; s < p.num_seqs; ++s) {
    MatrixXd k, v;  // the keys of KV head h / group, gathered once for its query heads
    for (std::uint32_t h = 0; h < p.num_q_heads; ++h) {
      if (h % group == 0) std::tie(k, v) = gather_keys(p, s, h / group, p.k_scale, p.v_scale);
      const VectorXd logits = k.leftCols(p.q_head_dim) * query(p, s, h) * p.inv_sqrt_d;
      const bool has_sink = !p.sinks.empty();
      const VectorXd out = attend(logits, v, has_sink, has_sink ? p.sinks[h] : 0.0);
      std::copy(out.begin(), out.end(),
                o.begin() + static_cast<std::ptrdiff_t>((std::size_t{s} * p.num_q_heads + h) * p.kv_cache_dim));
    }
  }
  return o;
}

SplitPartials split_partials(const PagedAttentionProblem& p, double logit_scale, std::uint32_t keys_per_split,
                             std::uint32_t num_splits) {
  check(p);
  SplitPartials r;
  const std::size_t slots = std::size_t{p.num_seqs} * p.num_q_heads * num_splits;
  r.o.assign(slots * p.kv_cache_dim, 0.0);
  r.ml.assign(slots * 2, 0.0);
  const std::uint32_t group = p.num_q_heads / p.num_kv_heads;
  for (std::uint32_t s = 0; s < p.num_seqs; ++s) {
    MatrixXd k, v;  // the raw values the kernel multiplies, of KV head h / group
    for (std::uint32_t h = 0; h < p.num_q_heads; ++h) {
      if (h % group == 0) std::tie(k, v) = gather_keys(p, s, h / group, 1.0, 1.0);
      const VectorXd q = query(p, s, h);
      const VectorXd logits = k.leftCols(p.q_head_dim) * q * logit_scale;
      const VectorXd qk_abs = k.leftCols(p.q_head_dim).cwiseAbs() * q.cwiseAbs();
      if (qk_abs.size() > 0) r.max_abs_qk = std::max(r.max_abs_qk, qk_abs.maxCoeff() * std::fabs(logit_scale));
      if (logits.size() > 0) r.max_abs_logit = std::max(r.max_abs_logit, logits.cwiseAbs().maxCoeff());
      for (std::uint32_t z = 0; z < num_splits; ++z) {
        const std::size_t slot = (std::size_t{s} * p.num_q_heads + h) * num_splits + z;
        const Eigen::Index begin = std::min<Eigen::Index>(Eigen::Index{z} * keys_per_split, logits.size());
        const Eigen::Index n = std::min<Eigen::Index>(keys_per_split, logits.size() - begin);
        if (n == 0) {
          r.ml[2 * slot] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const VectorXd part = logits.segment(begin, n);
        const double m = part.maxCoeff();
        const VectorXd e = (part.array() - m).exp().matrix();
        const VectorXd out = v.middleRows(begin, n).transpose() * e;
        const VectorXd weighted_abs = v.middleRows(begin, n).cwiseAbs().transpose() * e;
        r.max_weighted_abs_v = std::max(r.max_weighted_abs_v, weighted_abs.maxCoeff());
        std::copy(out.begin(), out.end(), r.o.begin() + static_cast<std::ptrdiff_t>(slot * p.kv_cache_dim));
        r.ml[2 * slot] = m;
        r.ml[2 * slot + 1] = e.sum();
      }
    }
  }
  return r;
}

CombineResult combine_partials(std::span<const float> o_partial, std::span<const float> ml_partial,
                               std::span<const float> sinks, std::uint32_t num_seqs, std::uint32_t num_q_heads,
                               std::uint32_t num_splits, std::uint32_t kv_cache_dim, double v_scale) {
  const std::uint64_t chunks = saturating_product({num_seqs, num_q_heads, num_splits});
  require_size("o_partial", o_partial.size(), saturating_product({chunks, kv_cache_dim}));
  require_size("ml_partial", ml_partial.size(), saturating_product({chunks, 2}));
  if (!sinks.empty()) require_size("sinks", sinks.size(), num_q_heads);
  CombineResult r;
  r.o.assign(std::size_t{num_seqs} * num_q_heads * kv_cache_dim, 0.0);
  for (std::uint32_t s = 0; s < num_seqs; ++s)
    for (std::uint32_t h = 0; h < num_q_heads; ++h) {
      const std::size_t base = (std::size_t{s} * num_q_heads + h) * num_splits;
      bool keys = false;
      for (std::uint32_t z = 0; z < num_splits; ++z) keys = keys || ml_partial[2 * (base + z) + 1] != 0;
      const bool has_sink = !sinks.empty() && keys;  // no keys: zeros, whatever the sink (SPEC §3)
      double big = has_sink ? double{sinks[h]} : -std::numeric_limits<double>::infinity();
      for (std::uint32_t z = 0; z < num_splits; ++z)
        if (ml_partial[2 * (base + z) + 1] != 0) big = std::max(big, double{ml_partial[2 * (base + z)]});
      double denom = has_sink ? exp_below(sinks[h], big) : 0.0;
      for (std::uint32_t z = 0; z < num_splits; ++z)
        if (const double l = ml_partial[2 * (base + z) + 1]; l != 0)
          denom += std::exp(ml_partial[2 * (base + z)] - big) * l;
      if (denom == 0) continue;
      for (std::uint32_t d = 0; d < kv_cache_dim; ++d) {
        double num = 0, mag = 0;
        for (std::uint32_t z = 0; z < num_splits; ++z) {
          if (ml_partial[2 * (base + z) + 1] == 0) continue;
          const double w = std::exp(ml_partial[2 * (base + z)] - big), x = o_partial[(base + z) * kv_cache_dim + d];
          num += w * x;
          mag += std::fabs(w * x);
        }
        r.o[(std::size_t{s} * num_q_heads + h) * kv_cache_dim + d] = v_scale * num / denom;
        r.max_abs_terms = std::max(r.max_abs_terms, v_scale * mag / denom);
      }
    }
  return r;
}

DeepseekStepResult deepseek_step(const DeepseekStepProblem& p) {
  kArgs.check(p.tokens > 0, "no tokens (the last one is the query)");
  require_size("q_nope", p.q_nope.size(), std::uint64_t{p.heads} * p.nope);
  require_size("q_rope", p.q_rope.size(), std::uint64_t{p.heads} * p.rope);
  require_size("kv_latent", p.kv_latent.size(), std::uint64_t{p.tokens} * p.kv_lora);
  require_size("k_rope", p.k_rope.size(), std::uint64_t{p.tokens} * p.rope);
  require_size("w_uk", p.w_uk.size(), saturating_product({p.heads, p.nope, p.kv_lora}));
  require_size("w_uv", p.w_uv.size(), saturating_product({p.heads, p.v_head, p.kv_lora}));
  const std::uint32_t dim = p.kv_lora + p.rope, last = p.tokens - 1;
  // Keys: [c_t ‖ rope(k_rope_t, t)], values: c_t.
  MatrixXd k(p.tokens, dim), v(p.tokens, p.kv_lora);
  for (std::uint32_t t = 0; t < p.tokens; ++t) {
    std::vector<double> kr(p.k_rope.begin() + std::size_t{t} * p.rope, p.k_rope.begin() + std::size_t{t + 1} * p.rope);
    if (p.rotate) rope_pairs(kr, p.rope, t, p.rope_theta);
    for (std::uint32_t j = 0; j < p.kv_lora; ++j) k(t, j) = v(t, j) = p.kv_latent[std::size_t{t} * p.kv_lora + j];
    for (std::uint32_t j = 0; j < p.rope; ++j) k(t, p.kv_lora + j) = kr[j];
  }
  DeepseekStepResult r;
  r.q_absorbed.resize(std::size_t{p.heads} * dim);
  r.o_latent.resize(std::size_t{p.heads} * p.kv_lora);
  r.attn_out.resize(std::size_t{p.heads} * p.v_head);
  for (std::uint32_t h = 0; h < p.heads; ++h) {
    MatrixXd w_uk(p.nope, p.kv_lora), w_uv(p.v_head, p.kv_lora);
    for (std::uint32_t i = 0; i < p.nope; ++i)
      for (std::uint32_t j = 0; j < p.kv_lora; ++j) w_uk(i, j) = p.w_uk[(std::size_t{h} * p.nope + i) * p.kv_lora + j];
    for (std::uint32_t i = 0; i < p.v_head; ++i)
      for (std::uint32_t j = 0; j < p.kv_lora; ++j)
        w_uv(i, j) = p.w_uv[(std::size_t{h} * p.v_head + i) * p.kv_lora + j];
    VectorXd q(dim);
    q.head(p.kv_lora) = w_uk.transpose() * to_vec(p.q_nope.subspan(std::size_t{h} * p.nope, p.nope));
    std::vector<double> qr(p.q_rope.begin() + std::size_t{h} * p.rope, p.q_rope.begin() + std::size_t{h + 1} * p.rope);
    if (p.rotate) rope_pairs(qr, p.rope, last, p.rope_theta);
    for (std::uint32_t j = 0; j < p.rope; ++j) q[p.kv_lora + j] = qr[j];
    const VectorXd o = attend(k * q * p.softmax_scale, v, false, 0.0);
    const VectorXd out = w_uv * o;
    std::copy(q.begin(), q.end(), r.q_absorbed.begin() + static_cast<std::ptrdiff_t>(std::size_t{h} * dim));
    std::copy(o.begin(), o.end(), r.o_latent.begin() + static_cast<std::ptrdiff_t>(std::size_t{h} * p.kv_lora));
    std::copy(out.begin(), out.end(), r.attn_out.begin() + static_cast<std::ptrdiff_t>(std::size_t{h} * p.v_head));
  }
  return r;
}

std::vector<double> k3_rope(const std::vector<float>& x, std::uint32_t heads, std::uint32_t nope, std::uint32_t rope,
                            std::uint32_t pos, double theta, bool use_nope) {
  require_size("x", x.size(), saturating_product({heads, std::uint64_t{nope} + rope}));
  std::vector<double> y(x.begin(), x.end());
  if (use_nope) return y;
  const std::size_t dq = std::size_t{nope} + rope;
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::uint32_t i = 0; 2 * i + 1 < rope; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / rope);
      const std::size_t at = h * dq + nope + 2 * i;
      y[at] = x[at] * std::cos(angle) - x[at + 1] * std::sin(angle);
      y[at + 1] = x[at + 1] * std::cos(angle) + x[at] * std::sin(angle);
    }
  }
  return y;
}

namespace {

void check(const K3SdpaProblem& p) {
  kArgs.check(p.dq > 0, "dq is 0");
  require_size("q", p.q.size(), std::uint64_t{p.heads} * p.dq);
  require_size("k", p.k.size(), saturating_product({p.seq_len, p.heads, p.dq}));
  require_size("v", p.v.size(), saturating_product({p.seq_len, p.heads, p.dv}));
  if (p.use_gate) require_size("g", p.g.size(), std::uint64_t{p.heads} * p.dv);
}

}  // namespace

std::vector<double> k3_sdpa_gate(const K3SdpaProblem& p) {
  check(p);
  std::vector<double> out(std::size_t{p.heads} * p.dv, 0.0);
  if (p.seq_len == 0) return out;
  for (std::size_t h = 0; h < p.heads; ++h) {
    MatrixXd k(p.seq_len, p.dq), v(p.seq_len, p.dv);
    for (std::size_t j = 0; j < p.seq_len; ++j) {
      for (std::size_t d = 0; d < p.dq; ++d)
        k(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(d)) = p.k[(j * p.heads + h) * p.dq + d];
      for (std::size_t d = 0; d < p.dv; ++d)
        v(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(d)) = p.v[(j * p.heads + h) * p.dv + d];
    }
    const VectorXd q = to_vec(std::span(p.q).subspan(h * p.dq, p.dq));
    const VectorXd o = attend(k * q / std::sqrt(static_cast<double>(p.dq)), v, false, 0.0);
    for (std::size_t d = 0; d < p.dv; ++d) {
      double x = o[static_cast<Eigen::Index>(d)];
      if (p.use_gate) x /= 1.0 + std::exp(-double{p.g[h * p.dv + d]});
      out[h * p.dv + d] = x;
    }
  }
  return out;
}

K3SplitPartials k3_split_partials(const K3SdpaProblem& p, std::uint32_t keys_per_chunk, std::uint32_t num_chunks) {
  check(p);
  K3SplitPartials r;
  r.o.assign(std::size_t{num_chunks} * p.heads * p.dv, 0.0);
  r.ml.assign(std::size_t{num_chunks} * p.heads * 2, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.dq));
  for (std::size_t c = 0; c < num_chunks; ++c) {
    const std::size_t begin = std::min<std::size_t>(c * keys_per_chunk, p.seq_len);
    const std::size_t end = std::min<std::size_t>(begin + keys_per_chunk, p.seq_len);
    for (std::size_t h = 0; h < p.heads; ++h) {
      const std::size_t row = c * p.heads + h;
      std::vector<double> s;
      for (std::size_t j = begin; j < end; ++j) {
        double dot = 0, mag = 0;
        for (std::size_t d = 0; d < p.dq; ++d) {
          const double t = double{p.q[h * p.dq + d]} * p.k[(j * p.heads + h) * p.dq + d];
          dot += t;
          mag += std::fabs(t);
        }
        s.push_back(dot * scale);
        r.max_abs_qk = std::max(r.max_abs_qk, mag * scale);
      }
      const double m = s.empty() ? -std::numeric_limits<double>::infinity() : *std::max_element(s.begin(), s.end());
      double l = 0;
      for (std::size_t j = begin; j < end; ++j) {
        const double w = std::exp(s[j - begin] - m);
        l += w;
        for (std::size_t d = 0; d < p.dv; ++d) {
          const double v = p.v[(j * p.heads + h) * p.dv + d];
          r.o[row * p.dv + d] += w * v;
          r.max_abs_v = std::max(r.max_abs_v, std::fabs(v));
        }
      }
      r.ml[2 * row] = m;
      r.ml[2 * row + 1] = l;
    }
  }
  return r;
}

}  // namespace metrale::ref
