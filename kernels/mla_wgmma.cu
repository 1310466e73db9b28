// Module mla_wgmma (sm_90a only): the head-grouped split-KV paged decode of mla_fast on Hopper's
// warpgroup MMA, on 64-key tiles, for 33 heads and more (mla_paged_decode_wgmma_*, the 64-head
// block of wgmma64_rs_decode, and mla_paged_decode_wgmma_combine_fp8, the same for FP8 in
// clusters that combine their partials) and for 16 or fewer (mla_paged_decode_wgmma16_*, the
// warp-specialised block of wgmma16_producers_decode, and mla_paged_decode_wgmma16_rs_*, the
// one-warpgroup block of wgmma16_rs_decode, with mla_paged_decode_wgmma16_rs_combine_fp8 its
// FP8 cluster entry). Each kernel reads like its port in emu/mla_fast.cpp (split_decode with
// 64-key tiles); its partials go to mla_fast's combine (the cluster entries' stay in their
// clusters: cluster_combine).
//
// The products are transposed — Sᵀ = K·Qᵀ puts a tile's 64 keys in the wgmma's M and the heads
// in N, Oᵀ = Vᵀ·Pᵀ the output dims in M — so that a block of 16 or 32 heads fills an M of 64.
// The register-operand blocks (wgmma16_rs_decode, and wgmma64_rs_decode's two warpgroups of 32
// heads) stage each tile's raw cache rows with the bulk copy engine and convert them, exactly to
// FP16, straight into the A fragments of the threads that hold them (FP8: E4M3 pairs; NVFP4: its
// E2M1 codes rewritten as E4M3 codes and one FP16 multiply by the scales): no FP16 copy of the
// cache in shared memory. Q (FP16, each row scaled by a power of two as in mla_fast, its columns
// permuted to the contraction order of those fragments) and P stay in shared memory as the B
// operands, read through descriptors. The warp-specialised block converts to FP16 tiles in shared
// memory for a consumer warpgroup instead (its tile chain is short, so it serves small grids, and
// over one latent pool it converts each tile once for both products).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "device_common.cuh"
#include "split_common.cuh"

using metrale::KeySet;
using metrale::kWarp;
using metrale::wait_for_previous_kernel;
using namespace metrale::split;

namespace {

constexpr uint32_t kTileKeys = 64;                  // keys per tile
constexpr uint32_t kSlabBytes = 64 * 128;           // 64 rows of a 64-column slab
constexpr uint32_t kDim = 576;                      // q_head_dim = kv_cache_dim (DeepSeek)
constexpr uint32_t kQUnits = kDim / 8 / kWarp + 1;  // 16-byte units of a Q row per lane (≤)

__device__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Shared-memory writes made by threads visible to the tensor cores' (async proxy) reads.
__device__ void fence_to_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A shared-memory matrix descriptor with the 128-byte swizzle: start address, leading and stride
// byte offsets (K-major: stride = 1024 between 8-row groups, leading unused; MN-major: leading =
// the 64-column atoms' stride, stride = 1024 between 8-row groups of K).
__device__ uint64_t smem_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return uint64_t{(addr & 0x3FFFFu) >> 4} | (uint64_t{leading >> 4} << 16) | (uint64_t{stride >> 4} << 32) |
         (uint64_t{1} << 62);
}

// Byte offset of 16-byte chunk `chunk` (columns 8·chunk..8·chunk+7) of row `row` in a 64-row FP16
// tile stored as 64-column slabs of 128-byte rows, the 128-byte swizzle applied (chunk ^ row % 8).
__device__ uint32_t swizzled(uint32_t row, uint32_t chunk) {
  return (chunk / 8) * kSlabBytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
}

// One 16-value unit of a key's row, raw, as FP16 (exact) at its place in the swizzled tile.
template <class Rows>
__device__ void store_unit(const Rows& layout, const typename Rows::Raw& raw, uint8_t* tile, uint32_t key,
                           uint32_t part) {
  uint32_t w[8];
  layout.convert(raw, w);
  st_shared_v4(tile + swizzled(key, 2 * part), w[0], w[1], w[2], w[3]);
  st_shared_v4(tile + swizzled(key, 2 * part + 1), w[4], w[5], w[6], w[7]);
}

// The low word of smem_desc(addr, leading, 1024): an offset into the tile (bytes / 16) is added
// to it alone — shared memory addresses are under 256 KB, so addr / 16 plus the offset stays in
// the 14-bit start-address field and never reaches the leading offset's — and the high word is
// the same for every tile (kDescHigh). Built from these, a warpgroup's descriptors stay in
// uniform registers (a uniform add and three uniform moves a wgmma), where 64-bit descriptors
// took ten instructions a wgmma through vector registers (ncu, docs/performance.md "Forty-first
// session").
__device__ uint32_t smem_desc_low(uint32_t addr, uint32_t leading) {
  return ((addr & 0x3FFFFu) >> 4) | ((leading >> 4) << 16);
}
constexpr uint64_t kDescHigh = uint64_t{(1024 >> 4) | (1u << 30)} << 32;  // stride 1024, 128-byte swizzle

// D (+)= A·B, m64n16k16, FP16 in, FP32 accumulate, A and B in shared memory (descriptors given by
// their low words, smem_desc_low), B K-major; A K-major, or MN-major with kTransA (the 16-head
// blocks' Vᵀ).
template <int kTransA>
__device__ void wgmma_ss_m64n16k16(float (&d)[8], uint32_t a_low, uint32_t b_low, uint32_t accumulate) {
  const uint64_t a = kDescHigh | a_low, b = kDescHigh | b_low;
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA));
}

// D (+)= A·B, m64n16k16, FP16 in, FP32 accumulate: A from registers (each warp's 16 rows as the
// m16n8k16 A fragment), B K-major in shared memory (descriptor). `accumulate` 0 overwrites D.
__device__ void wgmma_rs_m64n16k16(float (&d)[8], const uint32_t (&a)[4], uint64_t b, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
// D (+)= A·B, m64n32k16, as wgmma_rs_m64n16k16 (16 accumulator registers); with kTransB, B
// MN-major (the heads-in-M block's V rows).
template <int kTransB = 0>
__device__ void wgmma_rs_m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t b, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(kTransB));
}
// The register-operand m64nNk16 of kAcc = N / 2 accumulator registers (N = 16 or 32 heads).
template <uint32_t kAcc>
__device__ void wgmma_rs_heads(float (&d)[kAcc], const uint32_t (&a)[4], uint64_t b, uint32_t accumulate) {
  if constexpr (kAcc == 8) {
    wgmma_rs_m64n16k16(d, a, b, accumulate);
  } else {
    static_assert(kAcc == 16, "16 or 32 heads");
    wgmma_rs_m64n32k16(d, a, b, accumulate);
  }
}
// Pins register `r` here: the compiler computes it before this point (the A operands of a wgmma
// before its wgmma_fence, which otherwise costs a fence per wgmma).
__device__ void pin(uint32_t& r) { asm volatile("" : "+r"(r)); }
// Wait until at most kPending of this warpgroup's wgmma commit groups are still running.
template <int kPending>
__device__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The 16-head blocks: heads are the N of every wgmma, keys and output dims its M. Two designs:
// warp-specialised (wgmma16_producers_decode: producer warpgroups convert to FP16 tiles in shared
// memory for a consumer warpgroup; its tile chain is short, so it serves small grids, and NVFP4
// over one latent pool, whose tiles it converts once) and one
// warpgroup converting the cache bytes into its own A fragments (wgmma16_rs_decode: no
// FP16 round trip and two blocks per SM, faster where a block slot has many tiles to walk).
constexpr uint32_t kRows16 = 16;
constexpr uint32_t kSlab16Bytes = kRows16 * 128;  // 16 rows of a 64-column slab (Q, P)
constexpr uint32_t kAtoms16 = kDim / 64;          // the output's 64-row atoms (Oᵀ's M), nine
constexpr uint32_t kKUnits16 = kDim / 64;         // 16-value units of a K row an FP8 block's thread holds

// Byte offset of 16-byte chunk `chunk` of row `row` in a 16-row FP16 matrix of 64-column slabs
// with the 128-byte swizzle (Q; P, one slab of 64 keys).
__device__ uint32_t swizzled16(uint32_t row, uint32_t chunk) {
  return (chunk / 8) * kSlab16Bytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16);
}

// Head jj (0-3) of the thread of lane `lane` in the transposed accumulator layout of a 16-head
// block: element e of Sᵀ or Oᵀ belongs to head 8·(jj/2) + 2·(lane%4) + jj%2, jj = 2·(e/4) + e%2.
__device__ uint32_t head16_of(uint32_t jj, uint32_t lane) { return 8 * (jj / 2) + 2 * (lane % 4) + jj % 2; }

// The online softmax over one tile of a 16-head block (both designs), in the transposed
// accumulator layout: the thread's element e of Sᵀ is key r0 + 8·(e%4 ≥ 2) of head
// jj = 2·(e/4) + e%2 (head 8·(jj/2) + 2·(lane%4) + jj%2); keys from `end` on are masked. The max
// over the tile's keys takes three lane shuffles, then the four warps' maxima through `red`
// ([warp][16 heads]), `after_maxima` the barrier between their writes and reads (and what may
// start there). Rescales o and the thread's partial sums l, and writes P (FP16) to the slab `sp`.
template <class AfterMaxima>
__device__ void tile_softmax16(float (&sacc)[8], float (&m)[4], float (&l)[4], float (&o)[kAtoms16][8],
                               const float (&q_down)[4], uint32_t tile, uint32_t end, uint32_t r0, uint32_t warp,
                               uint32_t lane, float* red, uint8_t* sp, const AfterMaxima& after_maxima) {
  auto head_of = [&](uint32_t jj) { return head16_of(jj, lane); };
  float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) {
    const uint32_t key = r0 + 8 * ((e % 4) / 2), jj = 2 * (e / 4) + e % 2;
    sacc[e] = tile + key < end ? sacc[e] * q_down[jj] : -INFINITY;
    mx[jj] = fmaxf(mx[jj], sacc[e]);
  }
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) {
    for (uint32_t off = 4; off < kWarp; off *= 2) mx[jj] = fmaxf(mx[jj], __shfl_xor_sync(0xFFFFFFFFu, mx[jj], off));
    if (lane < 4) red[warp * kRows16 + head_of(jj)] = mx[jj];
  }
  after_maxima();
  float alpha[4];
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) {
    const uint32_t h = head_of(jj);
    const float t = fmaxf(fmaxf(red[h], red[kRows16 + h]), fmaxf(red[2 * kRows16 + h], red[3 * kRows16 + h]));
    const float m_new = fmaxf(m[jj], t);
    alpha[jj] = expf(m[jj] - m_new);
    m[jj] = m_new;
  }
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (uint32_t e = 0; e < 8; ++e) {
    const uint32_t key = r0 + 8 * ((e % 4) / 2), jj = 2 * (e / 4) + e % 2;
    const float pe = expf(sacc[e] - m[jj]);
    sum[jj] += pe;
    *reinterpret_cast<__half*>(sp + swizzled16(head_of(jj), key / 8) + (key % 8) * 2) = __float2half_rn(pe);
  }
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) l[jj] = l[jj] * alpha[jj] + sum[jj];
  if (alpha[0] != 1.0f || alpha[1] != 1.0f || alpha[2] != 1.0f || alpha[3] != 1.0f) {
#pragma unroll
    for (uint32_t a = 0; a < kAtoms16; ++a)
#pragma unroll
      for (uint32_t e = 0; e < 8; ++e) o[a][e] *= alpha[2 * (e / 4) + e % 2];
  }
}

// ---- FP8: one warpgroup, A from registers

// Q's columns in the contraction order of Sᵀ = K·Qᵀ, chosen so that a thread's A fragments of K
// are whole 16-value units of its two keys' rows: within each 64-dim slab i, dim
// 64i + 16j + 4t + 2hi + e is column 64i + 16t + 8hi + 2j + e, which k-step 4i + t gives the
// threads of quad index j (lane % 4) as their A column 2j + 8hi + e — the values 4t + 2hi + e of
// their unit 4i + j. Unit `part` of a Q row (dims 8·part..+7) thus goes as four FP16 pairs to
// four chunks, at the same 4-byte place in each. kRowsQ: the rows of a slab (16 or 64 heads).
template <uint32_t kRowsQ = kRows16>
__device__ void store_q_permuted(uint8_t* sq, uint32_t row, uint32_t part, const uint32_t (&w)[4]) {
  const uint32_t chunk0 = 8 * (part / 8) + 4 * (part % 2), byte = 4 * ((part % 8) / 2);
  auto at = [&](uint32_t chunk) { return kRowsQ == kRows16 ? swizzled16(row, chunk) : swizzled(row, chunk); };
#pragma unroll
  for (uint32_t m = 0; m < 4; ++m) *reinterpret_cast<uint32_t*>(sq + at(chunk0 + m) + byte) = w[m];
}

// The two keys of a staged K half-tile a thread of the register-operand blocks holds (rows r0 and
// r0 + 8 of its warp's 16): unit `part` (16 values) of row r, raw, and its conversion to eight
// FP16 pairs (exact), values 2i and 2i + 1 in word i. FP8: rows of 576 codes; NVFP4: rows of 288
// data bytes and their 36 scales (the unit's own).
struct Fp8KeyPair {
  const uint8_t* row[2];
  using Raw = uint4;
  __device__ Raw unit(uint32_t r, uint32_t part) const { return *reinterpret_cast<const uint4*>(row[r] + part * 16); }
  __device__ static void convert(const Raw& raw, uint32_t (&w)[8]) { fp8x16_to_f16<true>(raw, w); }
};
struct Nvfp4KeyPair {
  const uint8_t* data[2];
  const uint8_t* scales[2];
  struct Raw {
    uint2 data;
    uint8_t scale;
  };
  __device__ Raw unit(uint32_t r, uint32_t part) const {
    return {*reinterpret_cast<const uint2*>(data[r] + part * 8), scales[r][part]};
  }
  __device__ static void convert(const Raw& raw, uint32_t (&w)[8]) { nvfp4x16_to_f16(raw.data, raw.scale, w); }
};

// Sᵀ = K·Qᵀ for one tile, A from registers: the thread holds the two keys of `keys` (Fp8KeyPair
// or Nvfp4KeyPair) and converts their units 4i + j (exactly, to FP16) for the
// four k-steps of slab i, the next slab converted while they run: one commit group a slab with 16
// heads, two with 32 (fewer A registers in flight). N = 2·kAcc heads, Q's 64-column slabs kQSlab
// bytes apart.
template <uint32_t kAcc = 8, uint32_t kQSlab = kSlab16Bytes, class Keys>
__device__ void kq_tile_rs(float (&sacc)[kAcc], const Keys& keys, uint32_t j, uint64_t q) {
  constexpr uint32_t kStepsPerGroup = kAcc == 8 ? 4 : 2;  // a commit group's k-steps
  typename Keys::Raw r0 = keys.unit(0, j), r1 = keys.unit(1, j);
#pragma unroll
  for (uint32_t i = 0; i < kKUnits16; ++i) {
    uint32_t w0[8], w1[8];
    Keys::convert(r0, w0);
    Keys::convert(r1, w1);
    if (i + 1 < kKUnits16) r0 = keys.unit(0, 4 * (i + 1) + j), r1 = keys.unit(1, 4 * (i + 1) + j);
#pragma unroll
    for (uint32_t e = 0; e < 8; ++e) pin(w0[e]), pin(w1[e]);
    wgmma_fence();
#pragma unroll
    for (uint32_t t = 0; t < 4; ++t) {
      const uint32_t a[4] = {w0[2 * t], w1[2 * t], w0[2 * t + 1], w1[2 * t + 1]};
      wgmma_rs_heads(sacc, a, q + ((i * kQSlab + t * 32) >> 4), i + t != 0);
      if (t % kStepsPerGroup == kStepsPerGroup - 1) {
        wgmma_commit();
        wgmma_wait<1>();
      }
    }
  }
  wgmma_wait<0>();
}

