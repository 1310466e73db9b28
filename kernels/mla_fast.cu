// Module mla_fast: the fast paths of the DeepSeek decode (issue 6), beside the seed kernels of
// mla_absorbed, which keep the ABI. Each kernel reads like its port in emu/mla_fast.cpp.
//
// The head-grouped split-KV paged decode: a block takes G = 16·R query heads of one sequence
// against one chunk of its keys, dequantises each 32-key tile once into shared memory as FP16
// (exact: E4M3 and E2M1·E4M3 values fit FP16; E4M3 converts in one instruction per pair, where
// BF16 took four) and serves all G heads from it with mma.sync m16n8k16 (FP16 in, FP32
// accumulate; sm_80 and later, so it builds for sm_90 and sm_121 alike). Q enters FP16 scaled
// per row by a power of two that keeps it in range (q_scale_of), P as FP16 (finer than BF16 on
// [2^-16, 1], within 2^-25 below). K and V take turns in one FP16 tile buffer: K for Q·Kᵀ, then
// V for P·V, which halves the block's footprint. Warp (r, c) of the 4R warps owns rows
// 16r..16r+15 and, for P·V, the output dims [c·D/4, (c+1)·D/4); for Q·Kᵀ it computes keys
// 8c..8c+7 of the tile. An online softmax runs across tiles; the block writes its unnormalised
// partial output with the running max and sum, and mla_paged_decode_combine merges the chunks
// (log-sum-exp), counting sinks once.
//
// Staged or direct: when the launch gives the block room for a raw tile (the host's plan does
// where the device's shared memory allows it), the tile's cache bytes are copied into shared
// memory with cp.async, K and V as two groups: the next tile's K streams in under this tile's
// Q·Kᵀ, softmax and V, and its V under this tile's P·V; row addresses are looked up a tile earlier
// still. Without that room (where it would cost the SM a block, as for 32-head blocks of
// DeepSeek rows on sm_90, or does not fit), each half-tile is loaded into registers and
// converted when it is needed. 16-head blocks run on their own entries (split16), whose
// 128-thread launch bound leaves each thread the registers to hold its share of a half-tile a
// phase ahead of its conversion. All give bit-identical results.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "device_common.cuh"
#include "device_formats.cuh"
#include "split_common.cuh"

using metrale::allow_next_kernel;
using metrale::exp_below;
using metrale::key_set;
using metrale::KeySet;
using metrale::kWarp;
using metrale::segment_sum;
using metrale::wait_for_previous_kernel;
using metrale::warp_max;
using metrale::warp_sum;
using namespace metrale::split;

