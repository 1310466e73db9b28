// Pieces of the split decode that its mma.sync kernels (mla_fast.cu) and its wgmma kernels
// (mla_wgmma.cu, sm_90a) share: shared-memory and streaming access, the Q row scaling, the
// exact E4M3 and NVFP4 to FP16 conversions, and the paged rows of each cache format.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "device_common.cuh"

namespace metrale::split {

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes to shared memory in one STS.128 (the compiler, unable to prove the alignment of a
// runtime-pitched row, would otherwise split it into four 4-byte stores, bank-conflicted).
__device__ inline void st_shared_v4(void* dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(dst)), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// cp.async: global to shared without registers (sm_80+); 16 bytes bypass L1, 4 bytes may not.
__device__ inline void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ inline void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most one committed group (the newest) is still in flight.
__device__ inline void cp_async_wait_all_but_newest() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// 16 bytes from global memory read once by this block: through the read-only path, not kept
// in L1.
__device__ inline uint4 ld_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ inline uint2 ld_stream8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
// Asks L2 for the lines of a `bytes`-long cache row that thread `first` of the four sharing a key
// covers: the points 128·first, +512, ... of the row and, for the last thread, its last byte —
// points 128 bytes apart fall on every line the row touches. Nothing comes to the thread; a later
// load of the row finds it in L2 (prefetch.global.L2). bytes > 0.
__device__ inline void prefetch_row_l2(const uint8_t* row, uint32_t bytes, uint32_t first) {
#pragma unroll 1
  for (uint32_t at = 128 * first; at < bytes; at += 512) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + at));
  if (first == 3) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + bytes - 1));
}
__device__ inline uint32_t ld_stream4(const void* p) {
  uint32_t r;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
  return r;
}

// The units u = threadIdx.x, threadIdx.x + blockDim.x, ... of a tile whose keys have `per_key`
// units each, walked as (key, unit of the key) with no division per step.
struct UnitWalk {
  uint32_t key, part, step_keys, step_parts, per_key;
  __device__ explicit UnitWalk(uint32_t per_key_units)
      : key(threadIdx.x / per_key_units),
        part(threadIdx.x % per_key_units),
        step_keys(blockDim.x / per_key_units),
        step_parts(blockDim.x % per_key_units),
        per_key(per_key_units) {}
  __device__ void next() {
    key += step_keys;
    part += step_parts;
    if (part >= per_key) part -= per_key, ++key;
  }
};

// ---- The combine's arithmetic, shared by mla_paged_decode_combine (mla_fast.cu) and the
// wgmma16 entry that combines inside its cluster (mla_wgmma.cu), so that both give the same bits.
constexpr float kCombineSkip = -1.0f;  // the weight of a chunk without keys (e^x is never negative)

// A chunk's term w·v of a dim's sum: the product rounded on its own (never fused into the sum).
__device__ inline float combine_term(float w, float v) { return w != kCombineSkip ? __fmul_rn(w, v) : 0.0f; }

// The weights of n ≤ kMax chunks (running max m_z, sum l_z): w_z = e^(m_z − M), kCombineSkip for a
// chunk without keys (l_z = 0; a NaN l_z counts and poisons the head), M = max(the m_z with keys,
// *sink); returns v_scale / (e^(*sink − M) + Σ w_z·l_z), 0 with no keys (whatever the sink), the terms
// added as the combine's block reductions add them (a butterfly over lanes 0..kMax−1:
// ((t0 + t2) + (t1 + t3)) for four) after the sink's.
template <uint32_t kMax>
__device__ float chunk_weights(const float (&m)[kMax], const float (&l)[kMax], uint32_t n, const float* sink,
                               float v_scale, float (&w)[kMax]) {
  bool live[kMax], any = false;
  float big = -INFINITY, t[kMax];
#pragma unroll
  for (uint32_t z = 0; z < kMax; ++z) {
    live[z] = z < n && l[z] != 0.0f;
    any = any || live[z];
    big = live[z] ? fmaxf(big, m[z]) : big;
  }
  if (!any) sink = nullptr;  // no keys: zeros, whatever the sink (SPEC §3)
  if (sink != nullptr) big = fmaxf(*sink, big);
#pragma unroll
  for (uint32_t z = 0; z < kMax; ++z) {
    w[z] = live[z] ? expf(m[z] - big) : kCombineSkip;
    t[z] = live[z] ? __fmul_rn(w[z], l[z]) : 0.0f;  // rounded here, never fused into the sums below
  }
#pragma unroll
  for (uint32_t off = kMax / 2; off > 0; off /= 2) {
#pragma unroll
    for (uint32_t z = 0; z < off; ++z) t[z] = t[z] + t[z + off];
  }
  const float denom = (sink != nullptr ? exp_below(*sink, big) : 0.0f) + t[0];
  return denom == 0.0f ? 0.0f : v_scale / denom;  // NaN (a NaN sink) stays NaN
}