// The key of column 2j + c%2 + 8·(c/2) (c = 0-3, j = lane%4: an A fragment's four columns) of
// k-step kk of Oᵀ = Vᵀ·Pᵀ, and the column of a key (P's columns in that order). With 16 heads in
// key order (key 16kk + 2j + c%2 + 8·(c/2)); with 32, key 16kk + j + 8·(c%2) + 4·(c/2), so that
// the four lanes of a quad read consecutive V rows — two bank groups apart, not one (V's rows
// are 576 bytes): 2-way bank conflicts rather than 4 — and keys k and k + 8 (k%16 < 8: the two
// rows of Sᵀ a thread holds) take columns 2m and 2m + 1, one 4-byte store of P.
template <uint32_t kAcc>
__device__ uint32_t pv_key(uint32_t kk, uint32_t c, uint32_t j) {
  return kAcc == 8 ? 16 * kk + 2 * j + c % 2 + 8 * (c / 2) : 16 * kk + j + 8 * (c % 2) + 4 * (c / 2);
}
template <uint32_t kAcc>
__device__ uint32_t pv_column(uint32_t key) {
  const uint32_t k = key % 16;
  return kAcc == 8 ? key : key - k + 2 * (k % 4) + k / 8 + 8 * (k / 4 % 2);
}

// One group of P·V's atoms of a k-step: `prefetch` (the next k-step's loads) issued first, then
// O[a] += F[a]·P for atoms [a0, a1) as one commit group, the group before it waited for.
template <uint32_t kAcc, class Prefetch>
__device__ void issue_atoms(float (&o)[kAtoms16][kAcc], const uint32_t (&f)[kAtoms16][4], uint32_t a0, uint32_t a1,
                            uint64_t p, const Prefetch& prefetch) {
  prefetch();
  wgmma_fence();
#pragma unroll
  for (uint32_t a = a0; a < a1; ++a) wgmma_rs_heads(o[a], f[a], p, 1);
  wgmma_commit();
  wgmma_wait<1>();
}

// Oᵀ += Vᵀ·Pᵀ for one tile, A from registers. Output rows are permuted like Q's columns: the
// thread of row group qrow = 8·warp + lane/4 holds, in atom a < 8, dims 16·qrow + 2a (its row
// r0) and + 1 (r0 + 8), and in atom 8 dims 512 + 2·qrow and + 1 — one unit and one pair of each
// key's V row. K-step kk gives it keys pv_key(kk, c, j), so each A register pairs one dim of two
// keys: a byte permute puts the two keys' codes of dims d and d + 1 side by side, and one
// conversion of each half gives the registers of both dims (two permutes an atom, one for each
// pair of keys, not four after converting). Keys from `live_keys` on are zeros (0·NaN would
// poison O). N = 2·kAcc heads (16 or 32).
template <uint32_t kAcc = 8>
__device__ void vp_tile_rs(float (&o)[kAtoms16][kAcc], const Fp8Rows& layout, const uint8_t* sv, uint32_t pitch,
                           uint32_t live_keys, uint32_t j, uint32_t qrow, uint64_t p) {
  uint4 raw[4];
  uint32_t pair[4];  // atom 8's two codes of each key, in the low half
  auto fetch = [&](uint32_t kk) {
#pragma unroll
    for (uint32_t c = 0; c < 4; ++c) {
      const uint32_t key = pv_key<kAcc>(kk, c, j);
      const uint8_t* row = sv + key * pitch;
      const bool live = key < live_keys;
      raw[c] = live ? layout.staged_half(row, qrow) : uint4{};
      pair[c] = live ? layout.staged_codes(row, 512 + 2 * qrow) : 0u;
    }
  };
  // The atoms in groups, converted and issued in turn, one commit group each (with 32 heads two:
  // the fragments of fewer atoms held at once, in flight and being converted).
  constexpr uint32_t kGroupEnds[3] = {kAcc == 8 ? kAtoms16 : 4, kAtoms16, kAtoms16};
  constexpr uint32_t kGroups = kAcc == 8 ? 1 : 2;
  fetch(0);
#pragma unroll
  for (uint32_t kk = 0; kk < kTileKeys / 16; ++kk) {
#pragma unroll
    for (uint32_t g = 0; g < kGroups; ++g) {
      const uint32_t a0 = g == 0 ? 0 : kGroupEnds[g - 1], a1 = kGroupEnds[g];
      uint32_t f[kAtoms16][4];
#pragma unroll
      for (uint32_t a = a0; a < a1; ++a) {
#pragma unroll
        for (uint32_t c = 0; c < 4; c += 2) {  // keys c and c + 1: A registers c (dim d) and c + 1 (d + 1)
          auto word = [&](uint32_t key) {
            const uint32_t words[4] = {raw[key].x, raw[key].y, raw[key].z, raw[key].w};
            return a == 8 ? pair[key] : words[a / 2];
          };
          // Bytes (key c: d, key c + 1: d, key c: d + 1, key c + 1: d + 1), d the atom's byte.
          const uint32_t both = __byte_perm(word(c), word(c + 1), a != 8 && a % 2 == 1 ? 0x7362 : 0x5140);
          f[a][c] = bits_of(e4m3x2_to_f16x2(both)), f[a][c + 1] = e4m3x2_hi_to_f16x2(both);
        }
#pragma unroll
        for (uint32_t e = 0; e < 4; ++e) pin(f[a][e]);
      }
      issue_atoms(o, f, a0, a1, p + ((kk * 32) >> 4), [&] {
        if (g + 1 == kGroups && kk + 1 < kTileKeys / 16) fetch(kk + 1);
      });
    }
  }
  wgmma_wait<0>();
}

// The E4M3 codes, each the value of an E2M1 code times 2^-6 (as in nvfp4x16_to_f16: s·ee·m becomes
// s·00ee·m00), of the low and of the high nibbles of the four bytes of `x`, byte for byte.
__device__ uint32_t e2m1_lo_as_e4m3(uint32_t x) { return ((x & 0x08080808u) << 4) | ((x & 0x07070707u) << 2); }
__device__ uint32_t e2m1_hi_as_e4m3(uint32_t x) { return (x & 0x80808080u) | ((x >> 2) & 0x1C1C1C1Cu); }
// Two E4M3 scale codes (of keys c and c + 1, the low and high byte) times 64, as an FP16 pair.
__device__ __half2 scale_pair(uint32_t lo, uint32_t hi) {
  return __hmul2(e4m3x2_to_f16x2(lo | hi << 8), __float2half2_rn(64.0f));
}
__device__ uint32_t scaled(uint32_t codes, __half2 scale) {
  return bits_of(__hmul2(*reinterpret_cast<const __half2*>(&codes), scale));
}

// Oᵀ += Vᵀ·Pᵀ for one tile over an NVFP4 cache, A from registers, in vp_tile_rs's layout (N =
// 2·kAcc heads, its key order and, with 32 heads, its two groups of atoms): in atom a < 8 the
// thread's dims 16·qrow + 2a and + 1 are the two codes of byte a of unit qrow of each key's V row
// (`sv`: 288 data bytes a row; `svs`: 36 scales), and in atom 8 dims 512 + 2·qrow and + 1 those of
// byte 256 + qrow, of unit 32 + qrow/8. A byte permute pairs keys c and c + 1 (bytes c: a,
// c + 1: a, c: a + 1, c + 1: a + 1), each nibble becomes the E4M3 code of its value times 2^-6,
// one conversion of each half gives a register of two keys, and one FP16 multiply by the two
// keys' scales times 64 restores them: exact, the values of e2m1_decode · e4m3_decode, as the
// port's. Keys from `live_keys` on are zeros.
template <uint32_t kAcc = 8>
__device__ void vp_tile_rs_nvfp4(float (&o)[kAtoms16][kAcc], const uint8_t* sv, const uint8_t* svs, uint32_t live_keys,
                                 uint32_t j, uint32_t qrow, uint64_t p) {
  constexpr uint32_t kData = kDim / 2, kScales = kDim / 16;  // a staged row's bytes
  uint2 raw[4];                                              // unit qrow of keys c = 0-3
  uint32_t unit_scale[4], byte8[4], scale8[4];               // its scale; atom 8's byte and scale
  auto fetch = [&](uint32_t kk) {
#pragma unroll
    for (uint32_t c = 0; c < 4; ++c) {
      const uint32_t key = pv_key<kAcc>(kk, c, j);
      const bool live = key < live_keys;
      const uint8_t *data = sv + key * kData, *scales = svs + key * kScales;
      raw[c] = live ? *reinterpret_cast<const uint2*>(data + 8 * qrow) : uint2{};
      unit_scale[c] = live ? scales[qrow] : 0u;
      byte8[c] = live ? data[256 + qrow] : 0u;
      scale8[c] = live ? scales[32 + qrow / 8] : 0u;
    }
  };
  // The atoms in groups (atoms 0-3 from the units' first words, 4-8 from the second and atom 8's
  // bytes), converted and issued in turn, one commit group each; with 16 heads one group.
  constexpr uint32_t kGroups = kAcc == 8 ? 1 : 2;
  fetch(0);
#pragma unroll
  for (uint32_t kk = 0; kk < kTileKeys / 16; ++kk) {
    __half2 s[2], s8[2];  // keys (0, 1) and (2, 3): their units' scales, atom 8's
#pragma unroll
    for (uint32_t c = 0; c < 4; c += 2)
      s[c / 2] = scale_pair(unit_scale[c], unit_scale[c + 1]), s8[c / 2] = scale_pair(scale8[c], scale8[c + 1]);
#pragma unroll
    for (uint32_t g = 0; g < kGroups; ++g) {
      const uint32_t a0 = kGroups == 1 ? 0 : 4 * g, a1 = kGroups == 1 || g == 1 ? kAtoms16 : 4;
      uint32_t f[kAtoms16][4];
#pragma unroll
      for (uint32_t c = 0; c < 4; c += 2) {  // keys c and c + 1: A registers c (dim d) and c + 1 (d + 1)
#pragma unroll
        for (uint32_t a = a0; a < a1 && a < 8; a += 2) {  // atoms a and a + 1: bytes a and a + 1 of the unit
          const uint32_t x = a < 4 ? raw[c].x : raw[c].y, y = a < 4 ? raw[c + 1].x : raw[c + 1].y;
          const uint32_t both = __byte_perm(x, y, a % 4 == 0 ? 0x5140 : 0x7362);
          const uint32_t lo = e2m1_lo_as_e4m3(both), hi = e2m1_hi_as_e4m3(both);
          f[a][c] = scaled(bits_of(e4m3x2_to_f16x2(lo)), s[c / 2]);
          f[a][c + 1] = scaled(bits_of(e4m3x2_to_f16x2(hi)), s[c / 2]);
          f[a + 1][c] = scaled(e4m3x2_hi_to_f16x2(lo), s[c / 2]);
          f[a + 1][c + 1] = scaled(e4m3x2_hi_to_f16x2(hi), s[c / 2]);
        }
        if (a1 == kAtoms16) {
          const uint32_t both8 = byte8[c] | byte8[c + 1] << 8;
          f[8][c] = scaled(bits_of(e4m3x2_to_f16x2(e2m1_lo_as_e4m3(both8))), s8[c / 2]);
          f[8][c + 1] = scaled(bits_of(e4m3x2_to_f16x2(e2m1_hi_as_e4m3(both8))), s8[c / 2]);
        }
      }
#pragma unroll
      for (uint32_t a = a0; a < a1; ++a)
#pragma unroll
        for (uint32_t e = 0; e < 4; ++e) pin(f[a][e]);
      issue_atoms(o, f, a0, a1, p + ((kk * 32) >> 4), [&] {
        if (g + 1 == kGroups && kk + 1 < kTileKeys / 16) fetch(kk + 1);
      });
    }
  }
  wgmma_wait<0>();
}

// mbarriers and the bulk copy engine (sm_90): a barrier of `count` arrivals whose phase also waits
// for the bytes announced by expect_tx to land; a copy of `bytes` (a multiple of 16, both ends
// 16-byte aligned) from global to shared memory that counts them off at barrier `bar`.
__device__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Wait until phase `parity` (0 or 1) of the barrier has completed.
__device__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// One arrival at barrier `bar` once every cp.async this thread issued before has landed (the
// barrier's count includes it: noinc).
__device__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// The raw half-tiles of a 16-head block: half h (0 K, 1 V) of a tile's keys staged into slot
// h (64 rows, unpadded: FP8 rows of dim codes, NVFP4 rows of dim/2 data bytes) whole by the bulk
// copy engine — thread t stages half t / 64 of key t % 64 — and thread 0 or 64 announces the
// half's bytes at the slot's mbarrier. NVFP4 rows' scales (dim/16 bytes, 4-byte aligned: no
// bulk copy) go to `scale_slot[h]` by cp.async, 4 bytes at a time, each of the half's 64 threads
// then arriving at the mbarrier once its copies land (an NVFP4 slot's barrier counts 1 + 64
// arrivals). Each thread's rows are looked up a call ahead; keys past the chunk's end are not
// copied (their slot rows keep older bytes). Unpadded rows cost V's reads bank conflicts
// (vp_tile_rs: a quarter warp reads 32 bytes of each of four keys two apart, 288 words apart:
// 4-way); padding them to 592 bytes, which avoids that, took a copy per V row, and measured 12%
// slower (docs/performance.md).
// With kStages > 1 each half has that many slots, kTileKeys rows apart (scale rows likewise), slot
// b's mbarriers at bars + 2b (the block's i-th tile in slot i % kStages).
template <uint32_t kStages = 1, class Rows = Fp8Rows>
struct HalfFeed {
  static constexpr bool kNvfp4 = std::is_same_v<Rows, Nvfp4Rows>;
  __device__ static constexpr uint32_t arrivals() { return kNvfp4 ? 1 + kTileKeys : 1; }  // a slot's mbarrier count
  const Rows& layout;
  uint8_t* slot[2];
  uint64_t* bars;
  uint32_t end;
  const uint8_t* rows[4] = {};
  uint8_t* scale_slot[2] = {};  // NVFP4

  __device__ void locate(uint32_t tile) {
    const uint32_t k = threadIdx.x % kTileKeys;
    if (tile + k < end) layout.locate(tile + k, layout.entry(tile + k), rows);
    if constexpr (kStages > 1) {  // its half's only
      const bool v = threadIdx.x / kTileKeys % 2 != 0;
      rows[0] = v ? rows[2] : rows[0];
      if constexpr (kNvfp4) rows[1] = v ? rows[3] : rows[1];
    }
  }
  // Start half h of the tile located last (whose slot every thread is done reading). Keys whose
  // rows follow each other in the cache (a page's rows at a pitch of the row's bytes) go as one
  // copy, issued by the run's first key; runs end at a warp's last key. (A copy per row had
  // spent 16% of the warps' time in the loop that issues the copies lane by lane.)
  __device__ void stage(uint32_t tile, uint32_t h, uint32_t b = 0) {
    const uint32_t k = threadIdx.x % kTileKeys, lane = threadIdx.x % kWarp;
    const uint32_t pitch = kNvfp4 ? layout.dim / 2 : layout.dim;
    if (threadIdx.x / kTileKeys != h) return;  // whole warps
    uint64_t* const bar = bars + 2 * b + h;
    if (k == 0 && tile < end) mbar_expect_tx(bar, min(kTileKeys, end - tile) * pitch);
    const bool live = tile + k < end;  // the live keys are a prefix
    const uint8_t* src = rows[kStages > 1 ? 0 : 2 * h];
    const auto before =
        reinterpret_cast<const uint8_t*>(__shfl_up_sync(0xFFFFFFFFu, reinterpret_cast<unsigned long long>(src), 1));
    const bool starts_run = live && (lane == 0 || src != before + pitch);
    const uint32_t starts = __ballot_sync(0xFFFFFFFFu, starts_run), lives = __ballot_sync(0xFFFFFFFFu, live);
    if (starts_run) {
      const uint32_t later = starts >> lane >> 1;  // the run ends at the next start or the last live key
      const uint32_t n = later != 0 ? __ffs(later) : __popc(lives) - lane;
      fence_to_async_proxy();  // the slot's earlier reads before the engine's writes
      bulk_copy(slot[h] + (b * kTileKeys + k) * pitch, src, n * pitch, bar);
    }
    if constexpr (kNvfp4) {
      if (tile < end) {
        const uint32_t bytes = layout.dim / 16;
        if (live)
          for (uint32_t w = 0; w < bytes / 4; ++w)
            cp_async4(scale_slot[h] + (b * kTileKeys + k) * bytes + 4 * w, rows[kStages > 1 ? 1 : 2 * h + 1] + 4 * w);
        cp_async_arrive(bar);
      }
    }
  }
  // Start both halves of the tile located last into slot b, or only K's where V = K (one latent
  // pool, whose K rows P·V reads for V).
  __device__ void stage_tile(uint32_t tile, uint32_t b, bool k_only) {
    stage(tile, 0, b);
    if (!k_only) stage(tile, 1, b);
  }
  // Wait until half h of the block's i-th tile has landed (the mbarrier's completion makes the
  // engine's writes visible to each thread that observes it).
  __device__ void wait(uint32_t h, uint32_t i) const { mbar_wait(bars + 2 * (i % kStages) + h, (i / kStages) % 2); }
};