namespace {

constexpr uint32_t kTileKeys = 32;                  // keys per shared-memory tile
constexpr uint32_t kGroupRows = 16;                 // heads per MMA row group
constexpr uint32_t kMaxDim = 576;                   // kv_cache_dim the register budget allows
constexpr uint32_t kMaxDimTiles = kMaxDim / 4 / 8;  // n8 tiles of one warp's quarter of the dims
constexpr uint32_t kMaxQUnits = (kMaxDim / 8 + kWarp - 1) / kWarp;  // 16-byte units of a Q row per lane
constexpr uint32_t kPad = 8;                        // FP16 elements of row padding: ldmatrix without bank conflicts
constexpr uint32_t kPRow = kTileKeys + kPad;


__device__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a·b for one 16×8 tile: a 16×16 FP16 (row), b 16×8 FP16 (col), d FP32.
__device__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


// The shared-memory carve-up; the host computes the same totals (core/mla_fast.cpp,
// split_shared_bytes). `raw` is null when the launch gave no room for a raw tile.
struct Smem {
  __half *q, *kv, *p;  // kv: the tile's K, then its V
  float *red_max, *red_sum;
  float* q_unscale;      // per row: 2^-e, the inverse of the power of two Q was scaled by; the
                         // head of red_max, read into registers before the first tile's barrier
  const uint8_t** rows;  // per tile key: K data, K scales, V data, V scales; two tiles (row_set)
  uint8_t* raw;          // a tile's cache bytes, raw_pitch per key
  uint32_t pitch;        // of q and kv rows, in elements
};

__device__ Smem carve(uint8_t* base, uint32_t rows_per_block, uint32_t dim, uint32_t raw_pitch) {
  Smem s;
  s.pitch = dim + kPad;
  s.q = reinterpret_cast<__half*>(base);
  s.kv = s.q + rows_per_block * s.pitch;
  s.p = s.kv + kTileKeys * s.pitch;
  s.red_max = reinterpret_cast<float*>(s.p + rows_per_block * kPRow);
  s.red_sum = s.red_max + rows_per_block * 4;
  s.q_unscale = s.red_max;
  s.rows = reinterpret_cast<const uint8_t**>(s.red_sum + rows_per_block * 4);
  s.raw = reinterpret_cast<uint8_t*>(s.rows + 2 * 4 * kTileKeys);
  if (dynamic_smem_bytes() < static_cast<uint32_t>(s.raw - base) + kTileKeys * raw_pitch) s.raw = nullptr;
  return s;
}


// Row set `i` (0 or 1) of the two tiles' row pointers.
__device__ const uint8_t** row_set(const Smem& s, uint32_t i) { return s.rows + i * 4 * kTileKeys; }


// The split decode over any cache format. A tile is dequantised in two halves, h = 0 (K) and
// h = 1 (V). `Rows` holds the sequence's key set (`keys`) and gives, for key j: `entry(j)` its
// block-table entry and `locate(j, entry, rows)` its four row pointers; direct:
// `load(rows, part, h)` fetches elements [16·part, 16·part+16) of half h's row as a `Raw`;
// staged: `stage(rows, dst, u, h)` copies unit u of half h's `copy_units()` into the key's
// `raw_pitch()` bytes of shared memory and `staged(src, part, h)` reads a `Raw` back;
// `convert(raw, dst)` writes 16 FP16 values.
// kHeld > 0 (the 16-head entries, 128 threads with room for more registers): each thread holds
// its kHeld units of a half-tile in registers, loaded a phase before they are converted — V
// under Q·Kᵀ and the softmax, the next tile's K under P·V — instead of staging or loading them
// when needed.
template <uint32_t kHeld, class Rows>
__device__ void split_decode(const __nv_bfloat16* q, float* o_partial, float* ml_partial, uint32_t num_q_heads,
                             uint32_t q_head_dim, uint32_t dim, float logit_scale, uint32_t keys_per_split,
                             const Rows& layout) {
  const KeySet& keys = layout.keys;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t R = blockDim.x / (4 * kWarp), G = R * kGroupRows;
  const Smem sm = carve(smem_raw, G, dim, layout.raw_pitch());
  const bool staged = kHeld == 0 && sm.raw != nullptr;
  const bool rows_ahead = staged || kHeld > 0;  // rows looked up a tile before their loads
  const uint32_t tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, r = warp / 4, c = warp % 4;
  const uint32_t z = blockIdx.x, head0 = blockIdx.y * G, s = blockIdx.z, num_splits = gridDim.x;
  const Chunk chunk = chunk_of(keys, z, keys_per_split);
  const uint32_t begin = chunk.begin, end = chunk.end;
  const uint32_t parts = dim / 16;  // 16-element units of a row

  // Warp 0 looks up the rows of the tile's keys (lane = key).
  auto locate_tile = [=](uint32_t tile, const uint8_t** rows) {
    if (warp == 0 && tile + lane < end) layout.locate(tile + lane, layout.entry(tile + lane), rows + 4 * lane);
  };
  // Staged: start copying half h of the tile's raw bytes into shared memory, as one commit group
  // (empty past the end, so that every tile commits two).
  const UnitWalk copy_walk(layout.copy_units());
  auto stage_half = [=](uint32_t tile, const uint8_t* const* rows, uint32_t h) {
    const uint32_t live = tile < end ? min(kTileKeys, end - tile) : 0;
    for (UnitWalk w = copy_walk; w.key < live; w.next())
      layout.stage(rows + 4 * w.key, sm.raw + w.key * layout.raw_pitch(), w.part, h);
    cp_async_commit();
  };
  // Half h of the tile as FP16 in sm.kv, dequantised once for all G heads; zeros for a key past
  // the end, not garbage: 0 · NaN would poison P·V. Rows::kBatch units per thread (as many as
  // the registers allow): all their loads, from the staged tile or from global memory, are
  // issued before the first conversion.
  const UnitWalk part_walk(parts);
  auto dequant_half = [=](uint32_t tile, uint32_t h) {
    constexpr uint32_t kBatch = Rows::kBatch;
    const uint32_t live = min(kTileKeys, end - tile);
    for (UnitWalk w = part_walk; w.key < kTileKeys;) {
      typename Rows::Raw raw[kBatch];
      uint32_t key[kBatch], dst[kBatch];  // dst: element offset in sm.kv
#pragma unroll
      for (uint32_t b = 0; b < kBatch; ++b, w.next()) {
        key[b] = w.key;
        dst[b] = w.key * sm.pitch + w.part * 16;
        if (w.key >= live) continue;
        raw[b] = staged ? layout.staged(sm.raw + w.key * layout.raw_pitch(), w.part, h)
                        : layout.load(row_set(sm, 0) + 4 * w.key, w.part, h);
      }
#pragma unroll
      for (uint32_t b = 0; b < kBatch; ++b) {
        if (key[b] >= kTileKeys) break;
        if (key[b] < live) {
          uint32_t words[8];
          layout.convert(raw[b], words);
          store_f16x16(sm.kv + dst[b], words);
        } else {
          st_shared_v4(sm.kv + dst[b], 0, 0, 0, 0);
          st_shared_v4(sm.kv + dst[b] + 8, 0, 0, 0, 0);
        }
      }
    }
  };

  // kHeld > 0: the thread's units of half h of the tile into registers, and from there as FP16
  // into sm.kv (zeros past the end). kHeld covers every unit: 32 keys · 36 parts / 128 threads.
  typename Rows::Raw held[kHeld > 0 ? kHeld : 1];
  auto load_held = [&](uint32_t tile, const uint8_t* const* rows, uint32_t h) {
    if constexpr (kHeld > 0) {
      const uint32_t live = tile < end ? min(kTileKeys, end - tile) : 0;
      UnitWalk w = part_walk;
#pragma unroll
      for (uint32_t b = 0; b < kHeld; ++b, w.next())
        if (w.key < live) held[b] = layout.load(rows + 4 * w.key, w.part, h);
    }
  };
  auto store_held = [&](uint32_t tile) {
    if constexpr (kHeld > 0) {
      const uint32_t live = min(kTileKeys, end - tile);
      UnitWalk w = part_walk;
#pragma unroll
      for (uint32_t b = 0; b < kHeld; ++b, w.next()) {
        if (w.key >= kTileKeys) break;
        __half* dst = sm.kv + w.key * sm.pitch + w.part * 16;
        if (w.key < live) {
          uint32_t words[8];
          layout.convert(held[b], words);
          store_f16x16(dst, words);
        } else {
          st_shared_v4(dst, 0, 0, 0, 0);
          st_shared_v4(dst + 8, 0, 0, 0, 0);
        }
      }
    }
  };

  // Q rows of this head group as FP16 (rows past num_q_heads are zero).
  load_q_rows<kMaxQUnits>(q, s, head0, G, num_q_heads, q_head_dim, sm.q_unscale,
                          [&](uint32_t row, uint32_t part) { return sm.q + row * sm.pitch + 8 * part; });
  // Prologue: the rows of tile 0 (rows_ahead: and of tile 1); staged, tile 0's K and V in flight
  // and its K landed; held, its K in registers.
  locate_tile(begin, row_set(sm, 0));
  __syncthreads();
  if (staged) {
    stage_half(begin, row_set(sm, 0), 0);
    stage_half(begin, row_set(sm, 0), 1);
  }
  if constexpr (kHeld > 0) load_held(begin, row_set(sm, 0), 0);
  if (rows_ahead) locate_tile(begin + kTileKeys, row_set(sm, 1));
  if (staged) {
    cp_async_wait_all_but_newest();
    __syncthreads();
  }

  float acc[kMaxDimTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows lane/4 and lane/4 + 8 of group r
  // Each row's unscale factor times the logit scale (logit_factor), then the dot products (as the
  // wgmma entries take it): Q·Kᵀ of a row scaled up from near FP32's top times 2^-e alone could
  // pass FP32 where the logit, under a small scale, does not.
  const float q_down[2] = {logit_factor(sm.q_unscale[16 * r + lane / 4], logit_scale),
                           logit_factor(sm.q_unscale[16 * r + lane / 4 + 8], logit_scale)};
  const uint32_t dim_tiles = dim / 4 / 8;
  for (uint32_t tile = begin, i = 0; tile < end; tile += kTileKeys, ++i) {
    // Phase A: the tile's K as FP16 in shared memory (its rows, and staged its bytes, are there
    // since the last barrier).
    const uint32_t cur = i % 2;
    if constexpr (kHeld > 0) {
      store_held(tile);
    } else {
      dequant_half(tile, 0);
    }
    __syncthreads();
    if (staged) stage_half(tile + kTileKeys, row_set(sm, cur ^ 1), 0);  // under phases B-D
    if constexpr (kHeld > 0) load_held(tile, row_set(sm, cur), 1);      // V, under phases B-C
    // The tile whose rows warp 0 looks up at the end of this one (rows_ahead: two on, into this
    // tile's set; direct: the next, into set 0), and its table entry for key `lane`, early.
    const uint32_t next_rows = tile + (rows_ahead ? 2 : 1) * kTileKeys;
    const int32_t ahead = warp == 0 && next_rows + lane < end ? layout.entry(next_rows + lane) : 0;
    // Phase B: S = Q·Kᵀ for rows 16r.. and keys 8c..8c+7 of the tile, in two independent
    // accumulators (even and odd 16-wide steps) so that consecutive MMAs do not wait on each other.
    float sacc[2][4] = {};
    for (uint32_t k0 = 0; k0 < q_head_dim; k0 += 32) {
      uint32_t b[4], a[4];
      ldmatrix_x4(b, sm.kv + (8 * c + lane % 8) * sm.pitch + k0 + (lane / 8) * 8);
      ldmatrix_x4(a, sm.q + (16 * r + lane % 16) * sm.pitch + k0 + (lane / 16) * 8);
      mma_f16(sacc[0], a, b[0], b[1]);
      ldmatrix_x4(a, sm.q + (16 * r + lane % 16) * sm.pitch + k0 + 16 + (lane / 16) * 8);
      mma_f16(sacc[1], a, b[2], b[3]);
    }
    const uint32_t key0 = 8 * c + 2 * (lane % 4);
    float sv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      sv[e] = tile + key0 + (e % 2) < end ? (sacc[0][e] + sacc[1][e]) * q_down[e / 2] : -INFINITY;
    // Phase C: online softmax across the row group's four warps.
    float mx[2] = {fmaxf(sv[0], sv[1]), fmaxf(sv[2], sv[3])};
#pragma unroll
    for (int i = 0; i < 2; ++i)
      for (uint32_t off = 1; off < 4; off *= 2) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], off));
    const uint32_t row0 = 16 * r + lane / 4;
    if (lane % 4 == 0) {
      sm.red_max[(row0)*4 + c] = mx[0];
      sm.red_max[(row0 + 8) * 4 + c] = mx[1];
    }
    __syncthreads();
    float alpha[2], p[4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float* red = sm.red_max + (row0 + 8 * i) * 4;
      const float m_new = fmaxf(m[i], fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])));
      alpha[i] = expf(m[i] - m_new);
      p[2 * i] = expf(sv[2 * i] - m_new);
      p[2 * i + 1] = expf(sv[2 * i + 1] - m_new);
      m[i] = m_new;
    }
    float ps[2] = {p[0] + p[1], p[2] + p[3]};
