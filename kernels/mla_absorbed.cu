// Module mla_absorbed: the DeepSeek-V4-Flash absorbed-MLA decode kernels (SPEC §3).
// Each kernel reads like its port in emu/mla_absorbed.cpp: same parameters, same order, same
// phases. extern "C" keeps the entry names the emulator registers them under.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "device_common.cuh"
#include "device_formats.cuh"

using metrale::exp_below;
using metrale::key_set;
using metrale::KeySet;
using metrale::kWarp;
using metrale::warp_max;
using metrale::warp_sum;

// ---------------------------------------------------------------------------
// mla_batched_gemv: output[h*os + n] = Σ_j weight[(h*n_out + n)*k + j] * input[h*is + j]
// Grid: [⌈n_out/8⌉, num_heads]. Block: 256 (8 warps; warp w computes row n = blockIdx.x*8 + w,
// lanes stride over k, then a butterfly sum).
//   input  [num_heads, input_stride]  bf16
//   weight [num_heads, n_out, k]      bf16
//   output [num_heads, output_stride] bf16
extern "C" __global__ void mla_batched_gemv(const __nv_bfloat16* input, const __nv_bfloat16* weight,
                                            __nv_bfloat16* output, uint32_t n_out, uint32_t k, uint32_t input_stride,
                                            uint32_t output_stride) {
  const uint32_t h = blockIdx.y;
  const uint32_t n = blockIdx.x * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (n >= n_out) return;
  const __nv_bfloat16* w = weight + (uint64_t{h} * n_out + n) * k;
  const __nv_bfloat16* x = input + uint64_t{h} * input_stride;
  float acc = 0.0f;
  for (uint32_t j = lane; j < k; j += kWarp) acc += __bfloat162float(w[j]) * __bfloat162float(x[j]);
  acc = warp_sum(acc);
  if (lane == 0) output[uint64_t{h} * output_stride + n] = __float2bfloat16_rn(acc);
}

// ---------------------------------------------------------------------------
// mla_q_rope_scatter: copy each head's rope part of q_full into q_absorbed_buf and q_rope_contiguous.
// Grid: [1]. Block: 256, threads stride over nq*rope.
//   q_full            [nq, hd]            bf16
//   q_absorbed_buf    [nq, mla_cache_dim] bf16 (columns kv_lora .. kv_lora+rope written)
//   q_rope_contiguous [nq, rope]          bf16
extern "C" __global__ void mla_q_rope_scatter(const __nv_bfloat16* q_full, __nv_bfloat16* q_absorbed_buf,
                                              __nv_bfloat16* q_rope_contiguous, uint32_t nq, uint32_t hd,
                                              uint32_t nope, uint32_t rope, uint32_t kv_lora,
                                              uint32_t mla_cache_dim) {
  for (uint64_t idx = threadIdx.x; idx < uint64_t{nq} * rope; idx += blockDim.x) {
    const uint64_t h = idx / rope, i = idx % rope;
    const __nv_bfloat16 v = q_full[h * hd + nope + i];
    q_absorbed_buf[h * mla_cache_dim + kv_lora + i] = v;
    q_rope_contiguous[h * rope + i] = v;
  }
}

// ---------------------------------------------------------------------------
// mla_q_rope_writeback: q_absorbed_buf[h*mla_cache_dim + kv_lora + i] = q_rope_direct[h*rope + i].
// Grid: [1]. Block: 256, threads stride over nq*rope.
//   q_rope_direct  [nq, rope]          bf16
//   q_absorbed_buf [nq, mla_cache_dim] bf16
extern "C" __global__ void mla_q_rope_writeback(const __nv_bfloat16* q_rope_direct, __nv_bfloat16* q_absorbed_buf,
                                                uint32_t nq, uint32_t rope, uint32_t kv_lora,
                                                uint32_t mla_cache_dim) {
  for (uint64_t idx = threadIdx.x; idx < uint64_t{nq} * rope; idx += blockDim.x) {
    const uint64_t h = idx / rope, i = idx % rope;
    q_absorbed_buf[h * mla_cache_dim + kv_lora + i] = q_rope_direct[h * rope + i];
  }
}