// Where wgmma16_rs_decode's block leaves its partial (unnormalised O, running max and sum of
// each of its heads): for mla_paged_decode_combine in o_partial and ml_partial (PartialOut), or
// in its own shared memory for the combine of its cluster (ClusterOut, cluster_combine).
struct PartialOut {
  static constexpr bool cluster = false;
  float* o_partial;
  float* ml_partial;
  __device__ float* row(uint64_t slot, float*, uint32_t) const { return o_partial + slot * kDim; }
  __device__ float* ml(uint64_t slot, float*, uint32_t) const { return ml_partial + 2 * slot; }
  __device__ bool vector_stores() const { return reinterpret_cast<uintptr_t>(o_partial) % 16 == 0; }
};
struct ClusterOut {
  static constexpr bool cluster = true;
  const float* sinks;  // [num_q_heads] or null
  __nv_bfloat16* o;    // [num_seqs, num_q_heads, 576], 8-byte aligned
  float v_scale;
  __device__ float* row(uint64_t, float* rows, uint32_t hl) const { return rows + hl * kDim; }
  __device__ float* ml(uint64_t, float* mls, uint32_t hl) const { return mls + 2 * hl; }
  __device__ bool vector_stores() const { return true; }
};
constexpr uint32_t kMaxClusterSplits = 8;  // the portable cluster size

// Wall-clock stamps (%globaltimer, ns) of a 16-head block's phases, thread 0's, per block into
// g_step_trace (bench/step_trace.cu prints them): a diagnostic build, -DMETRALE_STEP_TRACE;
// otherwise nothing. Marks: 0 the block starts, 1 Q stored (the first tile on its way), 2 the first
// K landed, 3 the walk done, 4 the partial written, 5 the cluster's first barrier passed, 6 the
// combine's sums written, 7 the block ends. Column kStepMarks holds the block's SM.
#ifdef METRALE_STEP_TRACE
constexpr uint32_t kStepMarks = 8, kStepTraceBlocks = 16384;
__device__ unsigned long long g_step_trace[kStepTraceBlocks][kStepMarks + 1];
__device__ void step_mark(uint32_t k) {
  const uint32_t b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x != 0 || b >= kStepTraceBlocks) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_step_trace[b][k] = t;
  if (k == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_step_trace[b][kStepMarks] = sm;
  }
}
#else
__device__ void step_mark(uint32_t) {}
#endif

// cluster_combine's sums for dims [d_begin, d_end) of one head, four a step from 4·part, over
// exactly kN chunks (peer[c]: chunk c's row, w[c] its weight): the chunks summed by residue mod 4,
// each term rounded on its own (combine_term), the four sums added in order and scaled by inv.
// Unrolled for each kN, so that a step issues only its chunks' loads and terms.
template <uint32_t kN, uint32_t kParts>
__device__ void cluster_sum(const float* const (&peer)[kMaxClusterSplits], const float (&w)[kMaxClusterSplits],
                            float inv, __nv_bfloat16* dst, uint32_t d_begin, uint32_t d_end, uint32_t part) {
  for (uint32_t d = d_begin + 4 * part; d < d_end; d += 4 * kParts) {
    float acc[4][4] = {};  // [residue mod 4][dim]
#pragma unroll
    for (uint32_t c = 0; c < kN; ++c) {
      const float4 v = *reinterpret_cast<const float4*>(peer[c] + d);
      acc[c % 4][0] += combine_term(w[c], v.x), acc[c % 4][1] += combine_term(w[c], v.y);
      acc[c % 4][2] += combine_term(w[c], v.z), acc[c % 4][3] += combine_term(w[c], v.w);
    }
    float total[4];
#pragma unroll
    for (uint32_t e = 0; e < 4; ++e) total[e] = (((acc[0][e] + acc[1][e]) + acc[2][e]) + acc[3][e]) * inv;
    const __nv_bfloat162 lo = __floats2bfloat162_rn(total[0], total[1]), hi = __floats2bfloat162_rn(total[2], total[3]);
    *reinterpret_cast<uint2*>(dst + d) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

// The combine inside a cluster (ClusterOut): the n = num_splits ≤ 8 blocks of one (sequence,
// head group) are one cluster, each holding its chunk's partial rows [kHeads][576] and (max, sum)
// [kHeads][2] in shared memory. Block z finishes dims [z·w, (z + 1)·w), w = 4·⌈576 / 4n⌉, of the
// group's heads, kThreads / kHeads threads a head (8 of the 16-head block's 128, 4 of the 64-head
// block's 256, 2 of the heads-in-M block's warpgroup 0, whose other warpgroup meanwhile runs
// cluster_combine_bystander) and four dims a thread, reading every block's rows through
// distributed shared memory, with the combine's arithmetic (chunk_weights, cluster_sum): the bits
// of mla_paged_decode_combine.
template <uint32_t kHeads, uint32_t kThreads>
__device__ void cluster_combine(const ClusterOut& out, const float* rows, const float* mls, uint32_t s, uint32_t head0,
                                uint32_t num_q_heads, uint32_t z, uint32_t n) {
  namespace cg = cooperative_groups;
  constexpr uint32_t kParts = kThreads / kHeads;
  const cg::cluster_group cluster = cg::this_cluster();
  metrale::allow_next_kernel();  // every block of the grid is past its keys: the next may start
  cluster.sync();                // every block's partial written, and seen
  step_mark(5);
  const uint32_t hl = threadIdx.x / kParts, part = threadIdx.x % kParts, h = head0 + hl;
  const uint32_t width = 4 * ((kDim + 4 * n - 1) / (4 * n));
  const uint32_t d_begin = min(kDim, z * width), d_end = min(kDim, d_begin + width);
  if (h < num_q_heads) {
    const float* peer[kMaxClusterSplits];
    float m[kMaxClusterSplits], l[kMaxClusterSplits], w[kMaxClusterSplits];
#pragma unroll
    for (uint32_t c = 0; c < kMaxClusterSplits; ++c) {
      peer[c] = cluster.map_shared_rank(rows, c < n ? c : 0) + hl * kDim;
      const float* const ml = cluster.map_shared_rank(mls, c < n ? c : 0) + 2 * hl;
      m[c] = c < n ? ml[0] : 0.0f;
      l[c] = c < n ? ml[1] : 0.0f;
    }
    const float inv = chunk_weights(m, l, n, out.sinks != nullptr ? out.sinks + h : nullptr, out.v_scale, w);
    __nv_bfloat16* const dst = out.o + (uint64_t{s} * num_q_heads + h) * kDim;
    switch (n) {  // the launcher's num_splits: 1 to 8
      case 1: cluster_sum<1, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      case 2: cluster_sum<2, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      case 3: cluster_sum<3, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      case 4: cluster_sum<4, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      case 5: cluster_sum<5, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      case 6: cluster_sum<6, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      case 7: cluster_sum<7, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
      default: cluster_sum<8, kParts>(peer, w, inv, dst, d_begin, d_end, part); break;
    }
  }
  step_mark(6);
  cluster.sync();  // every block's rows stay until the cluster has read them
  step_mark(7);
}
// cluster_combine's part for the threads of a block past its first kThreads: the cluster's two
// barriers, reading nothing.
__device__ void cluster_combine_bystander() {
  metrale::allow_next_kernel();
  cooperative_groups::this_cluster().sync();  // every block's partial written
  cooperative_groups::this_cluster().sync();  // every block's rows read
}

// The split decode of one 16-head block (the memory-bound rows: a 64-row wgmma
// of heads would be three quarters zeros): one warpgroup, transposed products with A from
// registers, two blocks per SM. Sᵀ = K·Qᵀ puts the tile's 64 keys in M and the 16 heads in N;
// Oᵀ = Vᵀ·Pᵀ the output dims in M. The raw K and V half-tiles are staged by the bulk copy engine
// (HalfFeed) into a slot each and read from there by the threads whose fragments hold them,
// converted in registers — no FP16 copy in shared memory. A tile's V streams in under its Q·Kᵀ
// and softmax, the next tile's K under its softmax and P·V. In the accumulator layout a thread
// holds keys (or rows of an atom) r0 and r0 + 8 of its warp's 16, and heads
// 8·(e/4) + 2·(lane%4) + e%2 (tile_softmax16). Four barriers a tile. Over one latent pool (FP8,
// Fp8Rows::v_is_k) a key's one row serves both products, and the K and V slots take turns as a
// ring of two tiles: three barriers a tile. `Rows`: Fp8Rows, or Nvfp4Rows (its rows' scales staged
// beside them; PartialOut only).
template <class Out, class Rows>
__device__ void wgmma16_rs_decode(const __nv_bfloat16* q, const Out& out, uint32_t num_q_heads, float logit_scale,
                                  uint32_t keys_per_split, const Rows& layout) {
  constexpr bool kNvfp4 = std::is_same_v<Rows, Nvfp4Rows>;
  static_assert(!(kNvfp4 && Out::cluster), "the NVFP4 slots do not hold a cluster's partial rows");
  constexpr uint32_t dim = kDim, q_head_dim = kDim;
  constexpr uint32_t pitch = kNvfp4 ? dim / 2 : dim;       // of the staged rows, K's and V's (NVFP4: their data)
  constexpr uint32_t scale_pitch = kNvfp4 ? dim / 16 : 0;  // NVFP4: of their scales
  const KeySet& keys = layout.keys;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The carve-up (wgmma_shared_bytes): Q (permuted) and P in swizzled slabs; the raw K and V
  // half-tiles (NVFP4: then their scales); the Q rows' unscale factors and the per-warp maxima
  // (then sums).
  uint8_t* const sq = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  uint8_t* const sp = sq + kRows16 * dim * 2;  // [16 heads][64 keys] FP16
  uint8_t* const sk = sp + kSlab16Bytes;
  uint8_t* const sv = sk + kTileKeys * pitch;
  uint8_t* const sk_scales = sv + kTileKeys * pitch;
  uint8_t* const sv_scales = sk_scales + kTileKeys * scale_pitch;
  float* const q_unscale = reinterpret_cast<float*>(sv_scales + kTileKeys * scale_pitch);
  float* const red = q_unscale + kRows16;                                 // [warp][16 heads]
  uint64_t* const bars = reinterpret_cast<uint64_t*>(red + 4 * kRows16);  // the K and V slots' mbarriers

  const uint32_t tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, j = lane % 4;
  const uint32_t z = blockIdx.x, head0 = blockIdx.y * kRows16, s = blockIdx.z, num_splits = gridDim.x;
  const Chunk chunk = chunk_of(keys, z, keys_per_split);
  const uint32_t begin = chunk.begin, end = chunk.end;

  using Feed = HalfFeed<1, Rows>;
  step_mark(0);
  if (tid == 0) mbar_init(bars, Feed::arrivals()), mbar_init(bars + 1, Feed::arrivals()), fence_mbar_init();
  __syncthreads();  // the mbarriers ready before any copy counts off at them
  // One latent pool as both caches (FP8): a key's one row serves Q·Kᵀ and P·V, and the two slots
  // take turns — tile i in slot i % 2, the next tile's rows copied while this one is worked.
  bool latent = false;
  if constexpr (!kNvfp4) latent = layout.v_is_k();
  // The first tile's K and V (latent: its rows) on their way, then Q.
  Feed feed{layout, {sk, sv}, bars, end, {}, {sk_scales, sv_scales}};
  feed.locate(begin);
  feed.stage_tile(begin, 0, latent);
  load_q_rows_with<kQUnits, kRows16 / 4>(  // four rows a warp, loaded together
      q, s, head0, kRows16, num_q_heads, q_head_dim, q_unscale,
      [&](uint32_t row, uint32_t part, const uint32_t(&w)[4]) { store_q_permuted(sq, row, part, w); });
  fence_to_async_proxy();
  __syncthreads();
  step_mark(1);

  const uint32_t r0 = 16 * warp + lane / 4, qrow = 8 * warp + lane / 4;
  auto head_of = [&](uint32_t jj) { return head16_of(jj, lane); };
  float q_down[4];
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) q_down[jj] = logit_factor(q_unscale[head_of(jj)], logit_scale);
  const uint64_t q_desc = smem_desc(smem_addr(sq), 16, 1024), p_desc = smem_desc(smem_addr(sp), 16, 1024);
  float o[kAtoms16][8] = {};
  float m[4], l[4];  // l: this thread's keys' share of the sum
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) m[jj] = -INFINITY, l[jj] = 0.0f;
  if constexpr (!kNvfp4) {
    // Slot h's n-th tile is the block's tile 2n + h: its mbarrier's phase n % 2. The other slot,
    // whose last reader was the tile before (P·V), is free once every thread is past the barrier;
    // a V half (HalfFeed::stage(·, 1)) copies V rows, here the K rows themselves.
    for (uint32_t tile = begin, i = 0; latent && tile < end; tile += kTileKeys, ++i) {
      const uint32_t h = i % 2;
      uint8_t* const rows = h == 0 ? sk : sv;
      mbar_wait(bars + h, (i / 2) % 2);
      __syncthreads();  // this tile's rows everywhere, the other slot read everywhere
      if (i == 0) step_mark(2);
      feed.locate(tile + kTileKeys);
      if (h == 0) {  // constant halves: an index the compiler cannot see would put the feed on the stack
        feed.stage(tile + kTileKeys, 1);
      } else {
        feed.stage(tile + kTileKeys, 0);
      }
      float sacc[8];
      kq_tile_rs(sacc, Fp8KeyPair{{rows + r0 * pitch, rows + (r0 + 8) * pitch}}, j, q_desc);
      tile_softmax16(sacc, m, l, o, q_down, tile, end, r0, warp, lane, red, sp, [] {
        __syncthreads();  // the maxima written
      });
      fence_to_async_proxy();  // P, for the tensor cores
      __syncthreads();         // P everywhere, the maxima read
      vp_tile_rs(o, layout, rows, pitch, end - tile, j, qrow, p_desc);
    }
  }
  for (uint32_t tile = begin, i = 0; !latent && tile < end; tile += kTileKeys, ++i) {
    feed.wait(0, i);
    __syncthreads();  // this tile's K everywhere
    if (i == 0) step_mark(2);
    feed.locate(tile + kTileKeys);
    float sacc[8];
    if constexpr (kNvfp4) {
      kq_tile_rs(sacc,
                 Nvfp4KeyPair{{sk + r0 * pitch, sk + (r0 + 8) * pitch},
                              {sk_scales + r0 * scale_pitch, sk_scales + (r0 + 8) * scale_pitch}},
                 j, q_desc);
    } else {
      kq_tile_rs(sacc, Fp8KeyPair{{sk + r0 * pitch, sk + (r0 + 8) * pitch}}, j, q_desc);
    }
    tile_softmax16(sacc, m, l, o, q_down, tile, end, r0, warp, lane, red, sp, [&] {
      __syncthreads();  // the maxima written, the K half-tile read everywhere
      feed.stage(tile + kTileKeys, 0);
    });
    fence_to_async_proxy();  // P, for the tensor cores
    feed.wait(1, i);
    __syncthreads();  // P and this tile's V everywhere, the maxima read
    if constexpr (kNvfp4) {
      vp_tile_rs_nvfp4(o, sv, sv_scales, end - tile, j, qrow, p_desc);
    } else {
      vp_tile_rs(o, layout, sv, pitch, end - tile, j, qrow, p_desc);
    }
    __syncthreads();  // the V half-tile and P read everywhere
    feed.stage(tile + kTileKeys, 1);
  }
  cp_async_wait_all();
  step_mark(3);
  // The sums over the block's keys: lanes of one lane%4, then the four warps in order.
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) {
    for (uint32_t off = 4; off < kWarp; off *= 2) l[jj] += __shfl_xor_sync(0xFFFFFFFFu, l[jj], off);
    if (lane < 4) red[warp * kRows16 + head_of(jj)] = l[jj];
  }
  __syncthreads();
  // The block's partial: unnormalised O with its running max and sum, per head; the thread's
  // rows r0 and r0 + 8 of atom a are the adjacent dims of its row group (see vp_tile_rs), two
  // atoms' four dims a 16-byte store where the rows allow (o_partial's launcher asks 8 bytes).
  // PartialOut writes it to o_partial and ml_partial for the combine; ClusterOut to this block's
  // free K and V slots, for the cluster's combine.
  float* const cluster_rows = reinterpret_cast<float*>(sk);  // [16 heads][dim]: the K slot's bytes
  float* const cluster_ml = reinterpret_cast<float*>(sv);    // [16 heads][2]
  const bool vector_stores = out.vector_stores();