#pragma unroll
    for (int i = 0; i < 2; ++i)
      for (uint32_t off = 1; off < 4; off *= 2) ps[i] += __shfl_xor_sync(0xFFFFFFFFu, ps[i], off);
    if (lane % 4 == 0) {
      sm.red_sum[row0 * 4 + c] = ps[0];
      sm.red_sum[(row0 + 8) * 4 + c] = ps[1];
    }
    *reinterpret_cast<uint32_t*>(sm.p + row0 * kPRow + key0) = pack_f16(p[0], p[1]);
    *reinterpret_cast<uint32_t*>(sm.p + (row0 + 8) * kPRow + key0) = pack_f16(p[2], p[3]);
    // Staged, the groups in flight are this tile's V and the next tile's K: wait for V. The
    // barrier also ends phase B everywhere, so K's buffer is free for V (and direct, set 0's
    // rows are read for the last time below).
    if (staged) cp_async_wait_all_but_newest();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float* red = sm.red_sum + (row0 + 8 * i) * 4;
      l[i] = l[i] * alpha[i] + ((red[0] + red[1]) + (red[2] + red[3]));
    }
    if constexpr (kHeld > 0) {
      store_held(tile);
    } else {
      dequant_half(tile, 1);
    }
    __syncthreads();
    if (staged) stage_half(tile + kTileKeys, row_set(sm, cur ^ 1), 1);              // under phase D and the next K
    if constexpr (kHeld > 0) load_held(tile + kTileKeys, row_set(sm, cur ^ 1), 0);  // under phase D
    // Phase D: O = O·alpha + P·V over this warp's quarter of the dims (no rescale when no row's
    // max moved: a multiplication by 1 changes nothing).
    if (!__all_sync(0xFFFFFFFFu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
      for (uint32_t t = 0; t < kMaxDimTiles; ++t) {
        acc[t][0] *= alpha[0];
        acc[t][1] *= alpha[0];
        acc[t][2] *= alpha[1];
        acc[t][3] *= alpha[1];
      }
    }
#pragma unroll
    for (uint32_t kk = 0; kk < kTileKeys; kk += 16) {
      uint32_t a[4];
      ldmatrix_x4(a, sm.p + (16 * r + lane % 16) * kPRow + kk + (lane / 16) * 8);
#pragma unroll
      for (uint32_t t = 0; t < kMaxDimTiles; t += 2) {
        if (t >= dim_tiles) break;
        uint32_t b[4];
        const uint32_t n0 = c * (dim / 4) + 8 * t;
        ldmatrix_x4_trans(b, sm.kv + (kk + lane % 8 + ((lane / 8) % 2) * 8) * sm.pitch + n0 + (lane / 16) * 8);
        mma_f16(acc[t], a, b[0], b[1]);
        mma_f16(acc[t + 1], a, b[2], b[3]);
      }
    }
    // The rows of `next_rows` (their set's loads and copies are all issued); staged, the next
    // tile's K landed (its V may still be in flight).
    if (warp == 0 && next_rows + lane < end)
      layout.locate(next_rows + lane, ahead, row_set(sm, rows_ahead ? cur : 0) + 4 * lane);
    if (staged) cp_async_wait_all_but_newest();
    __syncthreads();  // the next tile rewrites K (V's buffer) and P, and reads the rows
  }
  if (staged) cp_async_wait_all();  // nothing left in flight past the end (empty groups)
  // The block's partial: unnormalised O with its running max and sum, per head.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t h = head0 + 16 * r + lane / 4 + 8 * i;
    if (h >= num_q_heads) continue;
    const uint64_t slot = (uint64_t{s} * num_q_heads + h) * num_splits + z;
