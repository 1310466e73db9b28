// Ports of module mla_fast (kernels/mla_fast.cu). They follow the kernels' phases and rounding
// points — K and V dequantised to FP16 (exact), Q rounded to FP16 after its row's power-of-two
// scaling, P rounded to FP16 for P·V, FP32 accumulation — but not
// the MMA fragment layouts, which only change the order of FP32 additions, nor the split
// kernels' staging of tiles through shared memory (cp.async), which changes only when bytes
// arrive: one port serves both.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "metrale/emu/emulator.hpp"
#include "metrale/error.hpp"
#include "metrale/formats.hpp"
#include "port_common.hpp"

namespace metrale::emu {
namespace {

constexpr std::uint32_t kTileKeys = 32;
constexpr std::uint32_t kGroupRows = 16;

// A split block's shape: heads per block and keys per tile (the online softmax's steps).
struct SplitShape {
  std::uint32_t rows, tile_keys;
};
// The mla_fast entries: 16·R heads for 128·R threads, 32-key tiles.
SplitShape mma_shape(const Block& blk) { return {blk.blockDim.x / (4 * kWarp) * kGroupRows, kTileKeys}; }
// Which kernels a port plays: mla_fast's split entries (the block's threads give its heads), or
// mla_wgmma's 64-head or 16-head entries (kernels/mla_wgmma.cu), both on 64-key tiles.
enum class SplitKind { mma, wgmma, wgmma16 };
SplitShape shape_of(SplitKind kind, const Block& blk) {
  return kind == SplitKind::mma ? mma_shape(blk) : SplitShape{kind == SplitKind::wgmma ? 64u : 16u, 64};
}

// The kernel's q_scale_of: the power of two 2^e that brings a Q row's largest BF16 magnitude
// (bits `big`, NaN above inf) into [2^14, 2^15) for FP16, e in [-114, 126].
int q_scale_exponent(std::uint32_t big) {
  const int field = std::max(1, static_cast<int>(big >> 7));
  return std::min(126, 141 - field);
}

// The kernel's logit_factor: a row's unscale factor times the logit scale, held within FP32's
// finite range, so that a zero dot product keeps its logit 0 (±inf × 0 is NaN). (The 64-head and
// heads-in-M kernels hold the factor in base-2 units, times log2(e); either way a nonzero dot
// product's logit is then at least 2^94 in magnitude, so the softmax picks the same keys.)
float logit_factor(float unscale, float scale) {
  constexpr float kMax = std::numeric_limits<float>::max();
  return std::fmax(std::fmin(unscale * scale, kMax), -kMax);
}

// One block's partial: per head of its group, the unnormalised O, the running max and the sum.
struct Partial {
  std::vector<std::vector<float>> acc;
  std::vector<float> m, l;
};

// The split decode over any cache format, of chunk z of the block's head group and sequence:
// `dequant(j, k_row, v_row)` fills key j's rows as the FP16 values the kernel's shared memory
// holds (exact for both formats).
template <class Dequant>
Partial split_partial(Block& blk, std::uint32_t z, Global<const Bf16> q, std::uint32_t num_q_heads,
                      std::uint32_t q_head_dim, std::uint32_t dim, float logit_scale, const KeySet& keys,
                      std::uint32_t keys_per_split, SplitShape shape, Dequant&& dequant) {
  const std::uint32_t G = shape.rows, tile_keys = shape.tile_keys;
  const std::uint32_t head0 = blk.blockIdx.y * G, s = blk.blockIdx.z;
  const std::uint32_t begin =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{z} * keys_per_split, keys.count));
  const std::uint32_t end =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(keys.count, std::uint64_t{begin} + keys_per_split));

  std::vector<std::vector<float>> q_s(G, std::vector<float>(q_head_dim, 0.0f));  // shared
  std::vector<float> q_down(G, 0x1p-126f);  // a row of zeros: e = 126
  for (std::uint32_t row = 0; row < G; ++row) {
    if (head0 + row >= num_q_heads) continue;
    const auto qr = q.read((std::uint64_t{s} * num_q_heads + head0 + row) * q_head_dim, q_head_dim);
    std::uint32_t big = 0;
    for (const Bf16 x : qr) big = std::max<std::uint32_t>(big, x.bits & 0x7FFFu);
    const int e = q_scale_exponent(big);
    for (std::uint32_t d = 0; d < q_head_dim; ++d) q_s[row][d] = f16_round(qr[d].to_float() * std::ldexp(1.0f, e));
    q_down[row] = std::ldexp(1.0f, -e);
  }
  std::vector<std::vector<float>> acc(G, std::vector<float>(dim, 0.0f));
  std::vector<float> m(G, -std::numeric_limits<float>::infinity()), l(G, 0.0f);
  std::vector<std::vector<float>> k_s(tile_keys, std::vector<float>(dim)), v_s = k_s;  // shared
  for (std::uint32_t tile = begin; tile < end; tile += tile_keys) {
    blk.count_work(std::uint64_t{G} * tile_keys * (q_head_dim + dim));  // Q·Kᵀ and P·V of every head
    // Phase A: dequantise the tile once (zeros past the end).
    for (std::uint32_t key = 0; key < tile_keys; ++key) {
      if (tile + key < end) {
        dequant(tile + key, k_s[key], v_s[key]);
      } else {
        std::fill(k_s[key].begin(), k_s[key].end(), 0.0f);
        std::fill(v_s[key].begin(), v_s[key].end(), 0.0f);
      }
    }
    for (std::uint32_t row = 0; row < G; ++row) {
      // Phase B: the row's logits over the tile.
      const float factor = logit_factor(q_down[row], logit_scale);
      std::vector<float> sv(tile_keys);
      for (std::uint32_t key = 0; key < tile_keys; ++key) {
        float dot = 0.0f;
        for (std::uint32_t d = 0; d < q_head_dim; ++d) dot += q_s[row][d] * k_s[key][d];
        sv[key] = tile + key < end ? dot * factor : -std::numeric_limits<float>::infinity();
      }
      // Phase C: online softmax; P is rounded to FP16 for P·V, the sum keeps FP32.
      const float m_new = std::max(m[row], *std::max_element(sv.begin(), sv.end()));
      const float alpha = std::exp(m[row] - m_new);
      std::vector<float> p(tile_keys);
      float tile_sum = 0.0f;
      for (std::uint32_t key = 0; key < tile_keys; ++key) {
        p[key] = std::exp(sv[key] - m_new);
        tile_sum += p[key];
      }
      l[row] = l[row] * alpha + tile_sum;
      m[row] = m_new;
      // Phase D: O = O·alpha + P·V.
      for (std::uint32_t d = 0; d < dim; ++d) {
        float a = acc[row][d] * alpha;
        for (std::uint32_t key = 0; key < tile_keys; ++key) a += f16_round(p[key]) * v_s[key][d];
        acc[row][d] = a;
      }
    }
  }
  return {std::move(acc), std::move(m), std::move(l)};
}