#pragma unroll
  for (uint32_t jj = 0; jj < 4; ++jj) {
    const uint32_t hl = head_of(jj), h = head0 + hl;
    if (h >= num_q_heads) continue;
    const uint64_t slot = (uint64_t{s} * num_q_heads + h) * num_splits + z;
    float* const row = out.row(slot, cluster_rows, hl);
    const uint32_t e0 = 4 * (jj / 2) + jj % 2;  // row r0's element; r0 + 8's is e0 + 2
    if (vector_stores) {                        // atoms 2b and 2b + 1: dims 16·qrow + 4b .. + 3, one 16-byte store
#pragma unroll
      for (uint32_t b = 0; b < 4; ++b)
        *reinterpret_cast<float4*>(row + 16 * qrow + 4 * b) =
            make_float4(o[2 * b][e0], o[2 * b][e0 + 2], o[2 * b + 1][e0], o[2 * b + 1][e0 + 2]);
    } else {
#pragma unroll
      for (uint32_t a = 0; a < 8; ++a)
        *reinterpret_cast<float2*>(row + 16 * qrow + 2 * a) = make_float2(o[a][e0], o[a][e0 + 2]);
    }
    *reinterpret_cast<float2*>(row + 512 + 2 * qrow) = make_float2(o[8][e0], o[8][e0 + 2]);
    if (warp == 0 && lane < 4) {
      float* const ml = out.ml(slot, cluster_ml, hl);
      ml[0] = m[jj];
      ml[1] = (red[hl] + red[kRows16 + hl]) + (red[2 * kRows16 + hl] + red[3 * kRows16 + hl]);
    }
  }
  step_mark(4);
  if constexpr (Out::cluster)
    cluster_combine<kRows16, 128>(out, cluster_rows, cluster_ml, s, head0, num_q_heads, z, num_splits);
}

// ---- Warp-specialised (both formats)

// Named barriers of the 16-head blocks (0 is __syncthreads): the producers arrive at a
// buffer's `full` barrier and the consumer waits there; the consumer arrives at `empty` and the
// producers wait. kSoftmaxBar is the consumer warpgroup's own.
enum : uint32_t { kKFull = 1, kKEmpty = 2, kVFull = 3, kVEmpty = 4, kSoftmaxBar = 5 };
template <uint32_t kId, uint32_t kThreads>
__device__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <uint32_t kId, uint32_t kThreads>
__device__ void bar_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
// A named barrier's id as an argument that stays a constant (bar_sync<id, …> inside a lambda).
template <uint32_t kId>
using Bar16 = std::integral_constant<uint32_t, kId>;

constexpr uint32_t kThreads16 = 384;  // warpgroup 0 the consumer, 1-2 the producers
constexpr uint32_t kProducers = 256;
constexpr uint32_t kUnitsPerProducer = kDim / 16 * kTileKeys / kProducers;  // 16-value units of a half-tile

// Issue Sᵀ = K·Qᵀ over the whole contraction (36 k-steps of 16 dims; A: the K tile's slabs from
// descriptor `k`, B: Q's from `q`), one commit group.
__device__ void kq_tile_ss(float (&sacc)[8], uint32_t k, uint32_t q) {
  wgmma_fence();
#pragma unroll
  for (uint32_t s = 0; s < kDim / 16; ++s) {
    const uint32_t within = (s % 4) * 32;
    wgmma_ss_m64n16k16<0>(sacc, k + (((s / 4) * kSlabBytes + within) >> 4),
                          q + (((s / 4) * kSlab16Bytes + within) >> 4), s != 0);
  }
  wgmma_commit();
}

// Issue Oᵀ += Vᵀ·Pᵀ for one tile: the nine 64-dim atoms of V (MN-major, descriptor `v`), four
// k-steps of 16 keys, P K-major from descriptor `p`; one commit group.
__device__ void vp_tile_ss(float (&o)[kAtoms16][8], uint32_t v, uint32_t p) {
  wgmma_fence();
#pragma unroll
  for (uint32_t kk = 0; kk < kTileKeys / 16; ++kk) {
#pragma unroll
    for (uint32_t a = 0; a < kAtoms16; ++a)
      wgmma_ss_m64n16k16<1>(o[a], v + ((a * kSlabBytes + kk * 16 * 128) >> 4), p + ((kk * 32) >> 4), 1);
  }
  wgmma_commit();
}

// A producer's share of a half-tile: key `key` of the tile, its units part, part + 4, ... (four
// producers per key: a warp reads eight rows, 64 contiguous bytes of each at a time), loaded
// straight from the cache into registers (zeros past the chunk's end).
template <class Rows>
struct HalfTile {
  typename Rows::Raw raw[kUnitsPerProducer];
  __device__ void load(const Rows& layout, const uint8_t* const* rows, bool live, uint32_t first, uint32_t h) {
#pragma unroll
    for (uint32_t i = 0; i < kUnitsPerProducer; ++i)
      raw[i] = live ? layout.load(rows, first + 4 * i, h) : typename Rows::Raw{};
  }
  // As FP16 into the swizzled tile at `dst` (exact), then visible to the tensor cores.
  __device__ void store(const Rows& layout, uint8_t* dst, uint32_t key, uint32_t first) const {
#pragma unroll
    for (uint32_t i = 0; i < kUnitsPerProducer; ++i) store_unit(layout, raw[i], dst, key, first + 4 * i);
    fence_to_async_proxy();
  }
};

// The split decode of one 16-head block (the memory-bound rows: a 64-row wgmma of heads would be
// three quarters zeros), warp-specialised and transposed. Warpgroups 1-2 are producers: each
// thread loads its units of a tile's K and V straight from the cache into registers, one
// half-tile ahead, and dequantises them (exactly, to FP16) into the K or the V buffer once the
// consumer has freed it. Warpgroup 0 is the consumer: Sᵀ = K·Qᵀ puts the tile's 64 keys in M
// and the 16 heads in N, the online softmax, P (FP16) to a 16 × 64 slab, and Oᵀ = Vᵀ·Pᵀ with the
// output dims in M — so the next tile's K is dequantised under this tile's P·V, and this tile's
// V under its Q·Kᵀ and softmax. In the accumulator layout a thread holds keys (or dims of an
// atom) r0 and r0 + 8 of its warp's 16, and heads 8·(e/4) + 2·(lane%4) + e%2: the max over a
// tile's keys takes three lane shuffles and an exchange between the four warps; each thread
// keeps partial sums of its heads (the same rescaling everywhere), added up at the end.
// Over one latent pool (Rows::v_is_k) a tile's K is its V: the producers convert each tile once,
// into the K and the V buffer by turns, with the raw rows of the next two in registers, and the
// consumer runs both products on the buffer that holds the tile. Both sides take the even tile
// and then the odd one in each turn of their loops, so a step's buffer and barriers are constants.
template <class Rows>
__device__ void wgmma16_producers_decode(const __nv_bfloat16* q, float* o_partial, float* ml_partial,
                                         uint32_t num_q_heads, float logit_scale, uint32_t keys_per_split,
                                         const Rows& layout) {
  constexpr uint32_t dim = kDim, q_head_dim = kDim;
  const KeySet& keys = layout.keys;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The carve-up (wgmma_shared_bytes): Q, the K and the V tile, and P in swizzled slabs; the Q
  // rows' unscale factors and the consumer's per-warp maxima (then sums).
  uint8_t* const sq = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  uint8_t* const sk = sq + kRows16 * dim * 2;
  uint8_t* const sv = sk + kTileKeys * dim * 2;
  uint8_t* const sp = sv + kTileKeys * dim * 2;  // [16 heads][64 keys] FP16
  float* const q_unscale = reinterpret_cast<float*>(sp + kSlab16Bytes);
  float* const red = q_unscale + kRows16;  // [warp][16 heads]

  // The warp through a shuffle, so that the compiler knows the roles' branch warp-uniform (the
  // consumer's descriptors then stay in uniform registers).
  const uint32_t tid = threadIdx.x, lane = tid % kWarp, warp = __shfl_sync(0xFFFFFFFFu, tid / kWarp, 0);
  const uint32_t z = blockIdx.x, head0 = blockIdx.y * kRows16, s = blockIdx.z, num_splits = gridDim.x;
  const Chunk chunk = chunk_of(keys, z, keys_per_split);
  const uint32_t begin = chunk.begin, end = chunk.end;
  const bool latent = layout.v_is_k();  // one latent pool: each tile converted once, serving as K and V

  load_q_rows<kQUnits>(q, s, head0, kRows16, num_q_heads, q_head_dim, q_unscale,
                       [&](uint32_t row, uint32_t part) { return sq + swizzled16(row, part); });
  fence_to_async_proxy();
  __syncthreads();

  if (warp >= 4) {  // ---- producers
    const uint32_t p = tid - 128, key = p / 4, first = p % 4;
    const uint8_t* rows[4];
    // The rows of the thread's key in `tile` into `into` (the loads' `rows`, or the prefetch's), if the
    // chunk has that key.
    auto locate = [&](uint32_t tile, const uint8_t** into) {
      const bool live = tile + key < end;
      if (live) layout.locate(tile + key, layout.entry(tile + key), into);
      return live;
    };
    if (latent) {  // tile i into the K buffer (i even) or the V buffer (i odd), the next two in registers
      // The rows of a tile asked into L2 ahead of their loads — in the loop two tiles before them,
      // at the start the third and fourth tiles' a conversion before theirs: the loads two ahead
      // waited on memory (ncu: a third of the producers' stall samples; docs/performance.md,
      // "Forty-first session").
      auto prefetch = [&](uint32_t tile) {
        const uint8_t* later[4];
        if (locate(tile, later)) layout.prefetch(later, first, 0);
      };
      HalfTile<Rows> even, odd;
      even.load(layout, rows, locate(begin, rows), first, 0);
      if (begin + kTileKeys < end) odd.load(layout, rows, locate(begin + kTileKeys, rows), first, 0);
      prefetch(begin + 2 * kTileKeys);
      prefetch(begin + 3 * kTileKeys);
      // Tile `tile` from `half` into `buffer` (whose barriers are `full` and `empty`), then the raw
      // rows of the tile two ahead into `half`, and the tile four ahead into L2.
      auto convert = [&](HalfTile<Rows>& half, uint8_t* buffer, auto full, auto empty, uint32_t tile) {
        if (tile - begin >= 2 * kTileKeys) bar_sync<empty, kThreads16>();  // the consumer's P·V of the tile two back
        half.store(layout, buffer, key, first);
        bar_arrive<full, kThreads16>();
        const uint32_t ahead = tile + 2 * kTileKeys;
        if (ahead < end) half.load(layout, rows, locate(ahead, rows), first, 0);
        prefetch(tile + 4 * kTileKeys);
      };
      for (uint32_t tile = begin; tile < end; tile += 2 * kTileKeys) {
        convert(even, sk, Bar16<kKFull>{}, Bar16<kKEmpty>{}, tile);
        if (tile + kTileKeys < end) convert(odd, sv, Bar16<kVFull>{}, Bar16<kVEmpty>{}, tile + kTileKeys);
      }
      return;
    }
    HalfTile<Rows> kt, vt;
    bool live = locate(begin, rows);
    kt.load(layout, rows, live, first, 0);
    vt.load(layout, rows, live, first, 1);
    for (uint32_t tile = begin; tile < end; tile += kTileKeys) {
      const bool more = tile + kTileKeys < end;
      live = more && locate(tile + kTileKeys, rows);
      if (tile != begin) bar_sync<kKEmpty, kThreads16>();  // the consumer's Q·Kᵀ of the last tile is done
      kt.store(layout, sk, key, first);
      bar_arrive<kKFull, kThreads16>();
      if (more) kt.load(layout, rows, live, first, 0);
      if (tile != begin) bar_sync<kVEmpty, kThreads16>();  // and its P·V
      vt.store(layout, sv, key, first);
      bar_arrive<kVFull, kThreads16>();
      if (more) vt.load(layout, rows, live, first, 1);
    }
    return;
  }

  // ---- the consumer (warpgroup 0)
  const uint32_t r0 = 16 * warp + lane / 4;  // the thread's keys (and dims of an atom) r0, r0 + 8
  auto head_of = [&](uint32_t j) { return head16_of(j, lane); };
  float q_down[4];
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) q_down[j] = logit_factor(q_unscale[head_of(j)], logit_scale);
  const uint32_t q_desc = smem_desc_low(smem_addr(sq), 16), k_desc = smem_desc_low(smem_addr(sk), 16);
  const uint32_t v_desc = smem_desc_low(smem_addr(sv), kSlabBytes), p_desc = smem_desc_low(smem_addr(sp), 16);
  // Over one latent pool tile i is in the K buffer (i even) or the V buffer (i odd), read there by
  // both products: the V buffer's tiles as K (K-major) and the K buffer's as V (MN-major) too.
  const uint32_t k_desc_in_v = smem_desc_low(smem_addr(sv), 16), v_desc_in_k = smem_desc_low(smem_addr(sk), kSlabBytes);
  float o[kAtoms16][8] = {};
  float m[4], l[4];  // l: this thread's keys' share of the sum
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) m[j] = -INFINITY, l[j] = 0.0f;
  // One tile's two products. kSeparate: K and V from their own buffers; kLatentInK / kLatentInV:
  // one latent pool's tile in the K buffer (even tiles) or the V buffer (odd), read by both.
  enum : uint32_t { kSeparate, kLatentInK, kLatentInV };
  auto step = [&](auto mode_c, uint32_t tile) {
    constexpr uint32_t mode = decltype(mode_c)::value;
    constexpr bool separate = mode == kSeparate, in_v = mode == kLatentInV;
    const bool more = tile + kTileKeys < end;
    if constexpr (in_v) {
      bar_sync<kVFull, kThreads16>();
    } else {
      bar_sync<kKFull, kThreads16>();
    }
    float sacc[8];
    kq_tile_ss(sacc, in_v ? k_desc_in_v : k_desc, q_desc);
    wgmma_wait_all();
    if (separate && more) bar_arrive<kKEmpty, kThreads16>();
    tile_softmax16(sacc, m, l, o, q_down, tile, end, r0, warp, lane, red, sp, [] { bar_sync<kSoftmaxBar, 128>(); });
    fence_to_async_proxy();                                  // P, for the tensor cores
    bar_sync<kSoftmaxBar, 128>();                            // P written and the maxima read by every consumer warp
    if constexpr (separate) bar_sync<kVFull, kThreads16>();  // V dequantised
    vp_tile_ss(o, mode == kLatentInK ? v_desc_in_k : v_desc, p_desc);
    wgmma_wait_all();
    if constexpr (separate) {
      if (more) bar_arrive<kVEmpty, kThreads16>();
    } else if (tile + 2 * kTileKeys < end) {  // the producers' tile two ahead goes into this buffer
      if constexpr (in_v) {
        bar_arrive<kVEmpty, kThreads16>();
      } else {
        bar_arrive<kKEmpty, kThreads16>();
      }
    }
  };
  if (latent) {
    for (uint32_t tile = begin; tile < end; tile += 2 * kTileKeys) {
      step(std::integral_constant<uint32_t, kLatentInK>{}, tile);
      if (tile + kTileKeys < end) step(std::integral_constant<uint32_t, kLatentInV>{}, tile + kTileKeys);
    }
  } else {
    for (uint32_t tile = begin; tile < end; tile += kTileKeys)
      step(std::integral_constant<uint32_t, kSeparate>{}, tile);
  }
  // The sums over the block's keys: lanes of one lane%4, then the four warps in order.
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) {
    for (uint32_t off = 4; off < kWarp; off *= 2) l[j] += __shfl_xor_sync(0xFFFFFFFFu, l[j], off);
    if (lane < 4) red[warp * kRows16 + head_of(j)] = l[j];
  }
  bar_sync<kSoftmaxBar, 128>();
  // The block's partial: unnormalised O with its running max and sum, per head.
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) {
    const uint32_t hl = head_of(j), h = head0 + hl;
    if (h >= num_q_heads) continue;
    const uint64_t slot = (uint64_t{s} * num_q_heads + h) * num_splits + z;
#pragma unroll
    for (uint32_t a = 0; a < kAtoms16; ++a)
#pragma unroll
      for (uint32_t hi = 0; hi < 2; ++hi)
        o_partial[slot * dim + a * 64 + r0 + 8 * hi] = o[a][4 * (j / 2) + 2 * hi + j % 2];
    if (warp == 0 && lane < 4) {
      ml_partial[2 * slot] = m[j];
      ml_partial[2 * slot + 1] = (red[hl] + red[kRows16 + hl]) + (red[2 * kRows16 + hl] + red[3 * kRows16 + hl]);
    }
  }
}