#pragma unroll
    for (uint32_t t = 0; t < kMaxDimTiles; ++t) {
      if (t >= dim_tiles) break;
      const uint32_t d = c * (dim / 4) + 8 * t + 2 * (lane % 4);
      o_partial[slot * dim + d] = acc[t][2 * i];
      o_partial[slot * dim + d + 1] = acc[t][2 * i + 1];
    }
    if (c == 0 && lane % 4 == 0) {
      ml_partial[2 * slot] = m[i];
      ml_partial[2 * slot + 1] = l[i];
    }
  }
}

// Units of a half-tile a 16-head block's thread holds: 32 keys · (576 / 16) parts / 128 threads.
constexpr uint32_t kHeld16 = kTileKeys * (kMaxDim / 16) / 128;

}  // namespace

// ---------------------------------------------------------------------------
// mla_paged_decode_split_fp8: head-grouped split-KV paged decode over an E4M3 cache (one KV head).
// Grid: [num_splits, ⌈num_q_heads/G⌉, num_seqs], G = 16·R. Block: 128·R (R = 1..4).
// Dynamic shared memory: see core/mla_fast.cpp (split_shared_bytes).
//   q            [num_seqs, num_q_heads, q_head_dim]                        bf16
//   k_cache      row of slot at slot·cache_stride                           e4m3 [kv_cache_dim]
//   v_cache      as k_cache
//   o_partial    [num_seqs, num_q_heads, num_splits, kv_cache_dim]          f32, unnormalised
//   ml_partial   [num_seqs, num_q_heads, num_splits, 2] (running max, sum)  f32
//   block_tables [num_seqs, max_blocks_per_seq] int32; seq_lens [num_seqs] int32
//   comp_pool    [num_seqs, comp_block_count, 2, cache_stride] e4m3 or null
// Split z takes keys [z·keys_per_split, (z+1)·keys_per_split) of the key set; logit_scale is
// inv_sqrt_d·k_scale (V's scale is applied by the combine).
extern "C" __global__ void __launch_bounds__(512)
    mla_paged_decode_split_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache, float* o_partial,
                               float* ml_partial, const int32_t* block_tables, const int32_t* seq_lens,
                               uint32_t max_blocks_per_seq, uint32_t num_q_heads, uint32_t q_head_dim,
                               uint32_t kv_cache_dim, uint32_t block_size, float logit_scale, uint64_t cache_stride,
                               uint32_t sliding_window, const uint8_t* comp_pool, uint32_t comp_block_count,
                               uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  split_decode<0>(q, o_partial, ml_partial, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_split16_fp8: the same for 16-head blocks (R = 1, block 128), each thread
// holding its share of a half-tile in registers a phase ahead (the 128-thread launch bound gives
// it up to 168 registers at three blocks per SM); never staged.
extern "C" __global__ void __launch_bounds__(128, 3)
    mla_paged_decode_split16_fp8(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                 float* o_partial, float* ml_partial, const int32_t* block_tables,
                                 const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                 uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                 uint64_t cache_stride, uint32_t sliding_window, const uint8_t* comp_pool,
                                 uint32_t comp_block_count, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Fp8Rows rows = fp8_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim, block_size,
                                cache_stride, sliding_window, comp_pool, comp_block_count);
  split_decode<kHeld16>(q, o_partial, ml_partial, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, keys_per_split,
                        rows);
}

