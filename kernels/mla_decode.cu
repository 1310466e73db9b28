// Module mla_decode: the Kimi K3 MLA decode kernels (SPEC §4), FP32 throughout. Each kernel
// reads like its port in emu/mla_decode.cpp: same parameters, same order, same phases.
#include <cstdint>

#include "device_common.cuh"

using metrale::kWarp;
using metrale::warp_sum;

// ---------------------------------------------------------------------------
// k3_mla_maybe_rope_f32: unless use_nope, rotate dims [nope, nope+rope) of each head's q and k_new
// row in place: pairs (2i, 2i+1) for i < rope/2 (the launcher refuses an odd rope), a' = a cos −
// b sin, b' = b cos + a sin, angle = pos · theta^(−2i/rope), FP32.
// Grid: [⌈heads/128⌉]. Block: 128, one thread per head.
//   q     [heads, nope + rope] f32, in place
//   k_new [heads, nope + rope] f32, in place
extern "C" __global__ void k3_mla_maybe_rope_f32(float* q, float* k_new, uint32_t heads, uint32_t nope, uint32_t rope,
                                                 uint32_t pos, float theta, uint32_t use_nope) {
  if (use_nope != 0) return;
  const uint64_t dq = uint64_t{nope} + rope;
  const uint32_t h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  const uint64_t base = h * dq + nope;
  for (uint32_t i = 0; i < rope / 2; ++i) {
    const float inv_freq = powf(theta, -static_cast<float>(2 * i) / static_cast<float>(rope));
    const float angle = static_cast<float>(pos) * inv_freq;
    const float c = cosf(angle), s = sinf(angle);
    const uint64_t at = base + 2 * i;
    const float qa = q[at], qb = q[at + 1];
    q[at] = qa * c - qb * s;
    q[at + 1] = qb * c + qa * s;
    const float ka = k_new[at], kb = k_new[at + 1];
    k_new[at] = ka * c - kb * s;
    k_new[at + 1] = kb * c + ka * s;
  }
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
extern "C" __global__ void k3_mla_sdpa_gate_f32(const float* q, const float* k, const float* v, const float* g,
                                                float* out, uint32_t seq_len, uint32_t heads, uint32_t dq,
                                                uint32_t dv, uint32_t use_gate) {
  const uint32_t h = blockIdx.x, lane = threadIdx.x;
  const uint64_t q_row = uint64_t{h} * dq, o_row = uint64_t{h} * dv;
  const float scale = 1.0f / sqrtf(static_cast<float>(dq));

  for (uint32_t d = lane; d < dv; d += kWarp) out[o_row + d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (uint32_t j = 0; j < seq_len; ++j) {
    const uint64_t k_row = (uint64_t{j} * heads + h) * dq, v_row = (uint64_t{j} * heads + h) * dv;
    float dot = 0.0f;
    for (uint32_t d = lane; d < dq; d += kWarp) dot += q[q_row + d] * k[k_row + d];
    const float logit = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, logit);
    const float alpha = j == 0 ? 0.0f : expf(m - m_new);  // nothing to rescale before the first key
    const float p = expf(logit - m_new);
    l = l * alpha + p;
    m = m_new;
    for (uint32_t d = lane; d < dv; d += kWarp) out[o_row + d] = out[o_row + d] * alpha + p * v[v_row + d];
  }
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // no keys: zeros, never NaN
  for (uint32_t d = lane; d < dv; d += kWarp) {
    float o = out[o_row + d] * inv_l;
    if (use_gate != 0) o *= 1.0f / (1.0f + expf(-g[o_row + d]));
    out[o_row + d] = o;
  }
}
