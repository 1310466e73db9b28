// Ports of module `mla_decode` (SPEC §4, Kimi K3). Each reads like its kernel in
// kernels/mla_decode.cu: same parameters, same order, same phases; a phase
// between two warp-level exchanges is one `blk.threads(...)` loop.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "metrale/emu/emulator.hpp"
#include "port_common.hpp"

namespace metrale::emu {
namespace {

// ---------------------------------------------------------------------------
// k3_mla_maybe_rope_f32: unless use_nope, rotate dims [nope, nope+rope) of each head's q and k_new
// row in place: pairs (2i, 2i+1) for i < rope/2 (the launcher refuses an odd rope), a' = a cos −
// b sin, b' = b cos + a sin, angle = pos · theta^(−2i/rope), FP32.
// Grid: [⌈heads/128⌉]. Block: 128, one thread per head.
//   q     [heads, nope + rope] f32, in place
//   k_new [heads, nope + rope] f32, in place
void k3_mla_maybe_rope_f32(Block& blk, Global<float> q, Global<float> k_new, std::uint32_t heads, std::uint32_t nope,
                           std::uint32_t rope, std::uint32_t pos, float theta, std::uint32_t use_nope) {
  if (use_nope != 0) return;
  const std::uint64_t dq = std::uint64_t{nope} + rope;
  blk.threads([&](std::uint32_t tid) {
    const std::uint32_t h = blk.blockIdx.x * blk.blockDim.x + tid;
    if (h >= heads) return;
    const std::uint64_t base = h * dq + nope;
    for (std::uint32_t i = 0; i < rope / 2; ++i) {
      const float inv_freq = std::pow(theta, -static_cast<float>(2 * i) / static_cast<float>(rope));
      const float angle = static_cast<float>(pos) * inv_freq;
      const float c = std::cos(angle), s = std::sin(angle);
      const std::uint64_t at = base + 2 * i;
      const float qa = q.load(at), qb = q.load(at + 1);
      q[at] = qa * c - qb * s;
      q[at + 1] = qb * c + qa * s;
      const float ka = k_new.load(at), kb = k_new.load(at + 1);
      k_new[at] = ka * c - kb * s;
      k_new[at + 1] = kb * c + ka * s;
    }
  });
}

// ---------------------------------------------------------------------------
// k3_mla_sdpa_gate_f32: out[h] = Σ_j softmax_j(q[h]·k[j,h] / √dq) · v[j,h], times sigmoid(g[h])
// elementwise when use_gate; seq_len 0 writes zeros.
// Grid: [heads]. Block: 32, one warp per head. Online softmax over the keys in one pass: per key,
// lanes stride over dq for the dot product (butterfly sum, so every lane holds the logit), then
// each lane rescales and accumulates its own output dims d ≡ lane (mod 32). The accumulators live
// in the block's own row of `out` rather than in registers, so any dv works without a register
// limit; the row stays in L1.
//   q   [heads, dq]          f32
//   k   [seq_len, heads, dq] f32
//   v   [seq_len, heads, dv] f32
//   g   [heads, dv]          f32 gate logits (read only when use_gate)
//   out [heads, dv]          f32
void k3_mla_sdpa_gate_f32(Block& blk, Global<const float> q, Global<const float> k, Global<const float> v,
                          Global<const float> g, Global<float> out, std::uint32_t seq_len, std::uint32_t heads,
                          std::uint32_t dq, std::uint32_t dv, std::uint32_t use_gate) {
  const std::uint32_t h = blk.blockIdx.x;
  const std::uint64_t q_row = std::uint64_t{h} * dq, o_row = std::uint64_t{h} * dv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dq));

  blk.threads([&](std::uint32_t lane) {
    for (std::uint32_t d = lane; d < dv; d += kWarp) out[o_row + d] = 0.0f;
  });
  float m = -std::numeric_limits<float>::infinity(), l = 0.0f;  // per lane, uniform across the warp
  std::array<float, kWarp> partial{};                           // one register per lane
  for (std::uint32_t j = 0; j < seq_len; ++j) {
    const std::uint64_t k_row = (std::uint64_t{j} * heads + h) * dq, v_row = (std::uint64_t{j} * heads + h) * dv;
    blk.threads([&](std::uint32_t lane) {
      float dot = 0.0f;
      for (std::uint32_t d = lane; d < dq; d += kWarp) dot += q[q_row + d] * k[k_row + d];
      partial[lane] = dot;
    });
    const float logit = warp_sum(partial) * scale;
    const float m_new = std::max(m, logit);
    const float alpha = j == 0 ? 0.0f : std::exp(m - m_new);  // nothing to rescale before the first key
    const float p = std::exp(logit - m_new);
    l = l * alpha + p;
    m = m_new;
    blk.threads([&](std::uint32_t lane) {
      for (std::uint32_t d = lane; d < dv; d += kWarp) out[o_row + d] = out[o_row + d] * alpha + p * v[v_row + d];
    });
  }
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // no keys: zeros, never NaN
  blk.threads([&](std::uint32_t lane) {
    for (std::uint32_t d = lane; d < dv; d += kWarp) {
      float o = out[o_row + d] * inv_l;
      if (use_gate != 0) o *= 1.0f / (1.0f + std::exp(-g[o_row + d]));
      out[o_row + d] = o;
    }
  });
}

}  // namespace

void register_mla_decode(Registry& r) {
  const char* m = "mla_decode";
  r.add<&k3_mla_maybe_rope_f32>(m, "k3_mla_maybe_rope_f32",
                                {"q", "k_new", "heads", "nope", "rope", "pos", "theta", "use_nope"},
                                block_is({128, 1, 1}));
  r.add<&k3_mla_sdpa_gate_f32>(m, "k3_mla_sdpa_gate_f32",
                               {"q", "k", "v", "g", "out", "seq_len", "heads", "dq", "dv", "use_gate"},
                               block_is({32, 1, 1}));
}

}  // namespace metrale::emu