// Keys [begin, end) of chunk z of a key set cut into chunks of keys_per_split (empty past the
// end; offsets in 64 bits, so a chunk index times its length never wraps).
struct Chunk {
  uint32_t begin, end;
};
__device__ inline Chunk chunk_of(const KeySet& keys, uint32_t z, uint32_t keys_per_split) {
  const uint32_t begin = static_cast<uint32_t>(min(uint64_t{z} * keys_per_split, uint64_t{keys.count}));
  return {begin, static_cast<uint32_t>(min(uint64_t{keys.count}, uint64_t{begin} + keys_per_split))};
}

__device__ inline uint32_t dynamic_smem_bytes() {
  uint32_t r;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
  return r;
}

__device__ inline uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The power of two 2^e a Q row is scaled by on its way to FP16, and 2^-e, from the row's largest
// BF16 magnitude bits `big`: the largest magnitude lands in [2^14, 2^15) (below, for rows under
// 2^-112, where e stops at 126), so the row converts
// without overflow, every BF16 value of it that lands in FP16's normal range exactly, and the
// logits are scaled back exactly (both factors normal FP32: e in [-114, 126]; a row of zeros,
// an inf or a NaN stays zeros, inf or NaN).
struct QScale {
  float up, down;
};
__device__ inline QScale q_scale_of(uint32_t big) {
  const int field = max(1, static_cast<int>(big >> 7));  // BF16 exponent field; subnormals as 1
  const int e = min(126, 141 - field);                   // 14 − (field − 127)
  return {__uint_as_float(static_cast<uint32_t>(127 + e) << 23), __uint_as_float(static_cast<uint32_t>(127 - e) << 23)};
}

// A Q row's logit factor: its unscale factor 2^-e times the logit scale `scale` (both finite),
// held within FP32's finite range where the product passes it (either sign: the launchers take a
// negative scale). A key whose dot product with the scaled row is 0 then keeps the logit 0, as in
// the seed kernel, where inf × 0 had made it NaN (|max |q| × scale| past about 2^142); a nonzero
// dot product (at least about 2^-34 in FP16 × FP16 terms) gives a logit of at least 2^94 in
// magnitude, or ±inf, so the softmax picks the keys the unclamped logits would.
__device__ inline float logit_factor(float unscale, float scale) {
  return fmaxf(fminf(unscale * scale, 3.40282347e38f), -3.40282347e38f);
}

// Q rows [head0, head0 + rows) of sequence s as FP16, a warp per row (rows past num_q_heads are
// zeros): each row scaled by q_scale_of its largest magnitude, its 16-byte unit `part` (8 dims,
// four FP16 pairs) handed to store(row, part, words), its unscale factor 2^-e at q_unscale[row].
// kUnits: units per lane, enough for q_head_dim. kRowsAtOnce: rows a warp loads before it
// converts the first (their loads in flight together; the same rows and results for any value).
template <uint32_t kUnits, uint32_t kRowsAtOnce = 1, class Store>
__device__ inline void load_q_rows_with(const __nv_bfloat16* q, uint32_t s, uint32_t head0, uint32_t rows,
                                        uint32_t num_q_heads, uint32_t q_head_dim, float* q_unscale,
                                        const Store& store) {
  const uint32_t lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  // A row's units (zeros past the row or the heads) and its largest BF16 magnitude bits (NaN above inf).
  auto load = [&](uint32_t row, uint4(&v)[kUnits]) {
    const uint32_t h = head0 + row;
    const uint4* src = reinterpret_cast<const uint4*>(q + (uint64_t{s} * num_q_heads + h) * q_head_dim);
    uint32_t big = 0;
#pragma unroll
    for (uint32_t i = 0; i < kUnits; ++i) {
      const uint32_t part = lane + i * kWarp;
      // (One row at a time, row < rows holds already: the test is left out, which keeps the
      // one-row callers' SASS as it was, all but the 64-head FP8 entry's schedule.)
      const bool live = (kRowsAtOnce == 1 || row < rows) && h < num_q_heads && part < q_head_dim / 8;
      v[i] = live ? src[part] : make_uint4(0, 0, 0, 0);
      for (uint32_t w : {v[i].x, v[i].y, v[i].z, v[i].w}) big = max(big, max(w & 0x7FFFu, (w >> 16) & 0x7FFFu));
    }
    return big;
  };
  auto convert = [&](uint32_t row, const uint4(&v)[kUnits], uint32_t big) {
    const QScale qs = q_scale_of(__reduce_max_sync(0xFFFFFFFFu, big));
#pragma unroll
    for (uint32_t i = 0; i < kUnits; ++i) {
      const uint32_t part = lane + i * kWarp;
      if (part >= q_head_dim / 8) break;
      uint32_t out[4];
      const uint32_t words[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int w = 0; w < 4; ++w)
        out[w] = pack_f16(__uint_as_float(words[w] << 16) * qs.up, __uint_as_float(words[w] & 0xFFFF0000u) * qs.up);
      store(row, part, out);
    }
    if (lane == 0) q_unscale[row] = qs.down;
  };
  for (uint32_t row0 = threadIdx.x / kWarp; row0 < rows; row0 += kRowsAtOnce * warps) {
    uint4 v[kRowsAtOnce][kUnits];
    uint32_t big[kRowsAtOnce];
#pragma unroll
    for (uint32_t r = 0; r < kRowsAtOnce; ++r) big[r] = load(row0 + r * warps, v[r]);
#pragma unroll
    for (uint32_t r = 0; r < kRowsAtOnce; ++r)
      if (kRowsAtOnce == 1 || row0 + r * warps < rows) convert(row0 + r * warps, v[r], big[r]);
  }
}