// ---- 64 heads: two warpgroups of 32 heads over the same staged tiles

// The 64-head block: warpgroup W takes heads [32W, 32W + 32) through the whole tile walk on
// its own — Sᵀ = K·Qᵀ over the full contraction (N = 32 heads), the online softmax, and all 576
// dims of Oᵀ = Vᵀ·Pᵀ (nine m64n32 atoms, 144 accumulators) — as a 32-head wgmma16_rs_decode.
// The two share Q's shared memory and each tile's raw K and V, staged once by the bulk copy
// engine into one of kStages64 slots; between them there is no barrier, only the slots'
// mbarriers, so one warpgroup's softmax and conversions run under the other's MMAs (up to a tile
// apart: a slot is refilled once both are done with it). Over one latent pool (FP8, V = K) only
// the K slots are filled, and P·V reads its V rows there.
constexpr uint32_t kRows64 = 64, kHeads64 = 32, kStages64 = 2;
enum : uint32_t { kWgBar64 = 1 };  // named barriers: warpgroup W's is kWgBar64 + W
// Named barrier `id` of kThreads threads that a warp's lanes may reach apart (barrier.sync, not
// bar.sync's .aligned form: the mbarrier waits and the staging's runs leave lanes apart).
template <uint32_t kThreads>
__device__ void named_barrier(uint32_t id) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
// An arrival at named barrier `id` of kThreads threads without waiting (barrier.arrive, likewise
// not .aligned).
template <uint32_t kThreads>
__device__ void named_arrive(uint32_t id) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
__device__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// The online softmax's lazy rescale (as FlashAttention-4's): a head's reference maximum moves only
// when a tile's logits pass it by more than this (natural log units), so P = exp(s − m) stays
// below e^8 (FP16 holds it), and O and l are rescaled only then; the walk's end rescales them to
// the true maximum, which the partial reports.
constexpr float kRescaleSlack = 8.0f;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// 2^x, approximate (MUFU.EX2, results below 2^-126 flushed to zero: P rounds them to zero in
// FP16 anyway), for the 64-head block's softmax.
__device__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The shared memory of a 64-head register-operand block (the host's wgmma_shared_bytes counts it):
// the raw K and V tiles [64 keys][576] FP8, or [64 keys][288] NVFP4 data beside their scales.
struct Smem64 {
  uint8_t* sq;         // Q, permuted (store_q_permuted), 64-row slabs: warpgroup W's heads rows 32W..
  uint8_t* sp;         // [W] Pᵀ as [32 heads][64 keys] FP16, one slab each
  uint8_t* sk;         // [kStages64] the raw K tiles (latent: the V tiles too)
  uint8_t* sv;         // [kStages64] the raw V tiles
  uint8_t* sk_scales;  // NVFP4: [kStages64] the scales of K's and of V's rows, [64 keys][36]
  uint8_t* sv_scales;
  float* q_unscale;  // [64]; then times the softmax scale and log2 e
  float* red;        // [W][4 warps][32 heads]: maxima, then sums
  uint32_t* votes;   // [W][4 warps]: the heads whose tile maximum passed the reference
  uint64_t* bars;    // [kStages64][K, V] the slots' fills, then [kStages64] their releases
};

// Warpgroup W's walk of the block's tiles (wgmma64_rs_decode), its heads' partial then written.
// The online softmax works in log2 units (logits times log2 e, exp2) with the lazy rescale of
// kRescaleSlack: a tile whose logits stay within the slack of their heads' reference maxima —
// nearly every tile after the first — needs no maximum across the warpgroup's threads, only a
// vote. Warpgroup 0 also refills the slots: at the start of tile i the one tile i − 1 held (once
// every thread has released it) with tile i + 1 (`latent`: its K half alone, which P·V reads for
// V too). The partial goes where `out` puts it (PartialOut:
// o_partial and ml_partial; ClusterOut: the block's K and V slots and Q's first bytes, once both
// warpgroups are done with them, and cluster_combine then runs here).
template <class Out, class Rows>
__device__ void wgmma64_walk(const Smem64& sm, HalfFeed<kStages64, Rows>& feed, const Out& out, uint32_t num_q_heads,
                             uint32_t head0, uint32_t s, uint32_t z, uint32_t begin, uint32_t end, bool latent) {
  constexpr bool kNvfp4 = std::is_same_v<Rows, Nvfp4Rows>;
  static_assert(!(kNvfp4 && Out::cluster), "the NVFP4 slots do not hold a cluster's partial rows");
  constexpr uint32_t pitch = kNvfp4 ? kDim / 2 : kDim, scale_pitch = kDim / 16;  // a staged row's bytes
  constexpr float kSlack2 = kRescaleSlack * kLog2e;
  const uint32_t tid = threadIdx.x, lane = tid % kWarp, warp = (tid / kWarp) % 4, j = lane % 4;
  // The warpgroup, through a shuffle so that the compiler knows it warp-uniform (its descriptors
  // and addresses then stay in uniform registers).
  const uint32_t wg = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  const uint32_t r0 = 16 * warp + lane / 4, qrow = 8 * warp + lane / 4;
  // Element e of Sᵀ (or of an Oᵀ atom) is key (dim row) r0 + 8·(e%4 ≥ 2) of the thread's head
  // jj = 2·(e/4) + e%2, the warpgroup's head hh(jj) (the 16-head block's head16_of, to 32).
  auto hh = [&](uint32_t jj) { return head16_of(jj, lane); };
  const uint64_t q_desc = smem_desc(smem_addr(sm.sq + wg * kHeads64 * 128), 16, 1024);
  uint8_t* const sp = sm.sp + wg * kHeads64 * 128;
  const uint64_t p_desc = smem_desc(smem_addr(sp), 16, 1024);
  uint64_t* const released = sm.bars + 2 * kStages64;
  float o[kAtoms16][16] = {};
  float m[8], l[8], seen[8];  // the heads' reference maxima (log2 units), sums, largest logits
#pragma unroll
  for (uint32_t jj = 0; jj < 8; ++jj) m[jj] = -INFINITY, l[jj] = 0.0f, seen[jj] = -INFINITY;
  float* const red = sm.red + wg * 4 * kHeads64;
  uint32_t* const votes = sm.votes + wg * 4;
  // The maxima over the warpgroup's threads of each head's per-thread values v (lanes of one
  // lane%4, then the four warps through `red`, a warpgroup barrier between).
  auto wg_max = [&](float(&v)[8]) {
#pragma unroll
    for (uint32_t jj = 0; jj < 8; ++jj) {
      for (uint32_t off = 4; off < kWarp; off *= 2) v[jj] = fmaxf(v[jj], __shfl_xor_sync(0xFFFFFFFFu, v[jj], off));
      if (lane < 4) red[warp * kHeads64 + hh(jj)] = v[jj];
    }
    named_barrier<128>(kWgBar64 + wg);
#pragma unroll
    for (uint32_t jj = 0; jj < 8; ++jj) {
      const uint32_t h = hh(jj);
      v[jj] = fmaxf(fmaxf(red[h], red[kHeads64 + h]), fmaxf(red[2 * kHeads64 + h], red[3 * kHeads64 + h]));
    }
  };
  // O and l rescaled by f[jj] (skipped when every factor is 1).
  auto rescale = [&](const float(&f)[8]) {
    bool any = false;
#pragma unroll
    for (uint32_t jj = 0; jj < 8; ++jj) any = any || f[jj] != 1.0f, l[jj] *= f[jj];
    if (!any) return;
#pragma unroll
    for (uint32_t a = 0; a < kAtoms16; ++a)
#pragma unroll
      for (uint32_t e = 0; e < 16; ++e) o[a][e] *= f[2 * (e / 4) + e % 2];
  };
  for (uint32_t tile = begin, i = 0; tile < end; tile += kTileKeys, ++i) {
    const uint32_t b = i % kStages64;
    if (wg == 0 && i >= 1 && tile + kTileKeys < end) {  // tile i + 1 into the slot of tile i − 1
      const uint32_t next = (i + 1) % kStages64;
      mbar_wait(released + next, ((i - 1) / kStages64) % 2);
      feed.stage_tile(tile + kTileKeys, next, latent);
      feed.locate(tile + 2 * kTileKeys);
    }
    feed.wait(0, i);  // this tile's K (the mbarrier's phase makes it visible to each waiting thread)
    const uint8_t* const sk = sm.sk + b * kTileKeys * pitch;
    float sacc[16];
    if constexpr (kNvfp4) {
      const uint8_t* const scales = sm.sk_scales + b * kTileKeys * scale_pitch;
      kq_tile_rs<16, kSlabBytes>(sacc,
                                 Nvfp4KeyPair{{sk + r0 * pitch, sk + (r0 + 8) * pitch},
                                              {scales + r0 * scale_pitch, scales + (r0 + 8) * scale_pitch}},
                                 j, q_desc);
    } else {
      kq_tile_rs<16, kSlabBytes>(sacc, Fp8KeyPair{{sk + r0 * kDim, sk + (r0 + 8) * kDim}}, j, q_desc);
    }
    float mx[8];
#pragma unroll
    for (uint32_t jj = 0; jj < 8; ++jj) mx[jj] = -INFINITY;
#pragma unroll
    for (uint32_t e = 0; e < 16; ++e) {
      const uint32_t key = r0 + 8 * ((e % 4) / 2), jj = 2 * (e / 4) + e % 2;
      sacc[e] = tile + key < end ? sacc[e] * sm.q_unscale[wg * kHeads64 + hh(jj)] : -INFINITY;
      mx[jj] = fmaxf(mx[jj], sacc[e]);
    }
    // The vote: does any head's tile maximum pass its reference by more than the slack?
    uint32_t up = 0;
#pragma unroll
    for (uint32_t jj = 0; jj < 8; ++jj) {
      up |= mx[jj] > m[jj] + kSlack2 ? 1u << jj : 0u;
      seen[jj] = fmaxf(seen[jj], mx[jj]);
    }
    up = __reduce_or_sync(0xFFFFFFFFu, up);
    if (lane == 0) votes[warp] = up;
    named_barrier<128>(kWgBar64 + wg);  // the votes written; the last tile's P read by the MMAs
    {
      const uint4 v = *reinterpret_cast<const uint4*>(votes);
      up = v.x | v.y | v.z | v.w;
    }
    if (up != 0) {  // (the warpgroup's threads agree) the heads that passed move to their tile maximum
      wg_max(mx);
      float alpha[8];
#pragma unroll
      for (uint32_t jj = 0; jj < 8; ++jj) {
        alpha[jj] = 1.0f;
        if (mx[jj] > m[jj] + kSlack2) alpha[jj] = fast_exp2(m[jj] - mx[jj]), m[jj] = mx[jj];
      }
      rescale(alpha);
    }
#pragma unroll
    for (uint32_t e = 0; e < 16; ++e) {  // elements e and e + 2: keys r0 and r0 + 8, adjacent columns
      if (e % 4 >= 2) continue;
      const uint32_t jj = 2 * (e / 4) + e % 2, col = pv_column<16>(r0);
      const float p0 = fast_exp2(sacc[e] - m[jj]), p1 = fast_exp2(sacc[e + 2] - m[jj]);
      l[jj] += p0, l[jj] += p1;
      *reinterpret_cast<__half2*>(sp + swizzled(hh(jj), col / 8) + (col % 8) * 2) = __floats2half2_rn(p0, p1);
    }
    fence_to_async_proxy();             // P, for the tensor cores
    named_barrier<128>(kWgBar64 + wg);  // P written by the warpgroup, the votes read
    if constexpr (kNvfp4) {
      feed.wait(1, i);
      vp_tile_rs_nvfp4<16>(o, sm.sv + b * kTileKeys * pitch, sm.sv_scales + b * kTileKeys * scale_pitch, end - tile, j,
                           qrow, p_desc);
    } else {
      if (!latent) feed.wait(1, i);
      // Over one latent pool V = K: the rows the K slot holds.
      vp_tile_rs<16>(o, feed.layout, latent ? sk : sm.sv + b * kTileKeys * kDim, kDim, end - tile, j, qrow, p_desc);
    }
    mbar_arrive(released + b);  // this thread's reads of the tile's K and V are done
  }
  // O and l from the reference maxima to the true ones (a head without keys keeps −inf).
  float f[8];
  wg_max(seen);
#pragma unroll
  for (uint32_t jj = 0; jj < 8; ++jj) f[jj] = m[jj] == seen[jj] ? 1.0f : fast_exp2(m[jj] - seen[jj]);
  rescale(f);
  named_barrier<128>(kWgBar64 + wg);  // the maxima read from `red`
  // The sums over the block's keys: lanes of one lane%4, then the warpgroup's four warps in order.
#pragma unroll
  for (uint32_t jj = 0; jj < 8; ++jj) {
    for (uint32_t off = 4; off < kWarp; off *= 2) l[jj] += __shfl_xor_sync(0xFFFFFFFFu, l[jj], off);
    if (lane < 4) red[warp * kHeads64 + hh(jj)] = l[jj];
  }
  named_barrier<128>(kWgBar64 + wg);
  if constexpr (Out::cluster) __syncthreads();  // both warpgroups past their last tile: the slots are free
  // The partial: unnormalised O with the true max and the sum, per head; rows r0 and r0 + 8 of
  // atom a are the adjacent dims of the thread's row group (see vp_tile_rs).
  float* const cluster_rows = reinterpret_cast<float*>(sm.sk);  // [64 heads][576]: the K and V slots
  float* const cluster_ml = reinterpret_cast<float*>(sm.sq);    // [64 heads][2]: Q's first bytes
  const bool vector_stores = out.vector_stores();
#pragma unroll
  for (uint32_t jj = 0; jj < 8; ++jj) {
    const uint32_t hl = hh(jj), hb = wg * kHeads64 + hl, h = head0 + hb;  // hb: the block's head
    if (h >= num_q_heads) continue;
    const uint64_t slot = (uint64_t{s} * num_q_heads + h) * gridDim.x + z;
    float* const row = out.row(slot, cluster_rows, hb);
    const uint32_t e0 = 4 * (jj / 2) + jj % 2;  // row r0's element; r0 + 8's is e0 + 2
    if (vector_stores) {                        // atoms 2c and 2c + 1: dims 16·qrow + 4c .. + 3, one 16-byte store
#pragma unroll
      for (uint32_t c = 0; c < 4; ++c)
        *reinterpret_cast<float4*>(row + 16 * qrow + 4 * c) =
            make_float4(o[2 * c][e0], o[2 * c][e0 + 2], o[2 * c + 1][e0], o[2 * c + 1][e0 + 2]);
    } else {
#pragma unroll
      for (uint32_t a = 0; a < 8; ++a)
        *reinterpret_cast<float2*>(row + 16 * qrow + 2 * a) = make_float2(o[a][e0], o[a][e0 + 2]);
    }
    *reinterpret_cast<float2*>(row + 512 + 2 * qrow) = make_float2(o[8][e0], o[8][e0 + 2]);
    if (warp == 0 && lane < 4) {
      float* const ml = out.ml(slot, cluster_ml, hb);
      ml[0] = seen[jj] * kLn2;
      ml[1] = (red[hl] + red[kHeads64 + hl]) + (red[2 * kHeads64 + hl] + red[3 * kHeads64 + hl]);
    }
  }
  if constexpr (Out::cluster)
    cluster_combine<kRows64, 256>(out, cluster_rows, cluster_ml, s, head0, num_q_heads, z, gridDim.x);
}

// The split decode of one 64-head block (the compute-bound rows): two warpgroups of 32 heads
// each (wgmma64_walk), transposed products with A from registers, one block per SM. The raw K
// and V tiles are staged by the bulk copy engine (HalfFeed, warpgroup 0's warps; NVFP4's scales
// by cp.async) into two slots each and converted in registers by the threads whose fragments hold
// them, as in wgmma16_rs_decode — each warpgroup converting every byte for its own heads. Over one
// latent pool (FP8, v_cache = k_cache) each key's row is copied once and read for both products.
// With ClusterOut (FP8) the blocks of a cluster then combine their partials (cluster_combine).
template <class Out, class Rows>
__device__ void wgmma64_rs_decode(const __nv_bfloat16* q, const Out& out, uint32_t num_q_heads, float logit_scale,
                                  uint32_t keys_per_split, const Rows& layout) {
  using Feed = HalfFeed<kStages64, Rows>;
  constexpr uint32_t pitch = Feed::kNvfp4 ? kDim / 2 : kDim, scale_pitch = Feed::kNvfp4 ? kDim / 16 : 0;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Smem64 sm;
  sm.sq = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  sm.sp = sm.sq + kRows64 * kDim * 2;
  sm.sk = sm.sp + kRows64 * kTileKeys * 2;
  sm.sv = sm.sk + kStages64 * kTileKeys * pitch;
  sm.sk_scales = sm.sv + kStages64 * kTileKeys * pitch;
  sm.sv_scales = sm.sk_scales + kStages64 * kTileKeys * scale_pitch;
  sm.q_unscale = reinterpret_cast<float*>(sm.sv_scales + kStages64 * kTileKeys * scale_pitch);
  sm.red = sm.q_unscale + kRows64;
  sm.votes = reinterpret_cast<uint32_t*>(sm.red + 2 * 4 * kHeads64);
  sm.bars = reinterpret_cast<uint64_t*>(sm.votes + 2 * 4);

  const uint32_t tid = threadIdx.x;
  const uint32_t z = blockIdx.x, head0 = blockIdx.y * kRows64, s = blockIdx.z;
  const Chunk chunk = chunk_of(layout.keys, z, keys_per_split);
  bool latent = false;
  if constexpr (!Feed::kNvfp4) latent = layout.v_is_k();
  if (tid == 0) {
#pragma unroll
    for (uint32_t b = 0; b < kStages64; ++b) {
      mbar_init(sm.bars + 2 * b, Feed::arrivals()), mbar_init(sm.bars + 2 * b + 1, Feed::arrivals());
      mbar_init(sm.bars + 2 * kStages64 + b, 256);
    }
    fence_mbar_init();
  }
  __syncthreads();  // the mbarriers ready before any copy counts off at them
  Feed feed{layout, {sm.sk, sm.sv}, sm.bars, chunk.end, {}, {sm.sk_scales, sm.sv_scales}};
  if (tid < 128) {  // warpgroup 0 stages: the first two tiles on their way
    feed.locate(chunk.begin);
    feed.stage_tile(chunk.begin, 0, latent);
    feed.locate(chunk.begin + kTileKeys);
    feed.stage_tile(chunk.begin + kTileKeys, 1, latent);
    feed.locate(chunk.begin + 2 * kTileKeys);
  }
  load_q_rows_with<kQUnits, 4>(  // eight rows a warp, four loaded together
      q, s, head0, kRows64, num_q_heads, kDim, sm.q_unscale,
      [&](uint32_t row, uint32_t part, const uint32_t(&w)[4]) { store_q_permuted<kRows64>(sm.sq, row, part, w); });
  fence_to_async_proxy();
  __syncthreads();
  // Each row's unscale (a power of two) times the softmax scale in log2 units, for the walk.
  if (tid < kRows64) sm.q_unscale[tid] = logit_factor(sm.q_unscale[tid], logit_scale * kLog2e);
  __syncthreads();
  wgmma64_walk(sm, feed, out, num_q_heads, head0, s, z, chunk.begin, chunk.end, latent);
}

// ---- 64 heads in M over one latent pool (FlashMLA's shape)

// wgmma m64n64k16 and m64n32k16, FP16 in, FP32 accumulate: A from shared memory (K-major) or
// registers (the m16n8k16 A fragment of each warp's 16 rows), B from shared memory, K-major or,
// with kTransB, MN-major (V's rows, the output dims contiguous). `accumulate` 0 overwrites D.
#define METRALE_ACC32                                                                                                 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31}"
#define METRALE_ACC32_OUT(d)                                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),         \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define METRALE_ACC16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define METRALE_ACC16_OUT(d)                                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
template <int kTransB>
__device__ void wgmma_ss_m64n64k16(float (&d)[32], uint64_t a, uint64_t b, uint32_t accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " METRALE_ACC32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
               : METRALE_ACC32_OUT(d)
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
}
__device__ void wgmma_ss_m64n32k16_tb(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " METRALE_ACC16 ", %16, %17, p, 1, 1, 0, 1;\n}\n"
               : METRALE_ACC16_OUT(d)
               : "l"(a), "l"(b), "r"(1u));
}
__device__ void wgmma_rs_m64n64k16_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " METRALE_ACC32
               ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
               : METRALE_ACC32_OUT(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1u));
}
#undef METRALE_ACC32
#undef METRALE_ACC32_OUT
#undef METRALE_ACC16
#undef METRALE_ACC16_OUT