// ---------------------------------------------------------------------------
// mla_paged_decode_split_nvfp4: the same over an NVFP4 cache (block layout as SPEC §3).
// Grid, block and the partial outputs as for FP8; logit_scale is inv_sqrt_d.
extern "C" __global__ void __launch_bounds__(512)
    mla_paged_decode_split_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                 float* o_partial, float* ml_partial, const int32_t* block_tables,
                                 const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                 uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                 uint64_t block_stride_bytes, uint64_t data_section_bytes, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  split_decode<0>(q, o_partial, ml_partial, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, keys_per_split, rows);
}

// mla_paged_decode_split16_nvfp4: the 16-head entry over an NVFP4 cache, as split16_fp8.
extern "C" __global__ void __launch_bounds__(128, 3)
    mla_paged_decode_split16_nvfp4(const __nv_bfloat16* q, const uint8_t* k_cache, const uint8_t* v_cache,
                                   float* o_partial, float* ml_partial, const int32_t* block_tables,
                                   const int32_t* seq_lens, uint32_t max_blocks_per_seq, uint32_t num_q_heads,
                                   uint32_t q_head_dim, uint32_t kv_cache_dim, uint32_t block_size, float logit_scale,
                                   uint64_t block_stride_bytes, uint64_t data_section_bytes, uint32_t keys_per_split) {
  wait_for_previous_kernel();  // launched early: whatever wrote q, the cache or the tables
  const Nvfp4Rows rows = nvfp4_rows(k_cache, v_cache, block_tables, seq_lens, max_blocks_per_seq, kv_cache_dim,
                                    block_size, block_stride_bytes, data_section_bytes);
  split_decode<kHeld16>(q, o_partial, ml_partial, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, keys_per_split,
                        rows);
}