// The combine of one head (mla_paged_decode_combine): chunk z's (running max, sum) at ml[2z],
// ml[2z + 1], its O at row(z, d); writes dims [d_begin, d_end) with out(d, value). The
// denominator is added as the kernel adds it: thread t the chunks ≡ t (mod 256) in order, a
// butterfly per warp, then the sink's term and the eight warps' sums in order; a dim's chunks by
// residue mod 4, each product rounded before its sum, the residues added in order.
template <class Row, class Out>
void combine_head(std::span<const float> ml, std::optional<float> sink, float v_scale, std::uint32_t d_begin,
                  std::uint32_t d_end, Row&& row, Out&& out) {
  const auto num_splits = static_cast<std::uint32_t>(ml.size() / 2);
  float big = -std::numeric_limits<float>::infinity();
  bool keys = false;
  for (std::uint32_t z = 0; z < num_splits; ++z)
    if (ml[2 * z + 1] != 0.0f) keys = true, big = std::fmax(big, ml[2 * z]);
  if (!keys) sink.reset();  // no keys: zeros, whatever the sink (SPEC §3)
  if (sink) big = std::fmax(*sink, big);
  std::array<std::array<float, kWarp>, 8> part{};
  for (std::uint32_t z = 0; z < num_splits; ++z)
    if (ml[2 * z + 1] != 0.0f) part[(z % 256) / kWarp][z % kWarp] += std::exp(ml[2 * z] - big) * ml[2 * z + 1];
  float denom = sink ? exp_below(*sink, big) : 0.0f;
  for (const auto& warp : part) denom += warp_sum(warp);
  const float inv = denom == 0.0f ? 0.0f : v_scale / denom;  // NaN (a NaN sink with keys) stays NaN
  std::vector<std::optional<float>> weight(num_splits);      // none: a chunk without keys
  for (std::uint32_t z = 0; z < num_splits; ++z)
    if (ml[2 * z + 1] != 0.0f) weight[z] = std::exp(ml[2 * z] - big);
  for (std::uint32_t d = d_begin; d < d_end; ++d) {
    std::array<float, 4> residue{};  // the chunks ≡ 0, 1, 2, 3 (mod 4)
    for (std::uint32_t z = 0; z < num_splits; ++z)
      if (weight[z]) residue[z % 4] += *weight[z] * row(z, d);
    out(d, Bf16::from_float((((residue[0] + residue[1]) + residue[2]) + residue[3]) * inv));
  }
}

// The split decode of this block's chunk, its partial written to o_partial and ml_partial.
template <class Dequant>
void split_decode(Block& blk, Global<const Bf16> q, Global<float> o_partial, Global<float> ml_partial,
                  std::uint32_t num_q_heads, std::uint32_t q_head_dim, std::uint32_t dim, float logit_scale,
                  const KeySet& keys, std::uint32_t keys_per_split, SplitShape shape, Dequant&& dequant) {
  const std::uint32_t z = blk.blockIdx.x, head0 = blk.blockIdx.y * shape.rows, s = blk.blockIdx.z;
  const Partial p =
      split_partial(blk, z, q, num_q_heads, q_head_dim, dim, logit_scale, keys, keys_per_split, shape, dequant);
  for (std::uint32_t row = 0; row < shape.rows; ++row) {
    const std::uint32_t h = head0 + row;
    if (h >= num_q_heads) continue;
    const std::uint64_t slot = (std::uint64_t{s} * num_q_heads + h) * blk.gridDim.x + z;
    const auto out = o_partial.write(slot * dim, dim);
    std::copy(p.acc[row].begin(), p.acc[row].end(), out.begin());
    ml_partial[2 * slot] = p.m[row];
    ml_partial[2 * slot + 1] = p.l[row];
  }
}

// The keys of sequence s of an FP8 cache (SPEC §3: compressed entries, then the window) and, as a
// split port's `dequant`, their K and V rows.
struct Fp8Keys {
  Global<const std::uint8_t> k_cache, v_cache, comp_pool;
  Global<const std::int32_t> block_tables;
  std::uint32_t max_blocks_per_seq, block_size;
  std::uint64_t cache_stride;
  std::uint32_t comp_block_count, kv_cache_dim, s;
  KeySet keys;