// ---------------------------------------------------------------------------
// mla_cache_assemble: K = [kv_latent ‖ k_rope ‖ 0…], V = [kv_latent ‖ 0…].
// Grid: [1]. Block: max(mla_cache_dim, 256), one thread per element.
//   kv_latent [kv_lora] bf16; k_rope [rope] bf16; k_cache, v_cache [mla_cache_dim] bf16
extern "C" __global__ void mla_cache_assemble(const __nv_bfloat16* kv_latent, const __nv_bfloat16* k_rope,
                                              __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, uint32_t kv_lora,
                                              uint32_t rope, uint32_t mla_cache_dim) {
  const uint32_t tid = threadIdx.x;
  if (tid >= mla_cache_dim) return;
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
  const __nv_bfloat16 latent = tid < kv_lora ? kv_latent[tid] : zero;
  k_cache[tid] = tid < kv_lora ? latent : (tid < kv_lora + rope ? k_rope[tid - kv_lora] : zero);
  v_cache[tid] = latent;
}

// ---------------------------------------------------------------------------
// rope_pairs_bf16: rotate pairs (2i, 2i+1) of each [rows, rope] row in place at position pos.
// Grid: [⌈rows·rope/2 / 256⌉]. Block: 256, one thread per pair.
//   x [rows, rope] bf16
extern "C" __global__ void rope_pairs_bf16(__nv_bfloat16* x, uint32_t rows, uint32_t rope, uint32_t pos,
                                           float theta) {
  const uint64_t half = rope / 2;
  const uint64_t p = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (p >= rows * half) return;
  const uint64_t r = p / half, i = p % half;
  const float inv_freq = powf(theta, -static_cast<float>(2 * i) / static_cast<float>(rope));
  const float angle = static_cast<float>(pos) * inv_freq;
  const float c = cosf(angle), s = sinf(angle);
  const uint64_t at = r * rope + 2 * i;
  const float a = __bfloat162float(x[at]), b = __bfloat162float(x[at + 1]);
  x[at] = __float2bfloat16_rn(a * c - b * s);
  x[at + 1] = __float2bfloat16_rn(b * c + a * s);
}

// ---------------------------------------------------------------------------
// Paged attention, shared by both formats. One block per (query head, sequence): keys are taken
// 256 at a time (one per thread), with an online softmax across tiles; each thread owns the
// output dims tid, tid+256, ... (kMaxDimsPerThread of them at most).