// ---------------------------------------------------------------------------
// mla_paged_decode_combine: o = v_scale · Σ_z e^(m_z − M)·O_z / (Σ_z e^(m_z − M)·l_z + e^(sink − M)),
// M = max(max_z m_z, sink), over the chunks z with keys (l_z ≠ 0: a NaN l_z, from NaN or inf in q,
// counts and makes the head's output NaN, as the seed kernel's); the sink (when sinks is not
// null) counts once; no keys writes zeros, whatever the sink.
// Grid: [num_q_heads, num_seqs, dim_blocks]. Block: 256. The dims fall in 64-wide tiles, dealt
// to the dim_blocks blocks of a head in runs of ⌈tiles/dim_blocks⌉ (the launcher raises
// dim_blocks until small problems fill the device: one sequence of 16 heads is 16 blocks
// otherwise). Every block finds M and the denominator with all its threads, writes the chunks'
// weights e^(m_z − M) once to shared memory (kCombineSkip for a chunk without keys), and splits
// its threads into `lanes` lanes (combine_lanes) of 256/lanes dims (combine_dims): a dim's
// chunks that have keys are summed by residue mod 4, eight loads in flight (every chunk's row is
// read, to keep them so; a chunk without keys is not counted, whatever its row holds), and the
// four sums added in order: a dim's result depends neither on the lanes nor on dim_blocks. Up
// to four chunks take combine_few instead: the same bits without barriers or shared memory.
//   o_partial [num_seqs, num_q_heads, num_splits, kv_cache_dim] f32; ml_partial [.., 2] f32
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, kv_cache_dim] bf16
constexpr uint32_t kCombineDims = 64, kCombineBatch = 1024;  // dims of a tile; chunks' weights at a time
constexpr uint32_t kCombineInFlight = 8;                     // chunks' loads a thread has in flight

// Lanes of chunks per dim: as many as keep the 256 threads busy on a block's run of 64-dim tiles
// (4 for one tile, 2 for two, else 1), and no more than the chunks (a pass then takes 256/lanes
// dims).
__device__ uint32_t combine_lanes(uint32_t num_splits, uint32_t tiles_per_block) {
  const uint32_t by_tiles = tiles_per_block == 1 ? 4 : tiles_per_block == 2 ? 2 : 1;
  const uint32_t by_chunks = num_splits >= 4 ? 4 : num_splits >= 2 ? 2 : 1;
  return min(by_tiles, by_chunks);
}

// Up to four chunks (short contexts): every thread finds M, the denominator and the weights
// itself (chunk_weights), with no barrier and no shared memory, adding the denominator's terms
// as the block reductions of the general path do, and each dim's chunks in residues, so the bits
// are the general path's.
__device__ void combine_few(const float* o_partial, const float* ml, const float* sink, uint32_t num_splits,
                            uint32_t dim, float v_scale, uint32_t d_begin, uint32_t d_end, __nv_bfloat16* out) {
  float m[4], l[4], w[4];
#pragma unroll
  for (uint32_t z = 0; z < 4; ++z) {
    m[z] = z < num_splits ? ml[2 * z] : 0.0f;
    l[z] = z < num_splits ? ml[2 * z + 1] : 0.0f;
  }
  const float inv = chunk_weights(m, l, num_splits, sink, v_scale, w);
  for (uint32_t d = d_begin + threadIdx.x; d < d_end; d += blockDim.x) {
    float acc[4] = {};
#pragma unroll
    for (uint32_t z = 0; z < 4; ++z)
      acc[z] += combine_term(w[z], z < num_splits ? o_partial[uint64_t{z} * dim + d] : 0.0f);
    out[d] = __float2bfloat16_rn((((acc[0] + acc[1]) + acc[2]) + acc[3]) * inv);
  }
}

// What combine_dims reads: a head's partial rows, the chunks' weights and the lanes' exchange.
struct CombineRows {
  const float* o_partial;  // [num_splits, dim] of the (sequence, head)
  const float* weight;     // shared: e^(m_z − M) of the current batch, or kCombineSkip
  float* lane_sum;         // shared: [2][256]
  uint32_t dim, num_splits;
  float inv;  // v_scale / denominator
};