// The same with each unit stored whole at dst(row, part), 16-byte aligned.
template <uint32_t kUnits, class Dst>
__device__ inline void load_q_rows(const __nv_bfloat16* q, uint32_t s, uint32_t head0, uint32_t rows,
                                   uint32_t num_q_heads, uint32_t q_head_dim, float* q_unscale, const Dst& dst) {
  load_q_rows_with<kUnits>(q, s, head0, rows, num_q_heads, q_head_dim, q_unscale,
                           [&](uint32_t row, uint32_t part, const uint32_t(&w)[4]) {
                             st_shared_v4(dst(row, part), w[0], w[1], w[2], w[3]);
                           });
}

// Two E4M3 codes (the low and high byte of `pair`) as an FP16 pair, exactly: one conversion.
__device__ inline __half2 e4m3x2_to_f16x2(uint32_t pair) {
  return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFF), __NV_E4M3));
}
__device__ inline uint32_t bits_of(__half2 v) { return *reinterpret_cast<const uint32_t*>(&v); }
// The two E4M3 codes in the high half of `word` as an FP16 pair (bits), exactly: one conversion
// that reads the half in place (no shift).
__device__ inline uint32_t e4m3x2_hi_to_f16x2(uint32_t word) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(word));
  return r;
}

// 16 E4M3 codes (loaded as one 16-byte word) as 16 FP16 values, two per word of `out` (exact).
// kHighInPlace: each word's upper pair converted in place (e4m3x2_hi_to_f16x2) rather than
// shifted down first — one instruction fewer per pair, which only the 16-head register-operand
// kernel gained from (docs/performance.md); the others keep the shift.
template <bool kHighInPlace = false>
__device__ inline void fp8x16_to_f16(const uint4 raw, uint32_t (&out)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    out[w * 2] = bits_of(e4m3x2_to_f16x2(words[w]));
    out[w * 2 + 1] = kHighInPlace ? e4m3x2_hi_to_f16x2(words[w]) : bits_of(e4m3x2_to_f16x2(words[w] >> 16));
  }
}