  Fp8Keys(Global<const std::uint8_t> k, Global<const std::uint8_t> v, Global<const std::uint8_t> comp,
          Global<const std::int32_t> tables, Global<const std::int32_t> seq_lens, std::uint32_t max_blocks,
          std::uint32_t block, std::uint64_t stride, std::uint32_t window, std::uint32_t comp_count, std::uint32_t dim,
          std::uint32_t seq)
      : k_cache(k),
        v_cache(v),
        comp_pool(comp),
        block_tables(tables),
        max_blocks_per_seq(max_blocks),
        block_size(block),
        cache_stride(stride),
        comp_block_count(comp_count),
        kv_cache_dim(dim),
        s(seq),
        keys(key_set(seq_lens[seq], max_blocks, block, window, comp && comp_count > 0 ? comp_count : 0)) {}

  void operator()(std::uint32_t j, std::vector<float>& k_row, std::vector<float>& v_row) const {
    std::int64_t k_off = 0, v_off = 0;
    Global<const std::uint8_t> k_pool = k_cache, v_pool = v_cache;
    if (j < keys.comp) {
      k_pool = v_pool = comp_pool;
      k_off = (std::int64_t{s} * comp_block_count + j) * 2 * static_cast<std::int64_t>(cache_stride);
      v_off = k_off + static_cast<std::int64_t>(cache_stride);
    } else {
      const std::uint32_t t = keys.start + (j - keys.comp), column = t / block_size;
      const std::int32_t phys = block_tables[std::uint64_t{s} * max_blocks_per_seq + column];
      k_off = v_off = (std::int64_t{phys} * block_size + t % block_size) * static_cast<std::int64_t>(cache_stride);
      for (const auto& [pool, off, name] : {std::tuple{k_pool, k_off, "k_cache"}, std::tuple{v_pool, v_off, "v_cache"}})
        (pool + off).require_in_bounds(0, kv_cache_dim, [&] {
          return bad_block_entry(s, column, phys, name, t, "row", off, off + kv_cache_dim);
        });
    }
    const auto kb = (k_pool + k_off).read(0, kv_cache_dim), vb = (v_pool + v_off).read(0, kv_cache_dim);
    for (std::uint32_t d = 0; d < kv_cache_dim; ++d) {
      k_row[d] = e4m3_decode(kb[d]);
      v_row[d] = e4m3_decode(vb[d]);
    }
  }
};

// The keys of sequence s of an NVFP4 cache (SPEC §3: no window, no compressed entries) and, as a
// split port's `dequant`, their K and V rows.
struct Nvfp4Keys {
  Global<const std::uint8_t> k_cache, v_cache;
  Global<const std::int32_t> block_tables;
  std::uint32_t max_blocks_per_seq, block_size, kv_cache_dim;
  std::uint64_t block_stride_bytes, data_section_bytes;
  std::uint32_t s;
  KeySet keys;

  Nvfp4Keys(Global<const std::uint8_t> k, Global<const std::uint8_t> v, Global<const std::int32_t> tables,
            Global<const std::int32_t> seq_lens, std::uint32_t max_blocks, std::uint32_t block, std::uint32_t dim,
            std::uint64_t block_stride, std::uint64_t data_section, std::uint32_t seq)
      : k_cache(k),
        v_cache(v),
        block_tables(tables),
        max_blocks_per_seq(max_blocks),
        block_size(block),
        kv_cache_dim(dim),
        block_stride_bytes(block_stride),
        data_section_bytes(data_section),
        s(seq),
        keys(key_set(seq_lens[seq], max_blocks, block, 0, 0)) {}

  void operator()(std::uint32_t j, std::vector<float>& k_row, std::vector<float>& v_row) const {
    const std::uint64_t width = kv_cache_dim;
    const std::uint32_t t = keys.start + j, column = t / block_size;
    const std::int32_t phys = block_tables[std::uint64_t{s} * max_blocks_per_seq + column];
    const std::int64_t base = std::int64_t{phys} * static_cast<std::int64_t>(block_stride_bytes);
    const std::uint64_t slot = t % block_size;
    for (auto [pool, row, name] : {std::tuple{k_cache, &k_row, "k_cache"}, std::tuple{v_cache, &v_row, "v_cache"}}) {
      const std::uint64_t through = data_section_bytes + (slot + 1) * width / 16;  // the key's data and scales
      (pool + base).require_in_bounds(0, through, [&] {
        return bad_block_entry(s, column, phys, name, t, "block through its scales", base,
                               base + static_cast<std::int64_t>(through));
      });
      const auto data = (pool + base).read(slot * width / 2, width / 2);
      const auto scales = (pool + base).read(data_section_bytes + slot * width / 16, width / 16);
      for (std::uint64_t e = 0; e < width; ++e) {
        const std::uint8_t byte = data[e / 2];
        (*row)[e] = e2m1_decode(e % 2 == 0 ? byte & 0xF : byte >> 4) * e4m3_decode(scales[e / 16]);
      }
    }
  }
};

