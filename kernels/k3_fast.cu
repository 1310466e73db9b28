// Module k3_fast: the split-KV fast path of the Kimi K3 SDPA (issue 6), with the semantics of
// k3_mla_sdpa_gate_f32 (SPEC §4). Each kernel reads like its port in emu/k3_fast.cpp.
//
// The seed kernel gives each head one warp that walks the whole history, one key at a time: a
// few hundred bytes in flight per head, far from the memory roofline. Here a head's keys are cut
// into chunks, one warp per chunk, so every SM has many warps streaming; a warp loads the K and
// V rows of four keys before it uses any of them. k3_mla_sdpa_combine_f32 merges the chunks'
// partial results with log-sum-exp, normalises, and applies the gate.
#include <cstdint>

#include "device_common.cuh"

using metrale::kWarp;
using metrale::wait_for_previous_kernel;
using metrale::warp_max;
using metrale::warp_sum;

namespace {

constexpr uint32_t kChunkWarps = 4;        // chunks (warps) per split block
constexpr uint32_t kStepKeys = 4;          // keys a warp loads at once
constexpr uint32_t kLaneDims = 8;          // dims per lane: dq and dv up to 256
constexpr uint32_t kCombineThreads = 256;  // combine block
constexpr uint32_t kMaxChunks = 4096;      // chunks per head the combine's weights hold
constexpr float kCombineSkip = -1.0f;      // the weight of a chunk without keys (e^x is never negative)

// The block's sum or max of one value per thread: each warp's butterfly, then the warps' results
// in order. Every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float x, float* red) {
  x = kMax ? warp_max(x) : warp_sum(x);
  const uint32_t warps = blockDim.x / kWarp;
  __syncthreads();  // red may still be read by an earlier reduction
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = x;
  __syncthreads();
  float r = red[0];
  for (uint32_t w = 1; w < warps; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------
// k3_mla_sdpa_split_f32: one chunk of keys per warp. Warp w of block x takes chunk
// c = 4x + w, keys [c·keys_per_chunk, (c+1)·keys_per_chunk) ∩ [0, seq_len), in steps of four keys:
// it loads their K and V rows (lane: dims lane + 32i), finds the four logits
// q·k / √dq by butterfly, and makes one online-softmax update: m' = max(m, logits),
// α = e^(m − m') (0 at the chunk's first step), p_u = e^(logit_u − m'), l = l·α + p_0 + … + p_3,
// acc = acc·α + p_0·v_0 + … + p_3·v_3. It writes acc to o_partial[c, h] and (m, l) to
// ml_partial[c, h]; a chunk without keys writes zeros, −inf and 0.
// Grid: [num_chunks/4, heads]. Block: 128. Launched early: waits for the kernel ahead first.
//   q [heads, dq]; k [seq_len, heads, dq]; v [seq_len, heads, dv]   f32, dq and dv ≤ 256
//   o_partial [num_chunks, heads, dv] f32; ml_partial [num_chunks, heads, 2] f32
extern "C" __global__ void __launch_bounds__(128)
    k3_mla_sdpa_split_f32(const float* q, const float* k, const float* v, float* o_partial, float* ml_partial,
                          uint32_t seq_len, uint32_t heads, uint32_t dq, uint32_t dv, uint32_t keys_per_chunk) {
  wait_for_previous_kernel();
  const uint32_t lane = threadIdx.x % kWarp, h = blockIdx.y;
  const uint32_t c = blockIdx.x * kChunkWarps + threadIdx.x / kWarp;
  const uint32_t begin = static_cast<uint32_t>(min(uint64_t{c} * keys_per_chunk, uint64_t{seq_len}));
  const uint32_t end = static_cast<uint32_t>(min(uint64_t{begin} + keys_per_chunk, uint64_t{seq_len}));
  const float scale = 1.0f / sqrtf(static_cast<float>(dq));

  float qr[kLaneDims], acc[kLaneDims];
#pragma unroll
  for (uint32_t i = 0; i < kLaneDims; ++i) {
    const uint32_t d = lane + kWarp * i;
    qr[i] = d < dq ? q[uint64_t{h} * dq + d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (uint32_t j0 = begin; j0 < end; j0 += kStepKeys) {
    float kr[kStepKeys][kLaneDims], vr[kStepKeys][kLaneDims];
#pragma unroll
    for (uint32_t u = 0; u < kStepKeys; ++u) {
      const bool live = j0 + u < end;
      const float* k_row = k + (uint64_t{j0 + u} * heads + h) * dq;
      const float* v_row = v + (uint64_t{j0 + u} * heads + h) * dv;
#pragma unroll
      for (uint32_t i = 0; i < kLaneDims; ++i) {
        const uint32_t d = lane + kWarp * i;
        kr[u][i] = live && d < dq ? k_row[d] : 0.0f;
        vr[u][i] = live && d < dv ? v_row[d] : 0.0f;
      }
    }
    float logit[kStepKeys], m_new = m;
#pragma unroll
    for (uint32_t u = 0; u < kStepKeys; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (uint32_t i = 0; i < kLaneDims; ++i) dot += qr[i] * kr[u][i];
      logit[u] = warp_sum(dot) * scale;
      if (j0 + u < end) m_new = fmaxf(m_new, logit[u]);
    }
    const float alpha = j0 == begin ? 0.0f : expf(m - m_new);  // nothing to rescale before the first step
    float p[kStepKeys];
#pragma unroll
    for (uint32_t u = 0; u < kStepKeys; ++u) p[u] = j0 + u < end ? expf(logit[u] - m_new) : 0.0f;
    l = l * alpha + p[0] + p[1] + p[2] + p[3];
#pragma unroll
    for (uint32_t i = 0; i < kLaneDims; ++i)
      acc[i] = acc[i] * alpha + p[0] * vr[0][i] + p[1] * vr[1][i] + p[2] * vr[2][i] + p[3] * vr[3][i];
    m = m_new;
  }
  const uint64_t row = uint64_t{c} * heads + h;
#pragma unroll
  for (uint32_t i = 0; i < kLaneDims; ++i) {
    const uint32_t d = lane + kWarp * i;
    if (d < dv) o_partial[row * dv + d] = acc[i];
  }
  if (lane == 0) {
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
// memory (kCombineSkip for a chunk without keys); then lane l of warp w sums dim 32y + l over the
// chunks ≡ w (mod 8) with keys, in order (a warp reads a chunk's 32 dims at once; a weight that
// underflows to 0 still counts, so NaN or inf in that chunk's V reaches the output as on the seed
// kernel), and the eight warps' sums are added in order.
// Grid: [heads, ⌈dv/32⌉]. Block: 256. Launched early: waits for the split kernel first.
//   o_partial [num_chunks, heads, dv] f32; ml_partial [num_chunks, heads, 2] f32
//   g [heads, dv] f32 (read only when use_gate); out [heads, dv] f32; num_chunks ≤ 4096
extern "C" __global__ void __launch_bounds__(kCombineThreads)
    k3_mla_sdpa_combine_f32(const float* o_partial, const float* ml_partial, const float* g, float* out, uint32_t heads,
                            uint32_t dv, uint32_t num_chunks, uint32_t use_gate) {
  constexpr uint32_t kWarps = kCombineThreads / kWarp;
  __shared__ float weight[kMaxChunks];
  __shared__ float red[kWarps];
  __shared__ float part[kWarps][kWarp];
  wait_for_previous_kernel();
  const uint32_t h = blockIdx.x, t = threadIdx.x;
  float big = -INFINITY;
  for (uint32_t c = t; c < num_chunks; c += kCombineThreads) {
    const uint64_t row = uint64_t{c} * heads + h;
    if (ml_partial[2 * row + 1] != 0.0f) big = fmaxf(big, ml_partial[2 * row]);
  }
  big = block_reduce<true>(big, red);
  float denom_part = 0.0f;
  for (uint32_t c = t; c < num_chunks; c += kCombineThreads) {
    const uint64_t row = uint64_t{c} * heads + h;
    const float l = ml_partial[2 * row + 1];
    const float w = l != 0.0f ? expf(ml_partial[2 * row] - big) : kCombineSkip;
    weight[c] = w;
    if (l != 0.0f) denom_part += w * l;
  }
  const float denom = block_reduce<false>(denom_part, red);  // its barriers also publish the weights
  const uint32_t lane = t % kWarp, warp = t / kWarp, d = blockIdx.y * kWarp + lane;
  float o = 0.0f;
  if (d < dv) {
#pragma unroll 4
    for (uint32_t c = warp; c < num_chunks; c += kWarps) {
      const float w = weight[c];
      if (w != kCombineSkip) o += w * o_partial[(uint64_t{c} * heads + h) * dv + d];
    }
  }
  part[warp][lane] = o;
  __syncthreads();
  if (warp != 0 || d >= dv) return;
  for (uint32_t w = 1; w < kWarps; ++w) o += part[w][lane];
  o *= denom == 0.0f ? 0.0f : 1.0f / denom;
  if (use_gate != 0) o *= 1.0f / (1.0f + expf(-g[uint64_t{h} * dv + d]));
  out[uint64_t{h} * dv + d] = o;
}