// 16 NVFP4 values (8 packed bytes and one E4M3 scale) as 16 FP16 values in `out`. Each E2M1
// code s·ee·m becomes the E4M3 code s·00ee·m00, which is the same value times 2^-6 (subnormal
// codes included), so the hardware's E4M3 pair conversion decodes eight codes in four
// instructions; the scale, times 64 (at most 28672, at least 2^-3), restores it in one FP16
// multiply per pair. Every product has at most 6 significant bits and lies in [2^-10, 2688]:
// exact in FP16, the values of e2m1_decode · e4m3_decode.
__device__ inline void nvfp4x16_to_f16(const uint2 raw, uint8_t scale_code, uint32_t (&out)[8]) {
  const __half2 scale = __hmul2(e4m3x2_to_f16x2(scale_code * 0x0101u), __float2half2_rn(64.0f));  // in both halves
  const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const uint32_t lo = words[w] & 0x0F0F0F0Fu, hi = (words[w] >> 4) & 0x0F0F0F0Fu;  // even and odd codes
    const uint32_t lo8 = ((lo & 0x08080808u) << 4) | ((lo & 0x07070707u) << 2);
    const uint32_t hi8 = ((hi & 0x08080808u) << 4) | ((hi & 0x07070707u) << 2);
    const uint32_t pairs[2] = {__byte_perm(lo8, hi8, 0x5140), __byte_perm(lo8, hi8, 0x7362)};  // codes 0-3, 4-7
#pragma unroll
    for (int p = 0; p < 2; ++p) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        out[w * 4 + p * 2 + h] = bits_of(__hmul2(e4m3x2_to_f16x2(pairs[p] >> (16 * h)), scale));
    }
  }
}

// 16 FP16 values (`words`) to `dst`, 16-byte aligned.
__device__ inline void store_f16x16(__half* dst, const uint32_t (&w)[8]) {
  st_shared_v4(dst, w[0], w[1], w[2], w[3]);
  st_shared_v4(dst + 8, w[4], w[5], w[6], w[7]);
}

struct Fp8Rows {
  const uint8_t *k_cache, *v_cache, *comp_pool;
  const int32_t* table;
  uint64_t cache_stride;
  uint32_t block_size, s, comp_block_count, dim;
  KeySet keys;

  __device__ int32_t entry(uint32_t j) const {
    return j < keys.comp ? 0 : table[(keys.start + (j - keys.comp)) / block_size];
  }
  // Whether every key's V row is its K row: the caller passed one latent pool as both caches (V =
  // K, FlashMLA's layout; o's last dims then hold P·K_rope) and the chunk has no compressed keys
  // (whose V rows follow their K rows).
  __device__ bool v_is_k() const { return k_cache == v_cache && keys.comp == 0; }
  __device__ void locate(uint32_t j, int32_t entry, const uint8_t** rows) const {
    if (j < keys.comp) {
      const int64_t pos = (int64_t{s} * comp_block_count + j) * 2;
      rows[0] = comp_pool + pos * static_cast<int64_t>(cache_stride);
      rows[2] = rows[0] + cache_stride;
      return;
    }
    const uint32_t t = keys.start + (j - keys.comp);
    const int64_t slot = int64_t{entry} * block_size + t % block_size;
    rows[0] = k_cache + slot * static_cast<int64_t>(cache_stride);
    rows[2] = v_cache + slot * static_cast<int64_t>(cache_stride);
  }
  using Raw = uint4;
  static constexpr uint32_t kBatch = 4;  // units in flight per thread
  __device__ Raw load(const uint8_t* const* rows, uint32_t part, uint32_t h) const {
    return ld_stream16(rows[2 * h] + part * 16);
  }
  // Thread `first` of a key's four asks L2 for its share of the key's K (h 0) or V (h 1) row.
  __device__ void prefetch(const uint8_t* const* rows, uint32_t first, uint32_t h) const {
    prefetch_row_l2(rows[2 * h], dim, first);
  }
  // Staged key: [K row | V row], dim bytes each, copied 16 bytes at a time.
  __device__ uint32_t raw_pitch() const { return 2 * dim; }
  __device__ uint32_t copy_units() const { return dim / 16; }
  __device__ void stage(const uint8_t* const* rows, uint8_t* dst, uint32_t u, uint32_t h) const {
    cp_async16(dst + h * dim + 16 * u, rows[2 * h] + 16 * u);
  }
  __device__ Raw staged(const uint8_t* src, uint32_t part, uint32_t h) const {
    return *reinterpret_cast<const uint4*>(src + h * dim + part * 16);
  }
  __device__ void convert(const Raw& raw, uint32_t (&out)[8]) const { fp8x16_to_f16(raw, out); }
  // One half staged alone (the wgmma kernels' register operands): unit `part` of a staged row.
  __device__ Raw staged_half(const uint8_t* src, uint32_t part) const {
    return *reinterpret_cast<const uint4*>(src + part * 16);
  }
  // The codes of values d and d + 1 (d even) of a staged row, in the low half.
  __device__ uint32_t staged_codes(const uint8_t* src, uint32_t d) const {
    return *reinterpret_cast<const uint16_t*>(src + d);
  }
};

struct Nvfp4Rows {
  const uint8_t *k_cache, *v_cache;
  const int32_t* table;
  uint64_t block_stride_bytes, data_section_bytes;
  uint32_t block_size, dim;
  KeySet keys;