// The dims [d_begin, d_end) of a head, in passes of 256/kLanes dims: thread (lane, dim) sums the
// chunks ≡ lane + j·kLanes (mod 4) into acc[j], eight loads in flight, and the dim's result is
// ((r0 + r1) + r2) + r3 over the residues mod 4, whatever kLanes and the grid are.
template <uint32_t kLanes, class Fill>
__device__ void combine_dims(const CombineRows& r, uint32_t d_begin, uint32_t d_end, bool one_batch,
                             const Fill& fill_weights, __nv_bfloat16* out) {
  constexpr uint32_t kWidth = 256 / kLanes, kResidues = 4 / kLanes;  // dims of a pass; sums a thread keeps
  const uint32_t tid = threadIdx.x, lane = tid / kWidth;
  for (uint32_t d0 = d_begin; d0 < d_end; d0 += kWidth) {
    const uint32_t d = d0 + tid % kWidth;
    float acc[kResidues] = {};
    for (uint32_t z0 = 0; z0 < r.num_splits; z0 += kCombineBatch) {
      if (!one_batch) fill_weights(z0);
      const uint32_t n = min(kCombineBatch, r.num_splits - z0);
      if (d < d_end) {
        for (uint32_t z = lane; z < n; z += kCombineInFlight * kLanes) {  // z ≡ lane (mod 4)
          float w[kCombineInFlight], v[kCombineInFlight];
#pragma unroll
          for (uint32_t i = 0; i < kCombineInFlight; ++i) {
            const uint32_t c = z + i * kLanes;
            w[i] = c < n ? r.weight[c] : kCombineSkip;
            v[i] = c < n ? r.o_partial[uint64_t{z0 + c} * r.dim + d] : 0.0f;  // in flight together
          }
#pragma unroll
          for (uint32_t i = 0; i < kCombineInFlight; ++i) acc[i % kResidues] += combine_term(w[i], v[i]);
        }
      }
      if (!one_batch) __syncthreads();  // the next batch rewrites the weights
    }
    float total;
    if constexpr (kLanes == 1) {
      total = ((acc[0] + acc[1]) + acc[2]) + acc[3];
    } else {
#pragma unroll
      for (uint32_t j = 0; j < kResidues; ++j) r.lane_sum[j * 256 + tid] = acc[j];
      __syncthreads();
      float res[4];  // lane 0: residue m is lane m mod kLanes's sum j = m / kLanes
#pragma unroll
      for (uint32_t m = 0; m < 4; ++m)
        res[m] = lane == 0 ? r.lane_sum[(m / kLanes) * 256 + (m % kLanes) * kWidth + tid] : 0.0f;
      total = ((res[0] + res[1]) + res[2]) + res[3];
      __syncthreads();  // rewritten by the next pass
    }
    if (lane == 0 && d < d_end) out[d] = __float2bfloat16_rn(total * r.inv);
  }
}

extern "C" __global__ void __launch_bounds__(256)
    mla_paged_decode_combine(const float* o_partial, const float* ml_partial, const float* sinks, __nv_bfloat16* o,
                             uint32_t num_q_heads, uint32_t kv_cache_dim, uint32_t num_splits, float v_scale) {
  wait_for_previous_kernel();  // the split kernel's partials (launched early)
  allow_next_kernel();
  __shared__ float weight[kCombineBatch], red_max[8], red_sum[8], lane_sum[2 * 256];
  const uint32_t h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, warp = tid / kWarp;
  const uint64_t base = (uint64_t{s} * num_q_heads + h) * num_splits;
  const float* ml = ml_partial + 2 * base;
  const bool has_sink = sinks != nullptr;
  const uint32_t tiles = (kv_cache_dim + kCombineDims - 1) / kCombineDims,
                 per_block = (tiles + gridDim.z - 1) / gridDim.z;
  const uint32_t d_begin = blockIdx.z * per_block * kCombineDims;
  const uint32_t d_end = min(kv_cache_dim, (blockIdx.z + 1) * per_block * kCombineDims);
  __nv_bfloat16* out = o + (uint64_t{s} * num_q_heads + h) * kv_cache_dim;
  if (num_splits <= 4)
    return combine_few(o_partial + base * kv_cache_dim, ml, has_sink ? sinks + h : nullptr, num_splits, kv_cache_dim,
                       v_scale, d_begin, d_end, out);
  // M and the denominator, each a block-wide reduction.
  float big = -INFINITY;
  bool keys = false;
  for (uint32_t z = tid; z < num_splits; z += blockDim.x) {
    keys = keys || ml[2 * z + 1] != 0.0f;
    big = ml[2 * z + 1] != 0.0f ? fmaxf(big, ml[2 * z]) : big;
  }
  big = warp_max(big);
  if (tid % kWarp == 0) red_max[warp] = big;
  keys = __syncthreads_or(keys);       // (the barrier before red_max is read)
  const bool sink = has_sink && keys;  // no keys: zeros, whatever the sink (SPEC §3)
  big = sink ? sinks[h] : -INFINITY;
  for (uint32_t w = 0; w < blockDim.x / kWarp; ++w) big = fmaxf(big, red_max[w]);
  float denom = 0.0f;
  for (uint32_t z = tid; z < num_splits; z += blockDim.x)
    denom += ml[2 * z + 1] != 0.0f ? expf(ml[2 * z] - big) * ml[2 * z + 1] : 0.0f;
  denom = warp_sum(denom);
  if (tid % kWarp == 0) red_sum[warp] = denom;
  __syncthreads();
  denom = sink ? exp_below(sinks[h], big) : 0.0f;
  for (uint32_t w = 0; w < blockDim.x / kWarp; ++w) denom += red_sum[w];
  const float inv = denom == 0.0f ? 0.0f : v_scale / denom;  // NaN (a NaN sink with keys) stays NaN

  // The weights of chunks [z0, z0 + kCombineBatch).
  auto fill_weights = [&](uint32_t z0) {
    for (uint32_t z = tid; z < kCombineBatch && z0 + z < num_splits; z += blockDim.x)
      weight[z] = ml[2 * (z0 + z) + 1] != 0.0f ? expf(ml[2 * (z0 + z)] - big) : kCombineSkip;
    __syncthreads();
  };
  const bool one_batch = num_splits <= kCombineBatch;
  if (one_batch) fill_weights(0);
  const CombineRows rows{o_partial + base * kv_cache_dim, weight, lane_sum, kv_cache_dim, num_splits, inv};
  switch (combine_lanes(num_splits, per_block)) {
    case 4: return combine_dims<4>(rows, d_begin, d_end, one_batch, fill_weights, out);
    case 2: return combine_dims<2>(rows, d_begin, d_end, one_batch, fill_weights, out);
    default: return combine_dims<1>(rows, d_begin, d_end, one_batch, fill_weights, out);
  }
}