// ---------------------------------------------------------------------------
// mla_paged_decode_split_fp8: head-grouped split-KV paged decode over an E4M3 cache (one KV head).
// Grid: [num_splits, ⌈num_q_heads/G⌉, num_seqs], G = 16·R. Block: 128·R (R = 1..4).
//   q            [num_seqs, num_q_heads, q_head_dim]                        bf16
//   k_cache      row of slot at slot·cache_stride                           e4m3 [kv_cache_dim]
//   v_cache      as k_cache
//   o_partial    [num_seqs, num_q_heads, num_splits, kv_cache_dim]          f32, unnormalised
//   ml_partial   [num_seqs, num_q_heads, num_splits, 2] (running max, sum)  f32
//   block_tables [num_seqs, max_blocks_per_seq] int32; seq_lens [num_seqs] int32
//   comp_pool    [num_seqs, comp_block_count, 2, cache_stride] e4m3 or null
// kKind wgmma: mla_paged_decode_wgmma_fp8 (module mla_wgmma), the same math on 64-head blocks
// of 64-key tiles (block 256; its two warpgroups' split of the work changes only FP32 order);
// wgmma16: mla_paged_decode_wgmma16_fp8, on 16-head blocks of 64-key tiles (block 384; its
// transposed products and per-thread partial sums, again only FP32 order; over one latent pool
// it converts each tile once for both products, the same FP16 values as twice), and
// mla_paged_decode_wgmma16_rs_fp8, the same on one warpgroup (block 128; its permuted contraction
// and output rows, again only FP32 order).
template <SplitKind kKind>
void mla_paged_decode_split_fp8(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                Global<const std::uint8_t> v_cache, Global<float> o_partial, Global<float> ml_partial,
                                Global<const std::int32_t> block_tables, Global<const std::int32_t> seq_lens,
                                std::uint32_t max_blocks_per_seq, std::uint32_t num_q_heads, std::uint32_t q_head_dim,
                                std::uint32_t kv_cache_dim, std::uint32_t block_size, float logit_scale,
                                std::uint64_t cache_stride, std::uint32_t sliding_window,
                                Global<const std::uint8_t> comp_pool, std::uint32_t comp_block_count,
                                std::uint32_t keys_per_split) {
  const Fp8Keys cache{k_cache,    v_cache,      comp_pool,      block_tables,     seq_lens,     max_blocks_per_seq,
                      block_size, cache_stride, sliding_window, comp_block_count, kv_cache_dim, blk.blockIdx.z};
  split_decode(blk, q, o_partial, ml_partial, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, cache.keys,
               keys_per_split, shape_of(kKind, blk), cache);
}

// The heads-in-M kernels read V from k_cache's rows, so a launch of `entry` whose v_cache is
// another buffer, or which has compressed entries (their V rows are apart), is refused here as its
// launcher refuses it.
void require_one_latent_pool(const char* entry, Global<const std::uint8_t> k_cache, Global<const std::uint8_t> v_cache,
                             Global<const std::uint8_t> comp_pool, std::uint32_t comp_block_count) {
  if (v_cache.addr() != k_cache.addr())
    fail(Errc::invalid_argument,
         "{}: v_cache {:#x} is not k_cache {:#x} (the kernel reads V from the one latent pool's K rows)", entry,
         v_cache.addr().addr, k_cache.addr().addr);
  if (comp_pool && comp_block_count > 0)
    fail(Errc::invalid_argument,
         "{}: {} compressed entries (their V rows are apart from their K rows; the kernel reads V from the K rows)",
         entry, comp_block_count);
}

// mla_paged_decode_wgmma_latent_fp8: mla_paged_decode_wgmma_fp8's math (64-head blocks of 64-key
// tiles, block 256) over one latent pool, with the heads in the wgmma's M (its two warpgroups
// split P·V's output dims: only FP32 order); one latent pool only (require_one_latent_pool).
void mla_paged_decode_wgmma_latent_fp8(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                       Global<const std::uint8_t> v_cache, Global<float> o_partial,
                                       Global<float> ml_partial, Global<const std::int32_t> block_tables,
                                       Global<const std::int32_t> seq_lens, std::uint32_t max_blocks_per_seq,
                                       std::uint32_t num_q_heads, std::uint32_t q_head_dim, std::uint32_t kv_cache_dim,
                                       std::uint32_t block_size, float logit_scale, std::uint64_t cache_stride,
                                       std::uint32_t sliding_window, Global<const std::uint8_t> comp_pool,
                                       std::uint32_t comp_block_count, std::uint32_t keys_per_split) {
  require_one_latent_pool("mla_paged_decode_wgmma_latent_fp8", k_cache, v_cache, comp_pool, comp_block_count);
  mla_paged_decode_split_fp8<SplitKind::wgmma>(blk, q, k_cache, v_cache, o_partial, ml_partial, block_tables, seq_lens,
                                               max_blocks_per_seq, num_q_heads, q_head_dim, kv_cache_dim, block_size,
                                               logit_scale, cache_stride, sliding_window, comp_pool, comp_block_count,
                                               keys_per_split);
}

