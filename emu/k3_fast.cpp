// Ports of module k3_fast (kernels/k3_fast.cu), the split-KV K3 SDPA. They follow the kernels'
// phases and FP32 addition order (a lane's dims d ≡ lane mod 32, the butterflies, the chunks in
// order); a warp's lanes are the port's arrays of 32.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "metrale/emu/emulator.hpp"
#include "port_common.hpp"

namespace metrale::emu {
namespace {

constexpr std::uint32_t kChunkWarps = 4, kStepKeys = 4, kCombineThreads = 256;

// ---------------------------------------------------------------------------
// k3_mla_sdpa_split_f32: one chunk of keys per warp. Warp w of block x takes chunk
// c = 4x + w, keys [c·keys_per_chunk, (c+1)·keys_per_chunk) ∩ [0, seq_len), in steps of four keys:
// it loads their K and V rows (lane: dims lane + 32i), finds the four logits
// q·k / √dq by butterfly, and makes one online-softmax update: m' = max(m, logits),
// α = e^(m − m') (0 at the chunk's first step), p_u = e^(logit_u − m'), l = l·α + p_0 + … + p_3,
// acc = acc·α + p_0·v_0 + … + p_3·v_3. It writes acc to o_partial[c, h] and (m, l) to
// ml_partial[c, h]; a chunk without keys writes zeros, −inf and 0.
// Grid: [num_chunks/4, heads]. Block: 128.
//   q [heads, dq]; k [seq_len, heads, dq]; v [seq_len, heads, dv]   f32, dq and dv ≤ 256
//   o_partial [num_chunks, heads, dv] f32; ml_partial [num_chunks, heads, 2] f32
void k3_mla_sdpa_split_f32(Block& blk, Global<const float> q, Global<const float> k, Global<const float> v,
                           Global<float> o_partial, Global<float> ml_partial, std::uint32_t seq_len,
                           std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t keys_per_chunk) {
  const std::uint32_t h = blk.blockIdx.y;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dq));
  const auto qr = q.read(std::uint64_t{h} * dq, dq);
  for (std::uint32_t warp = 0; warp < kChunkWarps; ++warp) {
    const std::uint32_t c = blk.blockIdx.x * kChunkWarps + warp;
    const auto begin = static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{c} * keys_per_chunk, seq_len));
    const auto end =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{begin} + keys_per_chunk, seq_len));
    std::vector<float> acc(dv, 0.0f);  // dim d in lane d mod 32
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    for (std::uint32_t j0 = begin; j0 < end; j0 += kStepKeys) {
      std::array<std::span<const float>, kStepKeys> vr{};  // empty past the end: zeros
      std::array<float, kStepKeys> logit{}, p{};
      float m_new = m;
      for (std::uint32_t u = 0; u < kStepKeys && j0 + u < end; ++u) {
        const std::uint64_t row = std::uint64_t{j0 + u} * heads + h;
        const auto kr = k.read(row * dq, dq);
        vr[u] = v.read(row * dv, dv);
        std::array<float, kWarp> dot{};
        for (std::uint32_t d = 0; d < dq; ++d) dot[d % kWarp] += qr[d] * kr[d];
        logit[u] = warp_sum(dot) * scale;
        m_new = std::fmax(m_new, logit[u]);
      }
      const float alpha = j0 == begin ? 0.0f : std::exp(m - m_new);  // nothing to rescale before the first step
      for (std::uint32_t u = 0; u < kStepKeys && j0 + u < end; ++u) p[u] = std::exp(logit[u] - m_new);
      l = l * alpha + p[0] + p[1] + p[2] + p[3];
      auto val = [&](std::uint32_t u, std::uint32_t d) { return vr[u].empty() ? 0.0f : vr[u][d]; };
      for (std::uint32_t d = 0; d < dv; ++d)
        acc[d] = acc[d] * alpha + p[0] * val(0, d) + p[1] * val(1, d) + p[2] * val(2, d) + p[3] * val(3, d);
      m = m_new;
    }
    const std::uint64_t row = std::uint64_t{c} * heads + h;
    std::copy(acc.begin(), acc.end(), o_partial.write(row * dv, dv).begin());
    ml_partial[2 * row] = m;
    ml_partial[2 * row + 1] = l;
  }
}