// The shared memory of the heads-in-M block (the host's wgmma_latent_shared_bytes counts it).
struct SmemHm {
  uint8_t* sq;       // Q (FP16), [64 heads][576] in nine swizzled 64-column slabs (K-major)
  uint8_t* st;       // two FP16 tiles, [64 keys][576] each, the same layout: tile i in the (i % 2)-th
  uint8_t* sp;       // P (FP16), [64 heads][64 keys], one swizzled slab
  float* q_unscale;  // [64]; then times the softmax scale and log2 e
  float* alpha;      // [2][64] the heads' rescale factors of tile i at [i % 2]
  uint64_t* alpha_full;   // [2] mbarriers: alpha[b] written (warpgroup 0's 128 threads arrive)
  uint64_t* alpha_empty;  // [2] mbarriers: alpha[b] read (warpgroup 1's 128 threads arrive)
};
constexpr uint32_t kHmHalfSlab = 32;                // the output dims 512..575: 32 a warpgroup
constexpr uint32_t kHmUnits = kDim / 16 / 4;        // 16-value units of a key a converting thread holds
constexpr uint32_t kHmKeysPerBatch = kTileKeys / 2;  // keys a batch: warpgroup 1's 128 threads, four a key
constexpr uint32_t kHmTileBytes = kTileKeys * kDim * 2;  // an FP16 tile
static_assert(2 * kHmTileBytes == kRows64 * kDim * 4, "the two FP16 tiles hold a cluster's FP32 partial rows");

// The 128-byte lines of a 576-byte cache row (up to six: rows need not be line-aligned) into L2,
// two or one by each of the four threads `first` of its key.
__device__ void prefetch_576_row_l2(const uint8_t* row, uint32_t first) {
  if (row == nullptr) return;
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + 128 * first));
  if (first < 2) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + (first == 0 ? 512 : kDim - 1)));
}

// Unit `part` (values 16·part .. + 15) of key `row` of an FP16 tile, as eight FP16 pairs.
__device__ inline void hm_store_unit(uint8_t* tile, uint32_t row, uint32_t part, const uint32_t (&w)[8]) {
  st_shared_v4(tile + swizzled(row, 2 * part), w[0], w[1], w[2], w[3]);
  st_shared_v4(tile + swizzled(row, 2 * part + 1), w[4], w[5], w[6], w[7]);
}

// Warpgroup 1's share of a tile: keys `key` and key + 32 (0 ≤ key < 32) of the tile, a quarter
// of each key's 36 16-value units (thread `first` of the key's four), loaded straight from the
// cache into registers — zeros for a key past the chunk's end (a null row) — and later converted
// (exactly, to FP16) into a swizzled FP16 tile. `Key`: where a key's bytes are (from
// Rows::locate's rows; a null data row past the chunk's end, its other pointers then unused);
// prefetch: its bytes into L2. One specialisation a cache format.
template <class Rows>
struct HmShare;

// FP8: units first + 4u of each row (a warp reads 64 contiguous bytes of each of eight rows at a
// time).
template <>
struct HmShare<Fp8Rows> {
  static constexpr bool kGrouped = false;  // the tile's dims in order
  // The loads of tile i + 2 left where ptxas puts them (9 of 18 before kHmBarP): pinned after that
  // wait they took 1–3% longer on an H100 (thirty-fourth session).
  static constexpr bool kPinLoads = false;
  struct Key {
    const uint8_t* row;
  };
  __device__ static Key key(const uint8_t* const (&located)[4], bool live) { return {live ? located[0] : nullptr}; }
  __device__ static void prefetch(const Key& k, uint32_t first) { prefetch_576_row_l2(k.row, first); }
  uint4 raw[2][kHmUnits];
  __device__ void load(const Key (&keys)[2], uint32_t first) {
#pragma unroll
    for (uint32_t b = 0; b < 2; ++b)
#pragma unroll
      for (uint32_t u = 0; u < kHmUnits; ++u)
        raw[b][u] = keys[b].row != nullptr ? ld_stream16(keys[b].row + (first + 4 * u) * 16) : make_uint4(0, 0, 0, 0);
  }
  __device__ void store(uint8_t* tile, uint32_t key, uint32_t first) const {
#pragma unroll
    for (uint32_t b = 0; b < 2; ++b)
#pragma unroll
      for (uint32_t u = 0; u < kHmUnits; ++u) {
        uint32_t w[8];
        fp8x16_to_f16(raw[b][u], w);
        hm_store_unit(tile, key + b * kHmKeysPerBatch, first + 4 * u, w);
      }
  }
};

// NVFP4: units 2·first + 8v and + 1 (v < 4: one 16-byte load of data a pair) and 32 + first (an
// 8-byte load) of each data row, and the scale words that hold their scales (bytes 2·first + 8v,
// + 1 and 32 + first of the row's 36: words 2v + first/2 and 8, 4-byte loads).
template <>
struct HmShare<Nvfp4Rows> {
#ifdef METRALE_HM_NVFP4_GROUPED
  // Experiment (docs/performance.md, "Thirty-third session"): each group of eight dims in the
  // tile (and in Q, and so in O's columns) in the order 0, 2, 4, 6, 1, 3, 5, 7, the order the E2M1
  // codes' even and odd nibbles come out in: no byte permutes to interleave them, and each word's
  // upper pair converted in place (no shift): 4 of the conversion's instructions a pair fewer.
  static constexpr bool kGrouped = true;
#else
  static constexpr bool kGrouped = false;
#endif
  // The loads of tile i + 2 pinned after the kHmBarP wait (ptxas would issue all 20 before it,
  // under the conversion's tail): 3.7–4.8% less time on an H100 (thirty-fourth session).
  static constexpr bool kPinLoads = true;
  struct Key {
    const uint8_t *data, *scales;
  };
  __device__ static Key key(const uint8_t* const (&located)[4], bool live) {
    return {live ? located[0] : nullptr, located[1]};
  }
  __device__ static void pin(Key& k, uint32_t zero) { k.data += zero, k.scales += zero; }  // where kPinLoads
  // The data row's 288 bytes (up to four 128-byte lines) and its 36 scales (up to two).
  __device__ static void prefetch(const Key& k, uint32_t first) {
    if (k.data == nullptr) return;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(k.data + (first < 3 ? 128 * first : kDim / 2 - 1)));
    if (first < 2) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(k.scales + (first == 0 ? 0 : kDim / 16 - 1)));
  }
  uint4 pairs[2][4];
  uint2 tail[2];
  uint32_t scales[2][5];
  __device__ void load(const Key (&keys)[2], uint32_t first) {
#pragma unroll
    for (uint32_t b = 0; b < 2; ++b) {
      const Key& k = keys[b];
#pragma unroll
      for (uint32_t v = 0; v < 4; ++v) {
        pairs[b][v] = k.data != nullptr ? ld_stream16(k.data + (2 * first + 8 * v) * 8) : make_uint4(0, 0, 0, 0);
        scales[b][v] = k.data != nullptr ? ld_stream4(k.scales + 4 * (2 * v + first / 2)) : 0;
      }
      tail[b] = k.data != nullptr ? ld_stream8(k.data + (32 + first) * 8) : make_uint2(0, 0);
      scales[b][4] = k.data != nullptr ? ld_stream4(k.scales + 32) : 0;
    }
  }
  // 16 values (eight bytes of codes, one scale) as 16 FP16 values: nvfp4x16_to_f16's, or with
  // kGrouped each word's eight in the order 0, 2, 4, 6, 1, 3, 5, 7.
  __device__ static void convert(uint2 raw, uint32_t scale_code, uint32_t (&w)[8]) {
    if constexpr (!kGrouped) {
      nvfp4x16_to_f16(raw, scale_code, w);
    } else {
      const __half2 scale = __hmul2(e4m3x2_to_f16x2(scale_code * 0x0101u), __float2half2_rn(64.0f));
      const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
      for (int k = 0; k < 2; ++k) {  // E2M1 s·ee·m as E4M3 s·00ee·m00 (nvfp4x16_to_f16)
        const uint32_t even = ((words[k] & 0x08080808u) << 4) | ((words[k] & 0x07070707u) << 2);
        const uint32_t odd = (words[k] & 0x80808080u) | ((words[k] >> 2) & 0x1C1C1C1Cu);
        const uint32_t codes[2] = {even, odd};
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          w[4 * k + 2 * c] = bits_of(__hmul2(e4m3x2_to_f16x2(codes[c]), scale));
          const uint32_t hi = e4m3x2_hi_to_f16x2(codes[c]);
          w[4 * k + 2 * c + 1] = bits_of(__hmul2(*reinterpret_cast<const __half2*>(&hi), scale));
        }
      }
    }
  }
  __device__ void store(uint8_t* tile, uint32_t key, uint32_t first) const {
#pragma unroll
    for (uint32_t b = 0; b < 2; ++b) {
      const uint32_t row = key + b * kHmKeysPerBatch;
      uint32_t w[8];
#pragma unroll
      for (uint32_t v = 0; v < 4; ++v) {
        const uint32_t shift = 16 * (first % 2);  // the pair's two scale bytes in word v
        convert(make_uint2(pairs[b][v].x, pairs[b][v].y), (scales[b][v] >> shift) & 0xFF, w);
        hm_store_unit(tile, row, 2 * first + 8 * v, w);
        convert(make_uint2(pairs[b][v].z, pairs[b][v].w), (scales[b][v] >> (shift + 8)) & 0xFF, w);
        hm_store_unit(tile, row, 2 * first + 8 * v + 1, w);
      }
      convert(tail[b], (scales[b][4] >> (8 * first)) & 0xFF, w);
      hm_store_unit(tile, row, 32 + first, w);
    }
  }
};