namespace {

constexpr uint32_t kTile = 256;
constexpr uint32_t kMaxDimsPerThread = 4;  // kMaxKvCacheDim / 256
constexpr uint32_t kMaxQHeadDim = 1024;


// Block-wide reductions over one value per thread (256 threads).
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  __syncthreads();
  float r = scratch[0];
  for (uint32_t w = 1; w < blockDim.x / kWarp; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

// `Rows` maps key j to its K and V rows: `k_row(j)` / `v_row(j)` return a row handle, and
// `k(row, d)` / `v(row, d)` the dequantised FP32 value of dim d.
template <class Rows>
__device__ void paged_attention(const __nv_bfloat16* q, __nv_bfloat16* o, uint32_t q_head_dim,
                                uint32_t kv_cache_dim, float inv_sqrt_d, const KeySet& keys, float sink,
                                bool has_sink, const Rows& rows) {
  __shared__ float q_s[kMaxQHeadDim];
  __shared__ float p[kTile];
  __shared__ typename Rows::Row v_rows[kTile];
  __shared__ float scratch[kTile / kWarp];
  const uint32_t h = blockIdx.x, s = blockIdx.y, num_q_heads = gridDim.x, tid = threadIdx.x;
  const uint64_t qo_row = uint64_t{s} * num_q_heads + h;

  for (uint32_t d = tid; d < q_head_dim; d += blockDim.x) q_s[d] = __bfloat162float(q[qo_row * q_head_dim + d]);
  __syncthreads();

  float acc[kMaxDimsPerThread] = {};
  float m = -INFINITY, l = 0.0f;
  for (uint32_t tile = 0; tile < keys.count; tile += kTile) {
    const uint32_t n = min(kTile, keys.count - tile);
    // Phase A: one key per thread.
    float logit = -INFINITY;
    if (tid < n) {
      const auto k_row = rows.k_row(tile + tid);
      float dot = 0.0f;
      for (uint32_t d = 0; d < q_head_dim; ++d) dot += q_s[d] * rows.k(k_row, d);
      logit = dot * inv_sqrt_d;
      v_rows[tid] = rows.v_row(tile + tid);
    }
    // Phase B: block max and the tile's probabilities.
    const float tile_max = block_reduce<true>(logit, scratch);
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);
    const float pt = tid < n ? expf(logit - m_new) : 0.0f;
    p[tid] = pt;
    const float tile_sum = block_reduce<false>(pt, scratch);  // its barrier publishes p and v_rows
    l = l * alpha + tile_sum;
    m = m_new;
    // Phase C: each thread updates its output dims over the tile's V rows.
    for (uint32_t r = 0; r < kMaxDimsPerThread; ++r) {
      const uint32_t d = tid + r * kTile;
      if (d >= kv_cache_dim) break;
      float a = acc[r] * alpha;
      for (uint32_t t = 0; t < n; ++t) a += p[t] * rows.v(v_rows[t], d);
      acc[r] = a;
    }
    __syncthreads();  // p and v_rows are rewritten by the next tile
  }
  // The sink joins the denominator only, unscaled and without a value row, and only where there are
  // keys (l = 0 without: an empty key set writes zeros whatever the sink, NaN included; SPEC §3).
  if (has_sink && l != 0.0f) {
    const float m_final = fmaxf(m, sink);
    const float alpha = exp_below(m, m_final);  // all logits −inf and a −inf sink: 1, not NaN
    l = l * alpha + exp_below(sink, m_final);
    for (float& a : acc) a *= alpha;
  }
  // An empty key set writes zeros, never NaN; a NaN sink or logit with keys stays NaN, as in the split path.
  const float inv_l = l == 0.0f ? 0.0f : 1.0f / l;
  for (uint32_t r = 0; r < kMaxDimsPerThread; ++r) {
    const uint32_t d = tid + r * kTile;
    if (d >= kv_cache_dim) break;
    o[qo_row * kv_cache_dim + d] = __float2bfloat16_rn(acc[r] * inv_l);
  }
}

// FP8 rows: a row handle is the address of this KV head's first code; dequant = code · scale.
struct Fp8Rows {
  using Row = const uint8_t*;
  const uint8_t *k_cache, *v_cache, *comp_pool;
  const int32_t* table;  // this sequence's block-table row
  uint64_t cache_stride, head_off;
  uint32_t block_size, s, comp_block_count;
  KeySet keys;
  float k_scale, v_scale;

  __device__ Row row(uint32_t j, bool is_v) const {
    if (j < keys.comp) {
      const int64_t entry = (int64_t{s} * comp_block_count + j) * 2 + (is_v ? 1 : 0);
      return comp_pool + entry * static_cast<int64_t>(cache_stride) + head_off;
    }
    const uint32_t t = keys.start + (j - keys.comp);
    const int64_t slot = int64_t{table[t / block_size]} * block_size + t % block_size;
    return (is_v ? v_cache : k_cache) + slot * static_cast<int64_t>(cache_stride) + head_off;
  }
  __device__ Row k_row(uint32_t j) const { return row(j, false); }
  __device__ Row v_row(uint32_t j) const { return row(j, true); }
  __device__ float k(Row r, uint32_t d) const { return metrale::e4m3_decode(r[d]) * k_scale; }
  __device__ float v(Row r, uint32_t d) const { return metrale::e4m3_decode(r[d]) * v_scale; }
};

// NVFP4 rows: a row handle is (data row, scale row) of the slot; element e0 + d of the row.
struct Nvfp4Rows {
  struct Row {
    const uint8_t *data, *scales;
  };
  const uint8_t *k_cache, *v_cache;
  const int32_t* table;
  uint64_t block_stride_bytes, data_section_bytes, row_width, e0;
  uint32_t block_size;
  KeySet keys;