// ---------------------------------------------------------------------------
// k3_mla_sdpa_combine_f32: out[h] = (Σ_c w_c·O_c) / (Σ_c w_c·l_c), w_c = e^(m_c − M), M = max m_c,
// over the chunks c with keys (l_c ≠ 0: a NaN l_c, from NaN or inf in q, k or v, counts and makes
// the head's output NaN, as the seed kernel's); times sigmoid(g[h]) elementwise when use_gate; no
// keys writes zeros. Block (h, y) serves dims [32y, 32y + 32): thread t takes the chunks
// ≡ t (mod 256) for M and the denominator (block reductions) and writes their weights to shared
// memory (none for a chunk without keys); then lane l of warp w sums dim 32y + l over the
// chunks ≡ w (mod 8) with keys, in order (a warp reads a chunk's 32 dims at once; a weight that
// underflows to 0 still counts, so NaN or inf in that chunk's V reaches the output as on the seed
// kernel), and the eight warps' sums are added in order.
// Grid: [heads, ⌈dv/32⌉]. Block: 256.
//   o_partial [num_chunks, heads, dv] f32; ml_partial [num_chunks, heads, 2] f32
//   g [heads, dv] f32 (read only when use_gate); out [heads, dv] f32; num_chunks ≤ 4096
void k3_mla_sdpa_combine_f32(Block& blk, Global<const float> o_partial, Global<const float> ml_partial,
                             Global<const float> g, Global<float> out, std::uint32_t heads, std::uint32_t dv,
                             std::uint32_t num_chunks, std::uint32_t use_gate) {
  constexpr std::uint32_t kWarps = kCombineThreads / kWarp;
  const std::uint32_t h = blk.blockIdx.x;
  std::vector<float> m(num_chunks), l(num_chunks);
  std::vector<std::optional<float>> weight(num_chunks);  // shared; none: a chunk without keys
  float big = -std::numeric_limits<float>::infinity();
  for (std::uint32_t c = 0; c < num_chunks; ++c) {
    const auto ml = ml_partial.read(2 * (std::uint64_t{c} * heads + h), 2);
    m[c] = ml[0];
    l[c] = ml[1];
    if (l[c] != 0.0f) big = std::fmax(big, m[c]);  // a max: the order of the reduction does not matter
  }
  // The denominator as the kernel adds it: thread t its chunks in order, the warps' butterflies,
  // then the eight warps' sums in order.
  std::array<std::array<float, kWarp>, kWarps> part{};
  for (std::uint32_t c = 0; c < num_chunks; ++c) {
    if (l[c] == 0.0f) continue;
    weight[c] = std::exp(m[c] - big);
    const std::uint32_t t = c % kCombineThreads;
    part[t / kWarp][t % kWarp] += *weight[c] * l[c];
  }
  float denom = warp_sum(part[0]);
  for (std::uint32_t w = 1; w < kWarps; ++w) denom += warp_sum(part[w]);
  const std::uint32_t d_end = std::min(dv, (blk.blockIdx.y + 1) * kWarp);
  for (std::uint32_t d = blk.blockIdx.y * kWarp; d < d_end; ++d) {
    std::array<float, kWarps> sum{};  // warp w: the chunks ≡ w (mod 8)
    for (std::uint32_t c = 0; c < num_chunks; ++c)
      if (weight[c]) sum[c % kWarps] += *weight[c] * o_partial[(std::uint64_t{c} * heads + h) * dv + d];
    float o = sum[0];
    for (std::uint32_t w = 1; w < kWarps; ++w) o += sum[w];
    o *= denom == 0.0f ? 0.0f : 1.0f / denom;
    if (use_gate != 0) o *= 1.0f / (1.0f + std::exp(-g[std::uint64_t{h} * dv + d]));
    out[std::uint64_t{h} * dv + d] = o;
  }
}

}  // namespace

void register_k3_fast(Registry& r) {
  const char* m = "k3_fast";
  r.add<&k3_mla_sdpa_split_f32>(
      m, "k3_mla_sdpa_split_f32",
      {"q", "k", "v", "o_partial", "ml_partial", "seq_len", "heads", "dq", "dv", "keys_per_chunk"},
      block_is({128, 1, 1}));
  r.add<&k3_mla_sdpa_combine_f32>(m, "k3_mla_sdpa_combine_f32",
                                  {"o_partial", "ml_partial", "g", "out", "heads", "dv", "num_chunks", "use_gate"},
                                  block_is({256, 1, 1}));
  // FP32 throughout, but the kernels' fused multiply-adds and expf round differently from the
  // ports' separate roundings and std::exp: a few units of 2^-24 per term, summed over a chunk's
  // keys or a head's chunks, taken for a recorded case as a floor of the largest value.
  r.set_recorded_floor(m, "k3_mla_sdpa_split_f32", "o_partial", 0x1p-16);
  r.set_recorded_floor(m, "k3_mla_sdpa_split_f32", "ml_partial", 0x1p-20);
  r.set_recorded_floor(m, "k3_mla_sdpa_combine_f32", "out", 0x1p-20);
}

}  // namespace metrale::emu