// Warpgroup `wg`'s share of O (its dims: slabs 4·wg .. 4·wg + 3 and dims 512 + 32·wg .. + 31) in
// the m64nN accumulator layout: a thread holds rows (heads) r0 and r0 + 8 of its warp's 16,
// columns 8i + 2j and + 1 (element 4i + c: row r0 for c < 2, r0 + 8 for c ≥ 2).
struct HmAcc {
  float o[4][32] = {}, oh[16] = {};
  // Rows r0 and r0 + 8 times f[0] and f[1].
  __device__ void rescale(const float (&f)[2]) {
#pragma unroll
    for (uint32_t e = 0; e < 32; ++e) {
#pragma unroll
      for (uint32_t n = 0; n < 4; ++n) o[n][e] *= f[(e % 4) / 2];
      if (e < 16) oh[e] *= f[(e % 4) / 2];
    }
  }
  // Issue O += P·V for the tile at `st`, k-step kk taking V's rows 16kk..16kk + 15 (MN-major), P
  // from registers (pa, warpgroup 0; warpgroup 1 under METRALE_HM_P_REGS, p_desc 0) or shared
  // memory (p_desc, warpgroup 1); one commit group.
  template <uint32_t kWg>
  __device__ void issue_pv(const uint8_t* st, const uint32_t (&pa)[4][4], uint64_t p_desc) {
    const uint64_t v_desc = smem_desc(smem_addr(st), kSlabBytes, 1024);
    auto v_at = [&](uint32_t slab, uint32_t kk, uint32_t column) {
      return v_desc + ((slab * kSlabBytes + kk * 16 * 128 + column * 2) >> 4);
    };
    wgmma_fence();
#pragma unroll
    for (uint32_t kk = 0; kk < kTileKeys / 16; ++kk) {
      if constexpr (kWg == 0) {
#pragma unroll
        for (uint32_t n = 0; n < 4; ++n) wgmma_rs_m64n64k16_tb(o[n], pa[kk], v_at(n, kk, 0));
        wgmma_rs_m64n32k16<1>(oh, pa[kk], v_at(8, kk, 0), 1);
      } else if (p_desc == 0) {  // METRALE_HM_P_REGS: warpgroup 1's P from registers (pa) too
#pragma unroll
        for (uint32_t n = 0; n < 4; ++n) wgmma_rs_m64n64k16_tb(o[n], pa[kk], v_at(4 + n, kk, 0));
        wgmma_rs_m64n32k16<1>(oh, pa[kk], v_at(8, kk, kHmHalfSlab), 1);
      } else {
        const uint64_t p = p_desc + ((kk * 32) >> 4);
#pragma unroll
        for (uint32_t n = 0; n < 4; ++n) wgmma_ss_m64n64k16<1>(o[n], p, v_at(4 + n, kk, 0), 1);
        wgmma_ss_m64n32k16_tb(oh, p, v_at(8, kk, kHmHalfSlab));
      }
    }
    wgmma_commit();
  }
  // The rows of heads r0 and r0 + 8 (those below num_q_heads) where `out` puts them (ClusterOut:
  // in `rows`, [64 heads][576]).
  // kGrouped (HmShare::kGrouped): the tile's columns hold each group of eight dims in the order
  // 0, 2, 4, 6, 1, 3, 5, 7, so a thread's two columns 2j and 2j + 1 go to two dims apart.
  template <bool kGrouped = false, class Out>
  __device__ void store(const Out& out, float* rows, uint32_t num_q_heads, uint32_t head0, uint32_t s, uint32_t z,
                        uint32_t r0, uint32_t j, uint32_t wg) const {
    const auto dim = [](uint32_t p) { return p < 4 ? 2 * p : 2 * p - 7; };  // column p's dim in its group of 8
    const auto put = [&](float* at, uint32_t c, float x0, float x1) {       // columns c and c + 1
      if constexpr (kGrouped) {
        at[c - c % 8 + dim(c % 8)] = x0;
        at[c - c % 8 + dim(c % 8 + 1)] = x1;
      } else {
        *reinterpret_cast<float2*>(at + c) = make_float2(x0, x1);
      }
    };
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t hb = r0 + 8 * h, head = head0 + hb;
      if (head >= num_q_heads) continue;
      float* const row = out.row((uint64_t{s} * num_q_heads + head) * gridDim.x + z, rows, hb);
#pragma unroll
      for (uint32_t e = 2 * h; e < 32; e += 4) {  // columns 8·(e/4) + 2j and + 1
        const uint32_t c = 8 * (e / 4) + 2 * j;
#pragma unroll
        for (uint32_t n = 0; n < 4; ++n) put(row + (4 * wg + n) * 64, c, o[n][e], o[n][e + 1]);
        if (e < 16) put(row + 512 + wg * kHmHalfSlab, c, oh[e], oh[e + 1]);
      }
    }
  }
};
// The heads-in-M block's named barriers (0 is __syncthreads), each of its 256 threads, in the
// barrier.sync and barrier.arrive forms (not the .aligned bar forms: the two warpgroups reach them
// at different instructions; synccheck flags those):
// - kHmBarP (both wait): P and tile i's rescale factors written, tile i + 1 converted;
// - kHmBarPv (warpgroup 1 arrives, 0 waits): warpgroup 1's P·V issued, so that the next tile's S
//   queues behind both halves of P·V and the tile is free for the next conversion sooner;
// - kHmBarRead (0 arrives, 1 waits): warpgroup 0's P·V done with a tile;
// - kHmBarPFree (1 arrives, 0 waits): warpgroup 1's P·V done with the tile and P;
// - kHmBarDone (both wait; ClusterOut only): both warpgroups past their last tile, before the
//   partial rows go into the tiles' bytes.
// The rescale factors, the one thing a warpgroup reads with plain loads from what the other wrote,
// are double-buffered and handed over through a full and an empty mbarrier a buffer. kHmBarP orders
// them as well, but with only the named barriers racecheck flagged them on the H200, single- or
// double-buffered (a micro-kernel of the same handoff it passed; docs/performance.md).
enum : uint32_t { kHmBarP = 1, kHmBarRead = 2, kHmBarPFree = 3, kHmBarPv = 4, kHmBarDone = 5 };

// Cycles between points of the heads-in-M walk, summed over its tiles and blocks into g_hm_trace
// (bench/hm_trace.cu prints them): a diagnostic build, -DMETRALE_HM_TRACE; otherwise nothing.
#ifdef METRALE_HM_TRACE
__device__ unsigned long long g_hm_trace[2][10];  // [warpgroup][point]; [wg][9]: the tiles walked
struct HmTrace {
  uint32_t cycles[9] = {}, last;
  __device__ HmTrace() : last(clock()) {}
  __device__ void mark(uint32_t point) {
    const uint32_t now = clock();
    cycles[point] += now - last;
    last = now;
  }
  __device__ void flush(uint32_t wg, uint32_t tiles) const {
    if (threadIdx.x % 128 != 0) return;
    for (uint32_t k = 0; k < 9; ++k) atomicAdd(&g_hm_trace[wg][k], cycles[k]);
    atomicAdd(&g_hm_trace[wg][9], tiles);
  }
};
#else
struct HmTrace {
  __device__ void mark(uint32_t) {}
  __device__ void flush(uint32_t, uint32_t) const {}
};
#endif

// Issue S = Q·Kᵀ for the tile at `st` (m64n64, 36 k-steps, A and B K-major), one commit group.
__device__ void hm_issue_s(float (&sacc)[32], uint64_t q_desc, const uint8_t* st) {
  const uint64_t k_desc = smem_desc(smem_addr(st), 16, 1024);
  wgmma_fence();
#pragma unroll
  for (uint32_t k = 0; k < kDim / 16; ++k) {
    const uint32_t at = ((k / 4) * kSlabBytes + (k % 4) * 32) >> 4;
    wgmma_ss_m64n64k16<0>(sacc, q_desc + at, k_desc + at, k != 0);
  }
  wgmma_commit();
}

// The split decode of one 64-head block over one latent pool (FP8, v_cache = k_cache, no
// compressed entries), with the heads in the wgmma's M as FlashMLA has them: S = Q·Kᵀ is one
// m64n64 product a k-step (A = Q, B = the tile's K rows, both K-major in shared memory), so each
// head's softmax runs along its thread's row (two lane shuffles, no exchange between warps), and
// O = P·V takes V from the same FP16 tile, MN-major, with P as the A operand — each byte of the
// cache converted once for both products. Warpgroup 0 computes S and the softmax, keeps P in
// registers for its P·V and leaves it (FP16) and the rescale factors in shared memory for
// warpgroup 1, then issues the next tile's S behind its P·V, so that the tensor cores go from one
// to the other. Warpgroup 1 converts the next tile into the other FP16 tile (once warpgroup 0's
// P·V is done with it) from rows it loaded into registers under the last P·V. Each warpgroup
// accumulates half of O's 576 dims (HmAcc). The two run apart loops (their registers allocated
// apart: O, and S or the raw rows), meeting at kHmBarP a tile.
template <class Out, class Rows>
__device__ void wgmma_hm_decode(const __nv_bfloat16* q, const Out& out, uint32_t num_q_heads, float logit_scale,
                                uint32_t keys_per_split, const Rows& layout) {
  using Share = HmShare<Rows>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  SmemHm sm;
  sm.sq = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  sm.st = sm.sq + kRows64 * kDim * 2;
  sm.sp = sm.st + 2 * kHmTileBytes;
  sm.q_unscale = reinterpret_cast<float*>(sm.sp + kRows64 * kTileKeys * 2);
  sm.alpha = sm.q_unscale + kRows64;
  sm.alpha_full = reinterpret_cast<uint64_t*>(sm.alpha + 2 * kRows64);
  sm.alpha_empty = sm.alpha_full + 2;

  const uint32_t tid = threadIdx.x, lane = tid % kWarp, warp = (tid / kWarp) % 4, j = lane % 4;
  const uint32_t wg = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);  // warp-uniform, known so to the compiler
  const uint32_t z = blockIdx.x, head0 = blockIdx.y * kRows64, s = blockIdx.z;
  const Chunk chunk = chunk_of(layout.keys, z, keys_per_split);
  const uint32_t begin = chunk.begin, end = chunk.end;
  const uint32_t r0 = 16 * warp + lane / 4;  // the thread's rows r0 and r0 + 8 (HmAcc)
  const uint64_t p_desc = smem_desc(smem_addr(sm.sp), 16, 1024);
  auto tile_at = [&](uint32_t i) { return sm.st + (i % 2) * kHmTileBytes; };  // tile i's FP16 copy

  // Warpgroup 1's keys of a tile (key_a and key_a + 32), its quarter `first` of each. A tile's
  // rows are found in three steps a tile apart, so that no wait for memory falls on the walk: the
  // block table's entries (tile i + 4, at tile i), the rows' addresses and their L2 prefetch
  // (tile i + 3), their loads into registers (tile i + 2, under P·V); tile i + 1 is converted at
  // tile i.
  const uint32_t key_a = (tid % 128) / 4, first = tid % 4;
  auto entries_of = [&](uint32_t tile, int32_t(&e)[2]) {
#pragma unroll
    for (uint32_t b = 0; b < 2; ++b) {
      const uint32_t k = tile + key_a + b * kHmKeysPerBatch;
      e[b] = k < end ? layout.entry(k) : 0;
    }
  };
  auto rows_of = [&](uint32_t tile, const int32_t(&e)[2], typename Share::Key(&r)[2]) {
#pragma unroll
    for (uint32_t b = 0; b < 2; ++b) {
      const uint32_t k = tile + key_a + b * kHmKeysPerBatch;
      const uint8_t* located[4];
      if (k < end) layout.locate(k, e[b], located);
      r[b] = Share::key(located, k < end);
      Share::prefetch(r[b], first);
    }
  };
  Share share;
  int32_t entries[2];           // tile i + 4's (after tile i)
  typename Share::Key rows[2];  // tile i + 3's (after tile i)
  if (wg == 1) {                // tile 0 converted, tile 1 loaded, tile 2 located, tile 3's entries on their way
    int32_t e[2];
    typename Share::Key r[2];
    entries_of(begin, e), rows_of(begin, e, r), share.load(r, first);
    entries_of(begin + kTileKeys, e), rows_of(begin + kTileKeys, e, r);
    share.store(tile_at(0), key_a, first);
    share.load(r, first);
    entries_of(begin + 2 * kTileKeys, e), rows_of(begin + 2 * kTileKeys, e, rows);
    entries_of(begin + 3 * kTileKeys, entries);
  }
  // alpha_full[0..1], alpha_empty[0..1], by one thread as the other blocks do theirs. With
  // `tid < 4`, ptxas ran the init as a loop under a uniform predicate that warps 1–7 never take,
  // and racecheck counted it in those warps too, as writes at whatever their (unset) register
  // held: WAW hazards on Q's scales and P (twenty-seventh session, docs/conformance.md).
  if (tid == 0) {
#pragma unroll
    for (uint32_t b = 0; b < 4; ++b) mbar_init(sm.alpha_full + b, 128);
    fence_mbar_init();
  }
  load_q_rows_with<kQUnits, 4>(
      q, s, head0, kRows64, num_q_heads, kDim, sm.q_unscale, [&](uint32_t row, uint32_t part, const uint32_t(&w)[4]) {
        if constexpr (Share::kGrouped)  // dims 0, 2, 4, 6, 1, 3, 5, 7 as the tile's
          st_shared_v4(sm.sq + swizzled(row, part), __byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410),
                       __byte_perm(w[0], w[1], 0x7632), __byte_perm(w[2], w[3], 0x7632));
        else
          st_shared_v4(sm.sq + swizzled(row, part), w[0], w[1], w[2], w[3]);
      });
  fence_to_async_proxy();
  __syncthreads();
  if (tid < kRows64) sm.q_unscale[tid] = logit_factor(sm.q_unscale[tid], logit_scale * kLog2e);
  __syncthreads();

  HmAcc acc;
  // Rows r0 and r0 + 8 rescaled by f, skipped where the warp's factors are all 1 (a tile that
  // leaves its heads' maxima).
  auto rescale = [&](const float(&f)[2]) {
    if (__any_sync(0xFFFFFFFFu, f[0] != 1.0f || f[1] != 1.0f)) acc.rescale(f);
  };
  HmTrace trace;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // warpgroup 0's rows r0 and r0 + 8
  const uint32_t tiles = begin < end ? (end - begin + kTileKeys - 1) / kTileKeys : 0;
  // The partial: unnormalised O with the true maximum (natural log units) and the sum, per head
  // (warpgroup 0's m and l). PartialOut: in o_partial and ml_partial. ClusterOut: in the two FP16
  // tiles (exactly the FP32 rows) and Q's first bytes, once both warpgroups are done with them;
  // warpgroup 0 then combines (cluster_combine, two threads a head) while warpgroup 1 only meets
  // the cluster's barriers. With the combine on both warpgroups' paths, ptxas scheduled warpgroup
  // 1's walk apart from the partials' build (all of the next tile's loads after kHmBarP; the walk
  // 6–8% slower on the H200); split this way, both loops compile as the partials' build's do
  // (scripts/sass_check.sh checks it; docs/performance.md, "Twenty-sixth session").
  auto finish = [&](const float* mm, const float* ll) {
    float* const cluster_rows = reinterpret_cast<float*>(sm.st);  // [64 heads][576]
    float* const cluster_ml = reinterpret_cast<float*>(sm.sq);    // [64 heads][2]
    if constexpr (Out::cluster) {
      named_barrier<256>(kHmBarDone);  // both warpgroups past their last tile: the tiles and Q are free
    } else {
      metrale::allow_next_kernel();
    }
    acc.template store<Share::kGrouped>(out, cluster_rows, num_q_heads, head0, s, z, r0, j, wg);
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t hb = r0 + 8 * h, head = head0 + hb;
      if (mm == nullptr || j != 0 || head >= num_q_heads) continue;
      float* const ml = out.ml((uint64_t{s} * num_q_heads + head) * gridDim.x + z, cluster_ml, hb);
      ml[0] = mm[h] * kLn2;
      ml[1] = ll[h];
    }
    if constexpr (Out::cluster) {
      if (wg == 0)
        cluster_combine<kRows64, 128>(out, cluster_rows, cluster_ml, s, head0, num_q_heads, z, gridDim.x);
      else
        cluster_combine_bystander();
    }
  };
  if (wg == 1) {
    for (uint32_t tile = begin, i = 0; tile < end; tile += kTileKeys, ++i) {
      const bool more = tile + kTileKeys < end;
      if (i > 0) named_barrier<256>(kHmBarRead);  // warpgroup 0's P·V done with the last tile
      trace.mark(0);
      if (more) {                              // the next tile into that tile's FP16 copy
        share.store(tile_at(i + 1), key_a, first);
        fence_to_async_proxy();  // the tile, for the tensor cores
      }
      trace.mark(1);
      named_barrier<256>(kHmBarP);  // P and the rescale factors written; the next tile converted
      trace.mark(2);
      const float* const alpha = sm.alpha + (i % 2) * kRows64;
      mbar_wait(sm.alpha_full + i % 2, (i / 2) % 2);
      const float f[2] = {alpha[r0], alpha[r0 + 8]};
      mbar_arrive(sm.alpha_empty + i % 2);
      rescale(f);
#ifdef METRALE_HM_P_REGS
      // Experiment (docs/performance.md, "Thirty-third session"): P's A fragments loaded once by
      // ldmatrix (8 KB a tile) rather than read by each of the five SS products a k-step (40 KB).
      uint32_t pw[4][4];
#pragma unroll
      for (uint32_t kk = 0; kk < 4; ++kk)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(pw[kk][0]), "=r"(pw[kk][1]), "=r"(pw[kk][2]), "=r"(pw[kk][3])
                     : "r"(smem_addr(sm.sp + swizzled(16 * warp + lane % 16, 2 * kk + lane / 16))));
      acc.issue_pv<1>(tile_at(i), pw, 0);
#else
      acc.issue_pv<1>(tile_at(i), {}, p_desc);
#endif
      if (more) named_arrive<256>(kHmBarPv);
      trace.mark(3);
      if constexpr (Share::kPinLoads) {
        // The rows' addresses plus f's sign bit, read after the kHmBarP wait, so that ptxas issues
        // the loads there. A factor is exp2 of a difference, never negative: the bit is 0, and a
        // NaN factor (NaN codes in the cache) gives 0 too, by the select.
        const uint32_t pin = f[0] == f[0] ? __float_as_uint(f[0]) >> 31 : 0u;
        typename Share::Key pinned[2] = {rows[0], rows[1]};
        for (auto& k : pinned) Share::pin(k, pin);
        share.load(pinned, first);
      } else {
        share.load(rows, first);  // tile i + 2, loading under this P·V
      }
      rows_of(tile + 3 * kTileKeys, entries, rows);  // under it: tile i + 3 located and prefetched,
      entries_of(tile + 4 * kTileKeys, entries);     // tile i + 4's entries read
      trace.mark(4);
      wgmma_wait<0>();
#ifdef METRALE_HM_P_REGS
      for (auto& r : pw)
        for (auto& x : r) pin(x);  // the wgmmas read them until here
#endif
      if (more) named_arrive<256>(kHmBarPFree);  // done with this tile and P
      trace.mark(5);
    }
    trace.flush(1, tiles);
    finish(nullptr, nullptr);
    return;
  }

  // Warpgroup 0: S, the online softmax (log2 units) over the tile's live keys, P.
  const uint64_t q_desc = smem_desc(smem_addr(sm.sq), 16, 1024);
  const float unscale[2] = {sm.q_unscale[r0], sm.q_unscale[r0 + 8]};
  float sacc[32];
  if (begin < end) hm_issue_s(sacc, q_desc, tile_at(0));
  wgmma_wait<0>();
  trace = HmTrace{};
  for (uint32_t tile = begin, i = 0; tile < end; tile += kTileKeys, ++i) {
    const bool more = tile + kTileKeys < end;
    float mx[2] = {-INFINITY, -INFINITY};
    const bool whole = tile + kTileKeys <= end;  // else keys past the chunk's end are masked
#pragma unroll
    for (uint32_t e = 0; e < 32; ++e) {
      const uint32_t c = 8 * (e / 4) + 2 * j + e % 2, h = (e % 4) / 2;
      sacc[e] = whole || tile + c < end ? sacc[e] * unscale[h] : -INFINITY;
      mx[h] = fmaxf(mx[h], sacc[e]);
    }
    float alpha[2], base[2];
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xFFFFFFFFu, mx[h], 2));
      const float next = fmaxf(m[h], mx[h]);
      base[h] = next == -INFINITY ? 0.0f : next;  // a row without keys yet: P = 0, not NaN
      alpha[h] = fast_exp2(m[h] - base[h]);
      m[h] = next;
      l[h] *= alpha[h];
    }
    uint32_t pa[4][4];  // P as the A fragments of P·V's four k-steps