// The combine in a cluster's blocks for a split port's `dequant` (Fp8Keys, Nvfp4Keys): this
// block's run of o's dims for its head group, from the partials of all the cluster's chunks.
template <class Dequant>
void combined_decode(Block& blk, Global<const Bf16> q, Global<const float> sinks, Global<Bf16> o,
                     std::uint32_t num_q_heads, std::uint32_t q_head_dim, std::uint32_t kv_cache_dim, float logit_scale,
                     const KeySet& keys, std::uint32_t keys_per_split, SplitShape shape, const Dequant& cache,
                     float v_scale) {
  const std::uint32_t n = blk.gridDim.x, z = blk.blockIdx.x, head0 = blk.blockIdx.y * shape.rows, s = blk.blockIdx.z;
  std::vector<Partial> parts;
  for (std::uint32_t chunk = 0; chunk < n; ++chunk)
    parts.push_back(split_partial(blk, chunk, q, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, keys,
                                  keys_per_split, shape, cache));
  const std::uint32_t width = 4 * ((kv_cache_dim + 4 * n - 1) / (4 * n));
  const std::uint32_t d_begin = std::min(kv_cache_dim, z * width), d_end = std::min(kv_cache_dim, d_begin + width);
  for (std::uint32_t row = 0; row < shape.rows; ++row) {
    const std::uint32_t h = head0 + row;
    if (h >= num_q_heads) continue;
    std::vector<float> ml;
    for (const Partial& p : parts) ml.insert(ml.end(), {p.m[row], p.l[row]});
    combine_head(
        ml, sinks ? std::optional<float>(sinks[h]) : std::nullopt, v_scale, d_begin, d_end,
        [&](std::uint32_t chunk, std::uint32_t d) { return parts[chunk].acc[row][d]; },
        [&](std::uint32_t d, Bf16 v) { o[(std::uint64_t{s} * num_q_heads + h) * kv_cache_dim + d] = v; });
  }
}

// ---------------------------------------------------------------------------
// mla_paged_decode_wgmma16_rs_combine_fp8: mla_paged_decode_wgmma16_rs_fp8 and the combine in one
// kernel (kKind wgmma16; with wgmma, mla_paged_decode_wgmma_combine_fp8: the same for the
// 64-head blocks of mla_paged_decode_wgmma_fp8, block 256). The num_splits ≤ 8 blocks of a
// (sequence, head group) are one cluster (shape [num_splits, 1, 1]); block z writes dims
// [z·w, (z + 1)·w), w = 4·⌈kv_cache_dim / 4n⌉, of o for the group's heads, as mla_paged_decode_combine computes them,
// from the cluster's partials, which the kernel's blocks keep in shared memory and read from each other. The emulator
// runs one block at a time, so this port computes the partials of all the cluster's chunks itself. The cluster shape
// ([num_splits, 1, 1]) is the entry's cluster rule (registered below), which the emulator checks at launch, dry runs
// included.
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, kv_cache_dim] bf16
template <SplitKind kKind>
void mla_paged_decode_combined_fp8(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                   Global<const std::uint8_t> v_cache, Global<const float> sinks, Global<Bf16> o,
                                   Global<const std::int32_t> block_tables, Global<const std::int32_t> seq_lens,
                                   std::uint32_t max_blocks_per_seq, std::uint32_t num_q_heads,
                                   std::uint32_t q_head_dim, std::uint32_t kv_cache_dim, std::uint32_t block_size,
                                   float logit_scale, std::uint64_t cache_stride, std::uint32_t sliding_window,
                                   Global<const std::uint8_t> comp_pool, std::uint32_t comp_block_count,
                                   std::uint32_t keys_per_split, float v_scale) {
  const Fp8Keys cache{k_cache,    v_cache,      comp_pool,      block_tables,     seq_lens,     max_blocks_per_seq,
                      block_size, cache_stride, sliding_window, comp_block_count, kv_cache_dim, blk.blockIdx.z};
  combined_decode(blk, q, sinks, o, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, cache.keys, keys_per_split,
                  shape_of(kKind, blk), cache, v_scale);
}

// mla_paged_decode_wgmma_latent_combine_fp8: mla_paged_decode_wgmma_combine_fp8's port for the
// heads-in-M blocks of mla_paged_decode_wgmma_latent_fp8, one latent pool only.
void mla_paged_decode_wgmma_latent_combine_fp8(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                               Global<const std::uint8_t> v_cache, Global<const float> sinks,
                                               Global<Bf16> o, Global<const std::int32_t> block_tables,
                                               Global<const std::int32_t> seq_lens, std::uint32_t max_blocks_per_seq,
                                               std::uint32_t num_q_heads, std::uint32_t q_head_dim,
                                               std::uint32_t kv_cache_dim, std::uint32_t block_size, float logit_scale,
                                               std::uint64_t cache_stride, std::uint32_t sliding_window,
                                               Global<const std::uint8_t> comp_pool, std::uint32_t comp_block_count,
                                               std::uint32_t keys_per_split, float v_scale) {
  require_one_latent_pool("mla_paged_decode_wgmma_latent_combine_fp8", k_cache, v_cache, comp_pool, comp_block_count);
  mla_paged_decode_combined_fp8<SplitKind::wgmma>(blk, q, k_cache, v_cache, sinks, o, block_tables, seq_lens,
                                                  max_blocks_per_seq, num_q_heads, q_head_dim, kv_cache_dim, block_size,
                                                  logit_scale, cache_stride, sliding_window, comp_pool,
                                                  comp_block_count, keys_per_split, v_scale);
}