  __device__ int32_t entry(uint32_t j) const { return table[(keys.start + j) / block_size]; }
  // Whether every key's V row is its K row: one latent pool passed as both caches.
  __device__ bool v_is_k() const { return k_cache == v_cache; }
  __device__ void locate(uint32_t j, int32_t entry, const uint8_t** rows) const {
    const int64_t base = int64_t{entry} * static_cast<int64_t>(block_stride_bytes);
    const uint64_t slot = (keys.start + j) % block_size;
    rows[0] = k_cache + base + slot * dim / 2;
    rows[1] = k_cache + base + data_section_bytes + slot * dim / 16;
    rows[2] = v_cache + base + slot * dim / 2;
    rows[3] = v_cache + base + data_section_bytes + slot * dim / 16;
  }
  struct Raw {
    uint2 data;
    uint8_t scale;
  };
  static constexpr uint32_t kBatch = 4;  // units in flight per thread
  __device__ Raw load(const uint8_t* const* rows, uint32_t part, uint32_t h) const {
    return {ld_stream8(rows[2 * h] + part * 8), rows[2 * h + 1][part]};
  }
  // Thread `first` of a key's four asks L2 for its share of the key's K (h 0) or V (h 1) data and
  // scale rows.
  __device__ void prefetch(const uint8_t* const* rows, uint32_t first, uint32_t h) const {
    prefetch_row_l2(rows[2 * h], dim / 2, first);
    prefetch_row_l2(rows[2 * h + 1], dim / 16, first);
  }
  // Staged key: [K data | V data | K scales | V scales] (dim/2, dim/2, dim/16, dim/16 bytes),
  // padded to 16 bytes; data copied 16 bytes at a time, scales 4 (dim is a multiple of 64).
  __device__ uint32_t raw_pitch() const { return (dim + dim / 8 + 15) / 16 * 16; }
  __device__ uint32_t copy_units() const { return dim / 32 + dim / 64; }
  __device__ void stage(const uint8_t* const* rows, uint8_t* dst, uint32_t u, uint32_t h) const {
    if (u < dim / 32) {
      cp_async16(dst + h * dim / 2 + 16 * u, rows[2 * h] + 16 * u);
    } else {
      const uint32_t w = u - dim / 32;
      cp_async4(dst + dim + h * dim / 16 + 4 * w, rows[2 * h + 1] + 4 * w);
    }
  }
  __device__ Raw staged(const uint8_t* src, uint32_t part, uint32_t h) const {
    return {*reinterpret_cast<const uint2*>(src + h * dim / 2 + part * 8), src[dim + h * dim / 16 + part]};
  }
  __device__ void convert(const Raw& raw, uint32_t (&out)[8]) const { nvfp4x16_to_f16(raw.data, raw.scale, out); }
};

// The rows of sequence blockIdx.z of an FP8 cache (key set as SPEC §3: window, compressed pool).
__device__ inline Fp8Rows fp8_rows(const uint8_t* k_cache, const uint8_t* v_cache, const int32_t* block_tables,
                                   const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t kv_cache_dim,
                                   uint32_t block_size, uint64_t cache_stride, uint32_t sliding_window,
                                   const uint8_t* comp_pool, uint32_t comp_block_count) {
  const uint32_t s = blockIdx.z;
  const uint32_t comp = comp_pool != nullptr && comp_block_count > 0 ? comp_block_count : 0;
  return {k_cache,
          v_cache,
          comp_pool,
          block_tables + uint64_t{s} * max_blocks_per_seq,
          cache_stride,
          block_size,
          s,
          comp_block_count,
          kv_cache_dim,
          key_set(seq_lens[s], max_blocks_per_seq, block_size, sliding_window, comp)};
}

// The rows of sequence blockIdx.z of an NVFP4 cache.
__device__ inline Nvfp4Rows nvfp4_rows(const uint8_t* k_cache, const uint8_t* v_cache, const int32_t* block_tables,
                                       const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t kv_cache_dim,
                                       uint32_t block_size, uint64_t block_stride_bytes, uint64_t data_section_bytes) {
  const uint32_t s = blockIdx.z;
  return {k_cache,
          v_cache,
          block_tables + uint64_t{s} * max_blocks_per_seq,
          block_stride_bytes,
          data_section_bytes,
          block_size,
          kv_cache_dim,
          key_set(seq_lens[s], max_blocks_per_seq, block_size, 0, 0)};
}

}  // namespace metrale::split