  __device__ Row row(uint32_t j, bool is_v) const {
    const uint32_t t = keys.start + j;
    const uint8_t* base = (is_v ? v_cache : k_cache) + int64_t{table[t / block_size]} * static_cast<int64_t>(block_stride_bytes);
    const uint64_t slot = t % block_size;
    return {base + slot * row_width / 2, base + data_section_bytes + slot * row_width / 16};
  }
  __device__ Row k_row(uint32_t j) const { return row(j, false); }
  __device__ Row v_row(uint32_t j) const { return row(j, true); }
  __device__ float value(Row r, uint32_t d) const {
    const uint64_t e = e0 + d;
    const uint8_t byte = r.data[e / 2];
    const uint8_t code = e % 2 == 0 ? (byte & 0xF) : (byte >> 4);
    return metrale::e2m1_decode(code) * metrale::e4m3_decode(r.scales[e / 16]);
  }
  __device__ float k(Row r, uint32_t d) const { return value(r, d); }
  __device__ float v(Row r, uint32_t d) const { return value(r, d); }
};

}  // namespace

// ---------------------------------------------------------------------------
// mla_paged_decode_fp8: paged attention over an E4M3 cache (SPEC §3).
// Grid: [num_q_heads, num_seqs]. Block: 256.
//   q            [num_seqs, num_q_heads, q_head_dim]            bf16
//   k_cache      row (b, i) at (b·block_size + i)·cache_stride   e4m3, [num_kv_heads, kv_cache_dim]
//   v_cache      as k_cache
//   o            [num_seqs, num_q_heads, kv_cache_dim]          bf16
//   block_tables [num_seqs, max_blocks_per_seq]                 int32
//   seq_lens     [num_seqs]                                     int32
//   sinks        [num_q_heads] f32 or null
//   comp_pool    [num_seqs, comp_block_count, 2 (K, V), cache_stride] e4m3 or null
extern "C" __global__ void __launch_bounds__(256) mla_paged_decode_fp8(
    const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache, __nv_bfloat16* o,
    const int32_t* block_tables, const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
    uint32_t num_kv_heads, uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float inv_sqrt_d,
    float k_scale, float v_scale, uint64_t cache_stride, uint32_t sliding_window, const float* sinks,
    const uint8_t* comp_pool, uint32_t comp_block_count) {
  const uint32_t h = blockIdx.x, s = blockIdx.y;
  const uint32_t kv_head = h / (num_q_heads / num_kv_heads);
  const uint32_t comp = comp_pool != nullptr && comp_block_count > 0 ? comp_block_count : 0;
  const KeySet keys = key_set(seq_lens[s], max_blocks_per_seq, block_size, sliding_window, comp);
  const Fp8Rows rows{k_cache,      v_cache,    comp_pool, block_tables + uint64_t{s} * max_blocks_per_seq,
                     cache_stride, uint64_t{kv_head} * kv_cache_dim, block_size, s, comp_block_count,
                     keys,         k_scale,    v_scale};
  const bool has_sink = sinks != nullptr;
  paged_attention(q, o, q_head_dim, kv_cache_dim, inv_sqrt_d, keys, has_sink ? sinks[h] : 0.0f, has_sink, rows);
}

// ---------------------------------------------------------------------------
// mla_paged_decode_nvfp4: paged attention over an NVFP4 cache (SPEC §3).
// Grid: [num_q_heads, num_seqs]. Block: 256.
//   block b at b·block_stride_bytes: slot i's packed E2M1 row at i·row_width/2, its E4M3 scales
//   (one per 16 values) at data_section_bytes + i·row_width/16; row_width = num_kv_heads·kv_cache_dim.
//   q, o, block_tables, seq_lens as for FP8.
extern "C" __global__ void __launch_bounds__(256) mla_paged_decode_nvfp4(
    const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache, __nv_bfloat16* o,
    const int32_t* block_tables, const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
    uint32_t num_kv_heads, uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float inv_sqrt_d,
    uint64_t block_stride_bytes, uint64_t data_section_bytes) {
  const uint32_t h = blockIdx.x, s = blockIdx.y;
  const uint32_t kv_head = h / (num_q_heads / num_kv_heads);
  const KeySet keys = key_set(seq_lens[s], max_blocks_per_seq, block_size, 0, 0);
  const uint64_t row_width = uint64_t{num_kv_heads} * kv_cache_dim;
  const Nvfp4Rows rows{k_cache,   v_cache,   block_tables + uint64_t{s} * max_blocks_per_seq,
                       block_stride_bytes, data_section_bytes, row_width, uint64_t{kv_head} * kv_cache_dim,
                       block_size, keys};
  paged_attention(q, o, q_head_dim, kv_cache_dim, inv_sqrt_d, keys, 0.0f, false, rows);
}