// ---------------------------------------------------------------------------
// mla_paged_decode_split_nvfp4: the same over an NVFP4 cache (block layout as SPEC §3).
// Grid, block and the partial outputs as for FP8; logit_scale is inv_sqrt_d. kKind as for FP8
// (mla_paged_decode_wgmma_nvfp4 and mla_paged_decode_wgmma16_rs_nvfp4 as their FP8 entries).
template <SplitKind kKind>
void mla_paged_decode_split_nvfp4(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                  Global<const std::uint8_t> v_cache, Global<float> o_partial, Global<float> ml_partial,
                                  Global<const std::int32_t> block_tables, Global<const std::int32_t> seq_lens,
                                  std::uint32_t max_blocks_per_seq, std::uint32_t num_q_heads, std::uint32_t q_head_dim,
                                  std::uint32_t kv_cache_dim, std::uint32_t block_size, float logit_scale,
                                  std::uint64_t block_stride_bytes, std::uint64_t data_section_bytes,
                                  std::uint32_t keys_per_split) {
  const Nvfp4Keys cache{k_cache,    v_cache,      block_tables,       seq_lens,           max_blocks_per_seq,
                        block_size, kv_cache_dim, block_stride_bytes, data_section_bytes, blk.blockIdx.z};
  split_decode(blk, q, o_partial, ml_partial, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, cache.keys,
               keys_per_split, shape_of(kKind, blk), cache);
}

// mla_paged_decode_wgmma_latent_nvfp4: mla_paged_decode_wgmma_nvfp4's math on the heads-in-M block
// of mla_paged_decode_wgmma_latent_fp8 (only FP32 order); one latent pool only.
void mla_paged_decode_wgmma_latent_nvfp4(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                         Global<const std::uint8_t> v_cache, Global<float> o_partial,
                                         Global<float> ml_partial, Global<const std::int32_t> block_tables,
                                         Global<const std::int32_t> seq_lens, std::uint32_t max_blocks_per_seq,
                                         std::uint32_t num_q_heads, std::uint32_t q_head_dim,
                                         std::uint32_t kv_cache_dim, std::uint32_t block_size, float logit_scale,
                                         std::uint64_t block_stride_bytes, std::uint64_t data_section_bytes,
                                         std::uint32_t keys_per_split) {
  require_one_latent_pool("mla_paged_decode_wgmma_latent_nvfp4", k_cache, v_cache, {}, 0);
  mla_paged_decode_split_nvfp4<SplitKind::wgmma>(
      blk, q, k_cache, v_cache, o_partial, ml_partial, block_tables, seq_lens, max_blocks_per_seq, num_q_heads,
      q_head_dim, kv_cache_dim, block_size, logit_scale, block_stride_bytes, data_section_bytes, keys_per_split);
}

// mla_paged_decode_wgmma_latent_combine_nvfp4: mla_paged_decode_wgmma_latent_combine_fp8's port over
// an NVFP4 latent pool (V unscaled: v_scale 1), one latent pool only. Cluster rule as FP8's.
void mla_paged_decode_wgmma_latent_combine_nvfp4(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                                                 Global<const std::uint8_t> v_cache, Global<const float> sinks,
                                                 Global<Bf16> o, Global<const std::int32_t> block_tables,
                                                 Global<const std::int32_t> seq_lens, std::uint32_t max_blocks_per_seq,
                                                 std::uint32_t num_q_heads, std::uint32_t q_head_dim,
                                                 std::uint32_t kv_cache_dim, std::uint32_t block_size,
                                                 float logit_scale, std::uint64_t block_stride_bytes,
                                                 std::uint64_t data_section_bytes, std::uint32_t keys_per_split) {
  require_one_latent_pool("mla_paged_decode_wgmma_latent_combine_nvfp4", k_cache, v_cache, {}, 0);
  const Nvfp4Keys cache{k_cache,    v_cache,      block_tables,       seq_lens,           max_blocks_per_seq,
                        block_size, kv_cache_dim, block_stride_bytes, data_section_bytes, blk.blockIdx.z};
  combined_decode(blk, q, sinks, o, num_q_heads, q_head_dim, kv_cache_dim, logit_scale, cache.keys, keys_per_split,
                  shape_of(SplitKind::wgmma, blk), cache, 1.0f);
}

// ---------------------------------------------------------------------------
// mla_paged_decode_combine: o = v_scale · Σ_z e^(m_z − M)·O_z / (Σ_z e^(m_z − M)·l_z + e^(sink − M)),
// M = max(max_z m_z, sink) over the chunks with keys (l_z ≠ 0, NaN included: NaN in, NaN out); the
// sink counts once; no keys writes zeros, whatever the sink.
// Grid: [num_q_heads, num_seqs, dim_blocks]. Block: 256. Block z of a head takes a run of
// ⌈tiles/dim_blocks⌉ of the 64-dim tiles; a dim's sum is its chunks' sums by residue mod 4,
// added in order, as the kernel's threads add them whatever their lanes.
//   o_partial [num_seqs, num_q_heads, num_splits, kv_cache_dim] f32; ml_partial [.., 2] f32
//   sinks [num_q_heads] f32 or null; o [num_seqs, num_q_heads, kv_cache_dim] bf16
void mla_paged_decode_combine(Block& blk, Global<const float> o_partial, Global<const float> ml_partial,
                              Global<const float> sinks, Global<Bf16> o, std::uint32_t num_q_heads,
                              std::uint32_t kv_cache_dim, std::uint32_t num_splits, float v_scale) {
  constexpr std::uint32_t kDims = 64;
  const std::uint32_t h = blk.blockIdx.x, s = blk.blockIdx.y;
  const std::uint64_t base = (std::uint64_t{s} * num_q_heads + h) * num_splits;
  const auto ml = ml_partial.read(2 * base, 2 * std::uint64_t{num_splits});
  const std::uint32_t tiles = (kv_cache_dim + kDims - 1) / kDims,
                      per_block = (tiles + blk.gridDim.z - 1) / blk.gridDim.z;
  const std::uint32_t d_end = std::min(kv_cache_dim, (blk.blockIdx.z + 1) * per_block * kDims);
  combine_head(
      ml, sinks ? std::optional<float>(sinks[h]) : std::nullopt, v_scale,
      std::min(kv_cache_dim, blk.blockIdx.z * per_block * kDims), d_end,
      [&](std::uint32_t z, std::uint32_t d) { return o_partial[(base + z) * kv_cache_dim + d]; },
      [&](std::uint32_t d, Bf16 v) { o[(std::uint64_t{s} * num_q_heads + h) * kv_cache_dim + d] = v; });
}