#pragma unroll
    for (uint32_t e = 0; e < 32; e += 2) {
      const uint32_t h = (e % 4) / 2, kk = e / 8, c = (e % 8) / 2;  // A fragment kk, register c
      const float p0 = fast_exp2(sacc[e] - base[h]), p1 = fast_exp2(sacc[e + 1] - base[h]);
      l[h] += p0 + p1;
      pa[kk][c] = pack_f16(p0, p1);
    }
    trace.mark(0);
    if (i > 0) named_barrier<256>(kHmBarPFree);  // warpgroup 1 done with the last P
    trace.mark(1);
#pragma unroll
    for (uint32_t e = 0; e < 32; e += 2)  // P for warpgroup 1: row r0 + 8h, keys 8·(e/4) + 2j and + 1
      *reinterpret_cast<uint32_t*>(sm.sp + swizzled(r0 + 8 * ((e % 4) / 2), e / 4) + 4 * j) = pa[e / 8][(e % 8) / 2];
    if (i >= 2) mbar_wait(sm.alpha_empty + i % 2, (i / 2 - 1) % 2);  // read two tiles ago
    if (j == 0) sm.alpha[(i % 2) * kRows64 + r0] = alpha[0], sm.alpha[(i % 2) * kRows64 + r0 + 8] = alpha[1];
    mbar_arrive(sm.alpha_full + i % 2);
    fence_to_async_proxy();    // P, for the tensor cores
    trace.mark(2);
    named_barrier<256>(kHmBarP);  // P and the rescale factors written; the next tile converted
    trace.mark(3);
    rescale(alpha);
    acc.issue_pv<0>(tile_at(i), pa, p_desc);
    trace.mark(4);
    if (more) {  // the next tile's S behind both halves of it
      named_barrier<256>(kHmBarPv);
      trace.mark(5);
      hm_issue_s(sacc, q_desc, tile_at(i + 1));
      trace.mark(6);
      wgmma_wait<1>();
      named_arrive<256>(kHmBarRead);  // this P·V done with the tile
      trace.mark(7);
    }
    wgmma_wait<0>();
    trace.mark(8);
  }
  trace.flush(0, tiles);
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 1);
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 2);
  }
  finish(m, l);
}

}  // namespace

// ---------------------------------------------------------------------------
// mla_paged_decode_wgmma_fp8: mla_paged_decode_split_fp8 on warpgroup MMA (sm_90a), 64 heads per
// block, 64-key tiles, register operands (wgmma64_rs_decode). Same parameters, partial outputs
// and combine.
// Grid: [num_splits, ⌈num_q_heads/64⌉, num_seqs]. Block: 256. keys_per_split a multiple of 64.
// Dynamic shared memory: see core/mla_fast.cpp (wgmma_shared_bytes).
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache, float* o_partial,
                               float* ml_partial, const int32_t* block_tables, const int32_t* seq_lens,
                               uint32_t max_blocks_per_seq, uint32_t num_q_heads, uint32_t q_head_dim,
                               uint32_t kv_cache_dim, uint32_t block_size, float logit_scale, uint64_t cache_stride,
                               uint32_t sliding_window, const uint8_t* comp_pool, uint32_t comp_block_count,
                               uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma64_rs_decode(q, PartialOut{o_partial, ml_partial}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma_combine_fp8: mla_paged_decode_wgmma_fp8 and the combine in one kernel, as
// mla_paged_decode_wgmma16_rs_combine_fp8 does it for 16 heads: the num_splits ≤ 8 blocks of each
// (sequence, head group) are a cluster whose partials stay in shared memory (cluster_combine); o
// as mla_paged_decode_combine writes it, the same bits. Grid: as mla_paged_decode_wgmma_fp8,
// cluster [num_splits, 1, 1]. Block: 256.
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, 576] bf16, 8-byte aligned
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_combine_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                       const float* sinks, __nv_bfloat16* o, const int32_t* block_tables,
                                       const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                       uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size,
                                       float logit_scale, uint64_t cache_stride, uint32_t sliding_window,
                                       const uint8_t* comp_pool, uint32_t comp_block_count, uint32_t keys_per_split,
                                       float v_scale) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma64_rs_decode(q, ClusterOut{sinks, o, v_scale}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma_latent_fp8: mla_paged_decode_wgmma_fp8 over one latent pool (v_cache =
// k_cache and no compressed entries: the launcher refuses others) with the heads in the wgmma's M
// (wgmma_hm_decode): each tile converted once to FP16 for both products. Same parameters, grid,
// partial outputs and combine. Block: 256.
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_latent_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                      float* o_partial, float* ml_partial, const int32_t* block_tables,
                                      const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                      uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size,
                                      float logit_scale, uint64_t cache_stride, uint32_t sliding_window,
                                      const uint8_t* comp_pool, uint32_t comp_block_count, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma_hm_decode(q, PartialOut{o_partial, ml_partial}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma_latent_combine_fp8: mla_paged_decode_wgmma_latent_fp8 and the combine in
// one kernel, as mla_paged_decode_wgmma_combine_fp8 does it for the register-operand block: the
// num_splits ≤ 8 blocks of each (sequence, head group) are a cluster whose partials stay in shared
// memory (cluster_combine, from the two FP16 tiles' bytes); o as mla_paged_decode_combine writes
// it, the same bits. Grid: as mla_paged_decode_wgmma_latent_fp8, cluster [num_splits, 1, 1].
// Block: 256.
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, 576] bf16, 8-byte aligned
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_latent_combine_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                              const float* sinks, __nv_bfloat16* o, const int32_t* block_tables,
                                              const int32_t* seq_lens, uint32_t max_blocks_per_seq,
                                              uint32_t num_q_heads, uint32_t q_head_dim, uint32_t kv_cache_dim,
                                              uint32_t block_size, float logit_scale, uint64_t cache_stride,
                                              uint32_t sliding_window, const uint8_t* comp_pool,
                                              uint32_t comp_block_count, uint32_t keys_per_split, float v_scale) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma_hm_decode(q, ClusterOut{sinks, o, v_scale}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma_nvfp4: mla_paged_decode_wgmma_fp8 over an NVFP4 cache (wgmma64_rs_decode:
// each key's data rows and their scales staged raw); logit_scale is inv_sqrt_d.
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                 float* o_partial, float* ml_partial, const int32_t* block_tables,
                                 const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                 uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                 uint64_t block_stride_bytes, uint64_t data_section_bytes, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  wgmma64_rs_decode(q, PartialOut{o_partial, ml_partial}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma_latent_nvfp4: mla_paged_decode_wgmma_nvfp4 over one latent pool (v_cache =
// k_cache: the launcher refuses others) on the heads-in-M block (wgmma_hm_decode), as
// mla_paged_decode_wgmma_latent_fp8 runs it for FP8: each tile's data rows and scales converted
// once to FP16 for both products. Same parameters, grid, partial outputs and combine. Block: 256.
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_latent_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                        float* o_partial, float* ml_partial, const int32_t* block_tables,
                                        const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                        uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size,
                                        float logit_scale, uint64_t block_stride_bytes, uint64_t data_section_bytes,
                                        uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  wgmma_hm_decode(q, PartialOut{o_partial, ml_partial}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma_latent_combine_nvfp4: mla_paged_decode_wgmma_latent_nvfp4 and the combine in
// one kernel, as mla_paged_decode_wgmma_latent_combine_fp8 does it for FP8 (V unscaled): the
// num_splits ≤ 8 blocks of each (sequence, head group) are a cluster whose partials stay in
// shared memory; o as mla_paged_decode_combine writes it (v_scale 1), the same bits. Grid: as
// mla_paged_decode_wgmma_latent_nvfp4, cluster [num_splits, 1, 1]. Block: 256.
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, 576] bf16, 8-byte aligned
extern "C" __global__ void __launch_bounds__(256, 1)
    mla_paged_decode_wgmma_latent_combine_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                                const float* sinks, __nv_bfloat16* o, const int32_t* block_tables,
                                                const int32_t* seq_lens, uint32_t max_blocks_per_seq,
                                                uint32_t num_q_heads, uint32_t q_head_dim, uint32_t kv_cache_dim,
                                                uint32_t block_size, float logit_scale, uint64_t block_stride_bytes,
                                                uint64_t data_section_bytes, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  wgmma_hm_decode(q, ClusterOut{sinks, o, 1.0f}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma16_fp8: the same on 16-head blocks (warp-specialised, transposed).
// Grid: [num_splits, ⌈num_q_heads/16⌉, num_seqs]. Block: 384. keys_per_split a multiple of 64.
extern "C" __global__ void __launch_bounds__(384, 1)
    mla_paged_decode_wgmma16_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                 float* o_partial, float* ml_partial, const int32_t* block_tables,
                                 const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                 uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                 uint64_t cache_stride, uint32_t sliding_window, const uint8_t* comp_pool,
                                 uint32_t comp_block_count, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma16_producers_decode(q, o_partial, ml_partial, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma16_rs_fp8: the same on 16-head blocks of one warpgroup with register A
// operands (wgmma16_rs_decode). Grid: as mla_paged_decode_wgmma16_fp8. Block: 128, two per SM.
extern "C" __global__ void __launch_bounds__(128, 2)
    mla_paged_decode_wgmma16_rs_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                    float* o_partial, float* ml_partial, const int32_t* block_tables,
                                    const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                    uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                    uint64_t cache_stride, uint32_t sliding_window, const uint8_t* comp_pool,
                                    uint32_t comp_block_count, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma16_rs_decode(q, PartialOut{o_partial, ml_partial}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma16_rs_combine_fp8: mla_paged_decode_wgmma16_rs_fp8 and the combine in one
// kernel: the num_splits ≤ 8 blocks of each (sequence, head group) are a cluster whose partials
// stay in shared memory (cluster_combine); o as mla_paged_decode_combine writes it, the same
// bits. Grid: as mla_paged_decode_wgmma16_rs_fp8, cluster [num_splits, 1, 1]. Block: 128.
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, 576] bf16, 8-byte aligned
extern "C" __global__ void __launch_bounds__(128, 2)
    mla_paged_decode_wgmma16_rs_combine_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                            const float* sinks, __nv_bfloat16* o, const int32_t* block_tables,
                                            const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                            uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size,
                                            float logit_scale, uint64_t cache_stride, uint32_t sliding_window,
                                            const uint8_t* comp_pool, uint32_t comp_block_count,
                                            uint32_t keys_per_split, float v_scale) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  wgmma16_rs_decode(q, ClusterOut{sinks, o, v_scale}, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma16_nvfp4: the same over an NVFP4 cache, warp-specialised. Block: 384.
extern "C" __global__ void __launch_bounds__(384, 1)
    mla_paged_decode_wgmma16_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                   float* o_partial, float* ml_partial, const int32_t* block_tables,
                                   const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                   uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                   uint64_t block_stride_bytes, uint64_t data_section_bytes, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  wgmma16_producers_decode(q, o_partial, ml_partial, num_q_heads, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_wgmma16_rs_nvfp4: the same over an NVFP4 cache on one warpgroup with register A
// operands (wgmma16_rs_decode: each key's data and scale rows staged raw, converted in the
// registers of the threads whose fragments hold them). Grid: as mla_paged_decode_wgmma16_nvfp4.
// Block: 128, two per SM.
extern "C" __global__ void __launch_bounds__(128, 2)
    mla_paged_decode_wgmma16_rs_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                      float* o_partial, float* ml_partial, const int32_t* block_tables,
                                      const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                      uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size,
                                      float logit_scale, uint64_t block_stride_bytes, uint64_t data_section_bytes,
                                      uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  wgmma16_rs_decode(q, PartialOut{o_partial, ml_partial}, num_q_heads, logit_scale, keys_per_split, rows);
}