// ---------------------------------------------------------------------------
// mla_paged_cache_store_fp8: token t's K and V rows to slot slot_mapping[t] (−1 = skip) as
// E4M3(x / scale). Grid: [num_tokens]. Block: 256, threads stride over the row.
//   k_src, v_src [num_tokens, row_width] bf16; slot_mapping [num_tokens] int32
//   k_cache, v_cache: row of slot at slot·cache_stride, e4m3
extern "C" __global__ void mla_paged_cache_store_fp8(const __nv_bfloat16* k_src, const __nv_bfloat16* v_src,
                                                     uint8_t* k_cache, uint8_t* v_cache, const int32_t* slot_mapping,
                                                     uint32_t num_tokens, uint32_t row_width, uint32_t block_size,
                                                     uint64_t cache_stride, float k_scale, float v_scale) {
  (void)num_tokens;
  (void)block_size;  // slot = block·block_size + offset, so the row is at slot·cache_stride
  const uint64_t t = blockIdx.x;
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;
  const uint64_t dst = static_cast<uint64_t>(slot) * cache_stride;
  for (uint64_t e = threadIdx.x; e < row_width; e += blockDim.x) {
    k_cache[dst + e] = metrale::e4m3_encode(__bfloat162float(k_src[t * row_width + e]) / k_scale);
    v_cache[dst + e] = metrale::e4m3_encode(__bfloat162float(v_src[t * row_width + e]) / v_scale);
  }
}

// ---------------------------------------------------------------------------
// mla_paged_cache_store_nvfp4: token t's K and V rows to slot slot_mapping[t] (−1 = skip), NVFP4.
// Grid: [num_tokens]. Block: 256, one thread per group of 16 values (strided).
//   k_src, v_src [num_tokens, row_width] bf16; slot_mapping [num_tokens] int32
//   k_cache, v_cache: NVFP4 blocks of block_stride_bytes (layout as in the decode)
extern "C" __global__ void mla_paged_cache_store_nvfp4(const __nv_bfloat16* k_src, const __nv_bfloat16* v_src,
                                                       uint8_t* k_cache, uint8_t* v_cache,
                                                       const int32_t* slot_mapping, uint32_t num_tokens,
                                                       uint32_t row_width, uint32_t block_size,
                                                       uint64_t block_stride_bytes, uint64_t data_section_bytes) {
  (void)num_tokens;
  const uint64_t t = blockIdx.x;
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;
  const uint64_t base = static_cast<uint64_t>(slot) / block_size * block_stride_bytes;
  const uint64_t i = static_cast<uint64_t>(slot) % block_size;
  for (uint64_t g = threadIdx.x; g < row_width / 16; g += blockDim.x) {
    for (int which = 0; which < 2; ++which) {
      const __nv_bfloat16* src = which == 0 ? k_src : v_src;
      uint8_t* cache = which == 0 ? k_cache : v_cache;
      float x[16];
      for (int e = 0; e < 16; ++e) x[e] = __bfloat162float(src[t * row_width + g * 16 + e]);
      uint8_t packed[8];
      uint8_t scale = 0;
      metrale::nvfp4_encode_group(x, packed, scale);
      for (int m = 0; m < 8; ++m) cache[base + i * row_width / 2 + g * 8 + m] = packed[m];
      cache[base + data_section_bytes + i * row_width / 16 + g] = scale;
    }
  }
}