// ---------------------------------------------------------------------------
// mla_batched_gemv_wide: output[h*os + n] = Σ_j weight[(h*n_out + n)*k + j] * input[h*is + j].
// A row is summed by a segment of S lanes, S the largest power of two ≤ min(32, k/16) (at least
// 1): lane `sub` takes the 8-element chunks sub, sub + S, ... of the row, then a butterfly over
// the segment.
// Warp w, step t, segment g: row blockIdx.x·rows_per_block + (w·kGemvSteps + t)·32/S + g.
// Grid: [⌈n_out/rows_per_block⌉, num_heads], rows_per_block = 8·kGemvSteps·32/S. Block: 256.
//   input [num_heads, input_stride] bf16; weight [num_heads, n_out, k] bf16; output [num_heads, output_stride] bf16
void mla_batched_gemv_wide(Block& blk, Global<const Bf16> input, Global<const Bf16> weight, Global<Bf16> output,
                           std::uint32_t n_out, std::uint32_t k, std::uint32_t input_stride,
                           std::uint32_t output_stride) {
  constexpr std::uint32_t kGemvSteps = 2;
  std::uint32_t S = 1;
  while (S < kWarp && 2 * S <= k / 16) S *= 2;
  const std::uint32_t per_step = kWarp / S, h = blk.blockIdx.y;
  const auto x = input.read(std::uint64_t{h} * input_stride, k);
  for (std::uint32_t warp = 0; warp < blk.blockDim.x / kWarp; ++warp) {
    for (std::uint32_t t = 0; t < kGemvSteps; ++t) {
      for (std::uint32_t g = 0; g < per_step; ++g) {
        const std::uint32_t n =
            (blk.blockIdx.x * (blk.blockDim.x / kWarp) + warp) * kGemvSteps * per_step + t * per_step + g;
        if (n >= n_out) continue;
        const auto w = weight.read((std::uint64_t{h} * n_out + n) * k, k);
        std::array<float, kWarp> lanes{};  // the segment's lanes
        for (std::uint32_t sub = 0; sub < S; ++sub)
          for (std::uint32_t ch = sub; ch < k / 8; ch += S)
            for (std::uint32_t e = 0; e < 8; ++e) lanes[sub] += w[ch * 8 + e].to_float() * x[ch * 8 + e].to_float();
        output[std::uint64_t{h} * output_stride + n] = Bf16::from_float(segment_sum(lanes, S));
      }
    }
  }
}

BlockRule split_block() {
  return [](Dim3 block, std::span<const KernelArg>) -> std::optional<std::string> {
    if (block.y == 1 && block.z == 1 && block.x % 128 == 0 && block.x >= 128 && block.x <= 512) return std::nullopt;
    return fmt::format("block ({},{},{}) but the split decode needs 128·R threads, R = 1..4", block.x, block.y,
                       block.z);
  };
}

}  // namespace