// ---------------------------------------------------------------------------
// mla_batched_gemv_wide: the batched GEMV of mla_absorbed with 16-byte loads and every lane busy:
// output[h*os + n] = Σ_j weight[(h*n_out + n)*k + j] * input[h*is + j].
// A row is summed by a segment of S lanes, S the largest power of two ≤ min(32, k/16) (at least
// 1): lane `sub` of the segment takes the 8-element chunks sub, sub + S, ... of the row (two where
// k allows), then a butterfly over the segment. Warp w takes kGemvSteps steps of 32/S rows each,
// their loads in flight together: step t, segment g is row blockIdx.x·rows_per_block +
// (w·kGemvSteps + t)·32/S + g, with rows_per_block = 8·kGemvSteps·32/S (core/mla_fast.cpp,
// gemv_wide_rows_per_block). Eight blocks an SM on sm_90 (32 registers a thread): at the DeepSeek
// shapes the 1024 blocks are one wave, and a lane's first two 16-byte loads go out before the
// wait, the other two after (on the H200, docs/performance.md: four steps of one chunk a lane at
// five blocks an SM took 1.55 waves and 5.9 µs started early, this 4.7–4.9 µs).
// Launched early (GpuBackend::launch's early_start), it loads its first weights before waiting
// for the kernel ahead of it, which therefore must not write `weight` — nor may any kernel that
// can still run then: those ahead of it that were started early too.
// Grid: [⌈n_out/rows_per_block⌉, num_heads]. Block: 256. k and input_stride multiples of 8.
//   input [num_heads, input_stride] bf16; weight [num_heads, n_out, k] bf16; output [num_heads, output_stride] bf16
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
constexpr int kGemvBlocksPerSm = 6;  // sm_120 and sm_121 hold 1536 threads an SM
#else
constexpr int kGemvBlocksPerSm = 8;
#endif
extern "C" __global__ void __launch_bounds__(256, kGemvBlocksPerSm)
    mla_batched_gemv_wide(const __nv_bfloat16* input, const __nv_bfloat16* weight, __nv_bfloat16* output,
                          uint32_t n_out, uint32_t k, uint32_t input_stride, uint32_t output_stride) {
  constexpr uint32_t kGemvSteps = 2;
  uint32_t S = 1;
  while (S < kWarp && 2 * S <= k / 16) S *= 2;
  const uint32_t per_step = kWarp / S, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const uint32_t h = blockIdx.y, sub = lane % S;
  const uint32_t row0 = (blockIdx.x * (blockDim.x / kWarp) + warp) * kGemvSteps * per_step + lane / S;
  const uint4* x = reinterpret_cast<const uint4*>(input + uint64_t{h} * input_stride);
  allow_next_kernel();
  float acc[kGemvSteps] = {};
  for (uint32_t ch = sub; ch < k / 8; ch += S) {  // at least once: sub < S ≤ k/8
    uint4 wv[kGemvSteps];
#pragma unroll
    for (uint32_t t = 0; t < kGemvSteps; ++t) {
      const uint32_t n = row0 + t * per_step;
      if (n < n_out) wv[t] = ld_stream16(weight + ((uint64_t{h} * n_out + n) * k + 8 * ch));
    }
    if (ch == sub) wait_for_previous_kernel();  // launched early: the first weights are in flight
    const uint4 xv = x[ch];
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
    for (uint32_t t = 0; t < kGemvSteps; ++t) {
      if (row0 + t * per_step >= n_out) break;
      const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv[t]);
      float a = acc[t];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 wf = __bfloat1622float2(wp[e]), xf = __bfloat1622float2(xp[e]);
        a += wf.x * xf.x;
        a += wf.y * xf.y;
      }
      acc[t] = a;
    }
  }
#pragma unroll
  for (uint32_t t = 0; t < kGemvSteps; ++t) {
    const float v = segment_sum(acc[t], S);
    const uint32_t n = row0 + t * per_step;
    if (sub == 0 && n < n_out) output[uint64_t{h} * output_stride + n] = __float2bfloat16_rn(v);
  }
}