void register_mla_fast(Registry& r) {
  const char* m = "mla_fast";
  // The 16-head entries (mla_paged_decode_split16_*) differ from the split entries only in where
  // a thread keeps the next half-tile (registers): one port serves both, at 128 threads.
  // clang-format off
  static constexpr const char* fp8[] = {
      "q", "k_cache", "v_cache", "o_partial", "ml_partial", "block_tables", "seq_lens", "max_blocks_per_seq",
      "num_q_heads", "q_head_dim", "kv_cache_dim", "block_size", "logit_scale", "cache_stride", "sliding_window",
      "comp_pool", "comp_block_count", "keys_per_split"};
  static constexpr const char* nvfp4[] = {
      "q", "k_cache", "v_cache", "o_partial", "ml_partial", "block_tables", "seq_lens", "max_blocks_per_seq",
      "num_q_heads", "q_head_dim", "kv_cache_dim", "block_size", "logit_scale", "block_stride_bytes",
      "data_section_bytes", "keys_per_split"};
  // clang-format on
  constexpr SplitKind mma = SplitKind::mma, wgmma = SplitKind::wgmma, wgmma16 = SplitKind::wgmma16;
  r.add<&mla_paged_decode_split_fp8<mma>>(m, "mla_paged_decode_split_fp8", fp8, split_block());
  r.add<&mla_paged_decode_split_fp8<mma>>(m, "mla_paged_decode_split16_fp8", fp8, block_is({128, 1, 1}));
  r.add<&mla_paged_decode_split_nvfp4<mma>>(m, "mla_paged_decode_split_nvfp4", nvfp4, split_block());
  r.add<&mla_paged_decode_split_nvfp4<mma>>(m, "mla_paged_decode_split16_nvfp4", nvfp4, block_is({128, 1, 1}));
  const char* w = "mla_wgmma";
  r.add<&mla_paged_decode_split_fp8<wgmma>>(w, "mla_paged_decode_wgmma_fp8", fp8, block_is({256, 1, 1}));
  r.add<&mla_paged_decode_wgmma_latent_fp8>(w, "mla_paged_decode_wgmma_latent_fp8", fp8, block_is({256, 1, 1}));
  r.add<&mla_paged_decode_split_nvfp4<wgmma>>(w, "mla_paged_decode_wgmma_nvfp4", nvfp4, block_is({256, 1, 1}));
  r.add<&mla_paged_decode_wgmma_latent_nvfp4>(w, "mla_paged_decode_wgmma_latent_nvfp4", nvfp4, block_is({256, 1, 1}));
  r.add<&mla_paged_decode_split_fp8<wgmma16>>(w, "mla_paged_decode_wgmma16_fp8", fp8, block_is({384, 1, 1}));
  r.add<&mla_paged_decode_split_nvfp4<wgmma16>>(w, "mla_paged_decode_wgmma16_nvfp4", nvfp4, block_is({384, 1, 1}));
  r.add<&mla_paged_decode_split_fp8<wgmma16>>(w, "mla_paged_decode_wgmma16_rs_fp8", fp8, block_is({128, 1, 1}));
  r.add<&mla_paged_decode_split_nvfp4<wgmma16>>(w, "mla_paged_decode_wgmma16_rs_nvfp4", nvfp4, block_is({128, 1, 1}));
  // clang-format off
  static constexpr const char* fp8_combined[] = {
      "q", "k_cache", "v_cache", "sinks", "o", "block_tables", "seq_lens", "max_blocks_per_seq", "num_q_heads",
      "q_head_dim", "kv_cache_dim", "block_size", "logit_scale", "cache_stride", "sliding_window", "comp_pool",
      "comp_block_count", "keys_per_split", "v_scale"};
  // clang-format on
  r.add<&mla_paged_decode_combined_fp8<wgmma16>>(w, "mla_paged_decode_wgmma16_rs_combine_fp8", fp8_combined,
                                                 block_is({128, 1, 1}));
  r.add<&mla_paged_decode_combined_fp8<wgmma>>(w, "mla_paged_decode_wgmma_combine_fp8", fp8_combined,
                                               block_is({256, 1, 1}));
  r.add<&mla_paged_decode_wgmma_latent_combine_fp8>(w, "mla_paged_decode_wgmma_latent_combine_fp8", fp8_combined,
                                                    block_is({256, 1, 1}));
  // clang-format off
  static constexpr const char* nvfp4_combined[] = {
      "q", "k_cache", "v_cache", "sinks", "o", "block_tables", "seq_lens", "max_blocks_per_seq", "num_q_heads",
      "q_head_dim", "kv_cache_dim", "block_size", "logit_scale", "block_stride_bytes", "data_section_bytes",
      "keys_per_split"};
  // clang-format on
  r.add<&mla_paged_decode_wgmma_latent_combine_nvfp4>(w, "mla_paged_decode_wgmma_latent_combine_nvfp4", nvfp4_combined,
                                                      block_is({256, 1, 1}));
  constexpr const char* kClusterEntries[] = {
      "mla_paged_decode_wgmma16_rs_combine_fp8", "mla_paged_decode_wgmma_combine_fp8",
      "mla_paged_decode_wgmma_latent_combine_fp8", "mla_paged_decode_wgmma_latent_combine_nvfp4"};
  // One cluster per (sequence, head group): the grid's x, at most the portable 8.
  for (const char* e : kClusterEntries)
    r.set_cluster_rule(w, e, [](Dim3 grid, Dim3 c) -> std::optional<std::string> {
      if (c.x == grid.x && c.y == 1 && c.z == 1 && grid.x <= 8) return std::nullopt;
      return fmt::format("cluster ({},{},{}) but the kernel needs ({},1,1), the grid's x, at most 8", c.x, c.y, c.z,
                         grid.x);
    });
  // The kernel's expf and the port's std::exp may differ in the last bit, and a P element then
  // round to FP16 the other way: 2^-11 of its p·|v| in o_partial, taken as 2^-10 of the largest
  // |o_partial| for a recorded case.
  for (const char* e : {"mla_paged_decode_split_fp8", "mla_paged_decode_split16_fp8", "mla_paged_decode_split_nvfp4",
                        "mla_paged_decode_split16_nvfp4"})
    r.set_recorded_floor(m, e, "o_partial", 0x1p-10);
  for (const char* e :
       {"mla_paged_decode_wgmma_fp8", "mla_paged_decode_wgmma_latent_fp8", "mla_paged_decode_wgmma_nvfp4",
        "mla_paged_decode_wgmma_latent_nvfp4", "mla_paged_decode_wgmma16_fp8", "mla_paged_decode_wgmma16_nvfp4",
        "mla_paged_decode_wgmma16_rs_fp8", "mla_paged_decode_wgmma16_rs_nvfp4"})
    r.set_recorded_floor(w, e, "o_partial", 0x1p-10);
  // The same through the combine for the entries that combine in their clusters: their o, 2^-10
  // of its largest |o| (the 64-head block's lazily rescaled P rounds to FP16 at other magnitudes
  // than the port's).
  for (const char* e : kClusterEntries) r.set_recorded_floor(w, e, "o", 0x1p-10);
  r.add<&mla_paged_decode_combine>(
      m, "mla_paged_decode_combine",
      {"o_partial", "ml_partial", "sinks", "o", "num_q_heads", "kv_cache_dim", "num_splits", "v_scale"},
      block_is({256, 1, 1}));
  r.add<&mla_batched_gemv_wide>(m, "mla_batched_gemv_wide",
                                {"input", "weight", "output", "n_out", "k", "input_stride", "output_stride"},
                                block_is({256, 1, 1}));
}

}  // namespace metrale::emu
