// Ports of module `mla_absorbed` (SPEC §3). Each reads like its kernel in
// kernels/mla_absorbed.cu: same parameters, same order, same phases; a phase
// between two barriers is one `blk.threads(...)` loop, and per-block shared
// memory is a local array.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "metrale/emu/emulator.hpp"
#include "metrale/formats.hpp"
#include "port_common.hpp"

namespace metrale::emu {
namespace {

// ---------------------------------------------------------------------------
// mla_batched_gemv: output[h*os + n] = Σ_j weight[(h*n_out + n)*k + j] * input[h*is + j]
// Grid: [⌈n_out/8⌉, num_heads]. Block: 256 (8 warps; warp w computes row n = blockIdx.x*8 + w,
// lanes stride over k, then a butterfly sum).
//   input  [num_heads, input_stride]  bf16
//   weight [num_heads, n_out, k]      bf16
//   output [num_heads, output_stride] bf16
void mla_batched_gemv(Block& blk, Global<const Bf16> input, Global<const Bf16> weight, Global<Bf16> output,
                      std::uint32_t n_out, std::uint32_t k, std::uint32_t input_stride, std::uint32_t output_stride) {
  const std::uint32_t h = blk.blockIdx.y;
  std::array<float, 256> partial{};
  blk.threads([&](std::uint32_t tid) {
    const std::uint32_t n = blk.blockIdx.x * 8 + tid / kWarp;
    if (n >= n_out) return;
    const auto w = weight.read((std::uint64_t{h} * n_out + n) * k, k);
    const auto x = input.read(std::uint64_t{h} * input_stride, k);
    float acc = 0.0f;
    for (std::uint32_t j = tid % kWarp; j < k; j += kWarp) acc += w[j].to_float() * x[j].to_float();
    partial[tid] = acc;
  });
  blk.threads([&](std::uint32_t tid) {
    const std::uint32_t n = blk.blockIdx.x * 8 + tid / kWarp;
    if (n >= n_out || tid % kWarp != 0) return;
    std::array<float, kWarp> lanes{};
    std::copy_n(partial.begin() + tid, kWarp, lanes.begin());
    output[std::uint64_t{h} * output_stride + n] = Bf16::from_float(warp_sum(lanes));
  });
}

// ---------------------------------------------------------------------------
// mla_q_rope_scatter: copy each head's rope part of q_full into q_absorbed_buf and q_rope_contiguous.
// Grid: [1]. Block: 256, threads stride over nq*rope.
//   q_full            [nq, hd]            bf16
//   q_absorbed_buf    [nq, mla_cache_dim] bf16 (columns kv_lora .. kv_lora+rope written)
//   q_rope_contiguous [nq, rope]          bf16
void mla_q_rope_scatter(Block& blk, Global<const Bf16> q_full, Global<Bf16> q_absorbed_buf,
                        Global<Bf16> q_rope_contiguous, std::uint32_t nq, std::uint32_t hd, std::uint32_t nope,
                        std::uint32_t rope, std::uint32_t kv_lora, std::uint32_t mla_cache_dim) {
  blk.threads([&](std::uint32_t tid) {
    for (std::uint64_t idx = tid; idx < std::uint64_t{nq} * rope; idx += blk.blockDim.x) {
      const std::uint64_t h = idx / rope, i = idx % rope;
      const Bf16 v = q_full[h * hd + nope + i];
      q_absorbed_buf[h * mla_cache_dim + kv_lora + i] = v;
      q_rope_contiguous[h * rope + i] = v;
    }
  });
}

// ---------------------------------------------------------------------------
// mla_q_rope_writeback: q_absorbed_buf[h*mla_cache_dim + kv_lora + i] = q_rope_direct[h*rope + i].
// Grid: [1]. Block: 256, threads stride over nq*rope.
//   q_rope_direct  [nq, rope]          bf16
//   q_absorbed_buf [nq, mla_cache_dim] bf16
void mla_q_rope_writeback(Block& blk, Global<const Bf16> q_rope_direct, Global<Bf16> q_absorbed_buf, std::uint32_t nq,
                          std::uint32_t rope, std::uint32_t kv_lora, std::uint32_t mla_cache_dim) {
  blk.threads([&](std::uint32_t tid) {
    for (std::uint64_t idx = tid; idx < std::uint64_t{nq} * rope; idx += blk.blockDim.x) {
      const std::uint64_t h = idx / rope, i = idx % rope;
      q_absorbed_buf[h * mla_cache_dim + kv_lora + i] = q_rope_direct[h * rope + i];
    }
  });
}

// ---------------------------------------------------------------------------
// mla_cache_assemble: K = [kv_latent ‖ k_rope ‖ 0…], V = [kv_latent ‖ 0…].
// Grid: [1]. Block: max(mla_cache_dim, 256), one thread per element.
//   kv_latent [kv_lora] bf16; k_rope [rope] bf16; k_cache, v_cache [mla_cache_dim] bf16
void mla_cache_assemble(Block& blk, Global<const Bf16> kv_latent, Global<const Bf16> k_rope, Global<Bf16> k_cache,
                        Global<Bf16> v_cache, std::uint32_t kv_lora, std::uint32_t rope, std::uint32_t mla_cache_dim) {
  blk.threads([&](std::uint32_t tid) {
    if (tid >= mla_cache_dim) return;
    const Bf16 latent = tid < kv_lora ? kv_latent[tid] : Bf16{};
    k_cache[tid] = tid < kv_lora ? latent : (tid < kv_lora + rope ? k_rope[tid - kv_lora] : Bf16{});
    v_cache[tid] = latent;
  });
}

// ---------------------------------------------------------------------------
// rope_pairs_bf16: rotate pairs (2i, 2i+1) of each [rows, rope] row in place at position pos.
// Grid: [⌈rows·rope/2 / 256⌉]. Block: 256, one thread per pair.
//   x [rows, rope] bf16
void rope_pairs_bf16(Block& blk, Global<Bf16> x, std::uint32_t rows, std::uint32_t rope, std::uint32_t pos,
                     float theta) {
  const std::uint64_t half = rope / 2;
  blk.threads([&](std::uint32_t tid) {
    const std::uint64_t p = std::uint64_t{blk.blockIdx.x} * blk.blockDim.x + tid;
    if (p >= rows * half) return;
    const std::uint64_t r = p / half, i = p % half;
    const float inv_freq = std::pow(theta, -static_cast<float>(2 * i) / static_cast<float>(rope));
    const float angle = static_cast<float>(pos) * inv_freq;
    const float c = std::cos(angle), s = std::sin(angle);
    const std::uint64_t at = r * rope + 2 * i;
    const float a = x.load(at).to_float(), b = x.load(at + 1).to_float();
    x[at] = Bf16::from_float(a * c - b * s);
    x[at + 1] = Bf16::from_float(b * c + a * s);
  });
}

// ---------------------------------------------------------------------------
// Paged attention, shared by both formats. One block per (query head, sequence): keys are taken
// 256 at a time (one per thread), with an online softmax across tiles; each thread owns the
// output dims tid, tid+256, ... (kMaxKvCacheDim / 256 of them at most).

constexpr std::uint32_t kTile = 256;
constexpr std::uint32_t kMaxDimsPerThread = 4;  // kMaxKvCacheDim / 256

// The decode loop over any cache format. `Rows` gives, for key j of the key set, a function
// dim -> K value and a function dim -> V value (dequantised, FP32), with their bytes checked.
template <class Rows>
void paged_attention(Block& blk, Global<const Bf16> q, Global<Bf16> o, std::uint32_t q_head_dim,
                     std::uint32_t kv_cache_dim, float inv_sqrt_d, const KeySet& keys, float sink, bool has_sink,
                     Rows&& rows) {
  const std::uint32_t h = blk.blockIdx.x, s = blk.blockIdx.y, num_q_heads = blk.gridDim.x;
  const std::uint64_t qo_row = std::uint64_t{s} * num_q_heads + h;

  std::vector<float> q_s(q_head_dim);  // shared
  blk.threads([&](std::uint32_t tid) {
    for (std::uint32_t d = tid; d < q_head_dim; d += blk.blockDim.x) q_s[d] = q[qo_row * q_head_dim + d].to_float();
  });

  std::array<float, kTile> logit{}, p{};                         // shared
  std::vector<std::array<float, kMaxDimsPerThread>> acc(kTile);  // registers, per thread
  float m = -std::numeric_limits<float>::infinity(), l = 0.0f;   // per thread, uniform
  for (std::uint32_t tile = 0; tile < keys.count; tile += kTile) {
    const std::uint32_t n = std::min(kTile, keys.count - tile);
    // Phase A: one key per thread.
    blk.threads([&](std::uint32_t tid) {
      logit[tid] = -std::numeric_limits<float>::infinity();
      if (tid >= n) return;
      const auto k_row = rows.k(tile + tid);
      float dot = 0.0f;
      for (std::uint32_t d = 0; d < q_head_dim; ++d) dot += q_s[d] * k_row(d);
      logit[tid] = dot * inv_sqrt_d;
    });
    // Phase B: block max and the tile's probabilities.
    const float tile_max = *std::max_element(logit.begin(), logit.begin() + n);
    const float m_new = std::max(m, tile_max);
    const float alpha = std::exp(m - m_new);
    float tile_sum = 0.0f;
    for (std::uint32_t t = 0; t < kTile; ++t) {
      p[t] = t < n ? std::exp(logit[t] - m_new) : 0.0f;
      tile_sum += p[t];
    }
    l = l * alpha + tile_sum;
    m = m_new;
    // Phase C: each thread updates its output dims over the tile's V rows.
    std::vector<decltype(rows.v(0))> v_rows;
    v_rows.reserve(n);
    for (std::uint32_t t = 0; t < n; ++t) v_rows.push_back(rows.v(tile + t));
    blk.threads([&](std::uint32_t tid) {
      for (std::uint32_t r = 0; r < kMaxDimsPerThread; ++r) {
        const std::uint32_t d = tid + r * kTile;
        if (d >= kv_cache_dim) break;
        float a = acc[tid][r] * alpha;
        for (std::uint32_t t = 0; t < n; ++t) a += p[t] * v_rows[t](d);
        acc[tid][r] = a;
      }
    });
  }
  // The sink joins the denominator only, unscaled and without a value row, and only where there are
  // keys (l = 0 without: an empty key set writes zeros whatever the sink, NaN included; SPEC §3).
  if (has_sink && l != 0.0f) {
    const float m_final = std::max(m, sink);
    const float alpha = exp_below(m, m_final);  // all logits −inf and a −inf sink: 1, not NaN
    l = l * alpha + exp_below(sink, m_final);
    for (auto& a : acc)
      for (float& x : a) x *= alpha;
  }
  // An empty key set writes zeros, never NaN; a NaN sink or logit with keys stays NaN, as in the split path.
  const float inv_l = l == 0.0f ? 0.0f : 1.0f / l;
  blk.threads([&](std::uint32_t tid) {
    for (std::uint32_t r = 0; r < kMaxDimsPerThread; ++r) {
      const std::uint32_t d = tid + r * kTile;
      if (d >= kv_cache_dim) break;
      o[qo_row * kv_cache_dim + d] = Bf16::from_float(acc[tid][r] * inv_l);
    }
  });
}

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
void mla_paged_decode_fp8(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                          Global<const std::uint8_t> v_cache, Global<Bf16> o, Global<const std::int32_t> block_tables,
                          Global<const std::int32_t> seq_lens, std::uint32_t max_blocks_per_seq,
                          std::uint32_t num_q_heads, std::uint32_t num_kv_heads, std::uint32_t q_head_dim,
                          std::uint32_t kv_cache_dim, std::uint32_t block_size, float inv_sqrt_d, float k_scale,
                          float v_scale, std::uint64_t cache_stride, std::uint32_t sliding_window,
                          Global<const float> sinks, Global<const std::uint8_t> comp_pool,
                          std::uint32_t comp_block_count) {
  const std::uint32_t h = blk.blockIdx.x, s = blk.blockIdx.y;
  const std::uint32_t kv_head = h / (num_q_heads / num_kv_heads);
  const std::uint32_t comp = comp_pool && comp_block_count > 0 ? comp_block_count : 0;
  const KeySet keys = key_set(seq_lens[s], max_blocks_per_seq, block_size, sliding_window, comp);
  const std::uint64_t head_off = std::uint64_t{kv_head} * kv_cache_dim;

  // Byte offset of key j's row in its pool (K and V share offsets; compressed entries interleave K and V).
  auto row = [&](std::uint32_t j, bool is_v) -> std::pair<Global<const std::uint8_t>, std::int64_t> {
    if (j < keys.comp) {
      const std::int64_t entry = (std::int64_t{s} * comp_block_count + j) * 2 + (is_v ? 1 : 0);
      return {comp_pool, entry * static_cast<std::int64_t>(cache_stride)};
    }
    const std::uint32_t t = keys.start + (j - keys.comp), column = t / block_size;
    const std::int32_t phys = block_tables[std::uint64_t{s} * max_blocks_per_seq + column];
    const std::int64_t slot = std::int64_t{phys} * block_size + t % block_size;
    const Global<const std::uint8_t> pool = is_v ? v_cache : k_cache;
    const std::int64_t off = slot * static_cast<std::int64_t>(cache_stride);
    (pool + off).require_in_bounds(head_off, kv_cache_dim, [&] {
      const std::int64_t first = off + static_cast<std::int64_t>(head_off);
      return bad_block_entry(s, column, phys, is_v ? "v_cache" : "k_cache", t, "row", first, first + kv_cache_dim);
    });
    return {pool, off};
  };
  auto dequant = [&](std::uint32_t j, bool is_v) {
    const auto [pool, off] = row(j, is_v);
    const auto bytes = (pool + off).read(head_off, kv_cache_dim);
    const float scale = is_v ? v_scale : k_scale;
    return [bytes, scale](std::uint32_t d) { return e4m3_decode(bytes[d]) * scale; };
  };
  struct {
    decltype(dequant)& f;
    auto k(std::uint32_t j) { return f(j, false); }
    auto v(std::uint32_t j) { return f(j, true); }
  } rows{dequant};

  const bool has_sink = static_cast<bool>(sinks);
  paged_attention(blk, q, o, q_head_dim, kv_cache_dim, inv_sqrt_d, keys, has_sink ? sinks[h] : 0.0f, has_sink, rows);
}

// ---------------------------------------------------------------------------
// mla_paged_decode_nvfp4: paged attention over an NVFP4 cache (SPEC §3).
// Grid: [num_q_heads, num_seqs]. Block: 256.
//   block b at b·block_stride_bytes: slot i's packed E2M1 row at i·row_width/2, its E4M3 scales
//   (one per 16 values) at data_section_bytes + i·row_width/16; row_width = num_kv_heads·kv_cache_dim.
//   q, o, block_tables, seq_lens as for FP8.
void mla_paged_decode_nvfp4(Block& blk, Global<const Bf16> q, Global<const std::uint8_t> k_cache,
                            Global<const std::uint8_t> v_cache, Global<Bf16> o, Global<const std::int32_t> block_tables,
                            Global<const std::int32_t> seq_lens, std::uint32_t max_blocks_per_seq,
                            std::uint32_t num_q_heads, std::uint32_t num_kv_heads, std::uint32_t q_head_dim,
                            std::uint32_t kv_cache_dim, std::uint32_t block_size, float inv_sqrt_d,
                            std::uint64_t block_stride_bytes, std::uint64_t data_section_bytes) {
  const std::uint32_t h = blk.blockIdx.x, s = blk.blockIdx.y;
  const std::uint32_t kv_head = h / (num_q_heads / num_kv_heads);
  const KeySet keys = key_set(seq_lens[s], max_blocks_per_seq, block_size, 0, 0);
  const std::uint64_t row_width = std::uint64_t{num_kv_heads} * kv_cache_dim;
  const std::uint64_t e0 = std::uint64_t{kv_head} * kv_cache_dim;  // first element of this KV head

  auto dequant = [&](std::uint32_t j, bool is_v) {
    const std::uint32_t t = keys.start + j, column = t / block_size;
    const std::int32_t phys = block_tables[std::uint64_t{s} * max_blocks_per_seq + column];
    const std::uint64_t slot = t % block_size;
    const Global<const std::uint8_t> blk_base =
        (is_v ? v_cache : k_cache) + std::int64_t{phys} * static_cast<std::int64_t>(block_stride_bytes);
    const std::uint64_t through = data_section_bytes + (slot + 1) * row_width / 16;  // the key's data and scales
    blk_base.require_in_bounds(0, through, [&] {
      const std::int64_t first = std::int64_t{phys} * static_cast<std::int64_t>(block_stride_bytes);
      return bad_block_entry(s, column, phys, is_v ? "v_cache" : "k_cache", t, "block through its scales", first,
                             first + static_cast<std::int64_t>(through));
    });
    const auto data = blk_base.read(slot * row_width / 2 + e0 / 2, (e0 + kv_cache_dim + 1) / 2 - e0 / 2);
    const auto scales =
        blk_base.read(data_section_bytes + slot * row_width / 16 + e0 / 16, (e0 + kv_cache_dim + 15) / 16 - e0 / 16);
    return [data, scales, e0](std::uint32_t d) {
      const std::uint64_t e = e0 + d;
      const std::uint8_t byte = data[e / 2 - e0 / 2];
      const std::uint8_t code = e % 2 == 0 ? (byte & 0xF) : (byte >> 4);
      return e2m1_decode(code) * e4m3_decode(scales[e / 16 - e0 / 16]);
    };
  };
  struct {
    decltype(dequant)& f;
    auto k(std::uint32_t j) { return f(j, false); }
    auto v(std::uint32_t j) { return f(j, true); }
  } rows{dequant};

  paged_attention(blk, q, o, q_head_dim, kv_cache_dim, inv_sqrt_d, keys, 0.0f, false, rows);
}

// ---------------------------------------------------------------------------
// mla_paged_cache_store_fp8: token t's K and V rows to slot slot_mapping[t] (−1 = skip) as
// E4M3(x / scale). Grid: [num_tokens]. Block: 256, threads stride over the row.
//   k_src, v_src [num_tokens, row_width] bf16; slot_mapping [num_tokens] int32
//   k_cache, v_cache: row of slot at slot·cache_stride, e4m3
void mla_paged_cache_store_fp8(Block& blk, Global<const Bf16> k_src, Global<const Bf16> v_src,
                               Global<std::uint8_t> k_cache, Global<std::uint8_t> v_cache,
                               Global<const std::int32_t> slot_mapping, std::uint32_t num_tokens,
                               std::uint32_t row_width, std::uint32_t block_size, std::uint64_t cache_stride,
                               float k_scale, float v_scale) {
  (void)num_tokens;
  (void)block_size;  // slot = block·block_size + offset, so the row is at slot·cache_stride
  const std::uint64_t t = blk.blockIdx.x;
  const std::int32_t slot = slot_mapping[t];
  if (slot < 0) return;
  const std::uint64_t dst = static_cast<std::uint64_t>(slot) * cache_stride;
  blk.threads([&](std::uint32_t tid) {
    for (std::uint64_t e = tid; e < row_width; e += blk.blockDim.x) {
      k_cache[dst + e] = e4m3_encode(k_src[t * row_width + e].to_float() / k_scale);
      v_cache[dst + e] = e4m3_encode(v_src[t * row_width + e].to_float() / v_scale);
    }
  });
}

// ---------------------------------------------------------------------------
// mla_paged_cache_store_nvfp4: token t's K and V rows to slot slot_mapping[t] (−1 = skip), NVFP4.
// Grid: [num_tokens]. Block: 256, one thread per group of 16 values (strided).
//   k_src, v_src [num_tokens, row_width] bf16; slot_mapping [num_tokens] int32
//   k_cache, v_cache: NVFP4 blocks of block_stride_bytes (layout as in the decode)
void mla_paged_cache_store_nvfp4(Block& blk, Global<const Bf16> k_src, Global<const Bf16> v_src,
                                 Global<std::uint8_t> k_cache, Global<std::uint8_t> v_cache,
                                 Global<const std::int32_t> slot_mapping, std::uint32_t num_tokens,
                                 std::uint32_t row_width, std::uint32_t block_size, std::uint64_t block_stride_bytes,
                                 std::uint64_t data_section_bytes) {
  (void)num_tokens;
  const std::uint64_t t = blk.blockIdx.x;
  const std::int32_t slot = slot_mapping[t];
  if (slot < 0) return;
  const std::uint64_t base = static_cast<std::uint64_t>(slot) / block_size * block_stride_bytes;
  const std::uint64_t i = static_cast<std::uint64_t>(slot) % block_size;
  blk.threads([&](std::uint32_t tid) {
    for (std::uint64_t g = tid; g < row_width / kNvfp4Group; g += blk.blockDim.x) {
      for (int which = 0; which < 2; ++which) {
        const Global<const Bf16>& src = which == 0 ? k_src : v_src;
        const Global<std::uint8_t>& cache = which == 0 ? k_cache : v_cache;
        std::array<float, kNvfp4Group> x{};
        const auto in = src.read(t * row_width + g * kNvfp4Group, kNvfp4Group);
        for (std::size_t e = 0; e < kNvfp4Group; ++e) x[e] = in[e].to_float();
        std::array<std::uint8_t, 8> packed{};
        std::uint8_t scale = 0;
        nvfp4_encode_group(x, packed, scale);
        const auto data = cache.write(base + i * row_width / 2 + g * 8, 8);
        std::copy(packed.begin(), packed.end(), data.begin());
        cache[base + data_section_bytes + i * row_width / 16 + g] = scale;
      }
    }
  });
}

// Block shape rules (SPEC §3 launch column).
BlockRule assemble_block() {
  return [](Dim3 block, std::span<const KernelArg> args) -> std::optional<std::string> {
    const std::uint32_t want = std::max(args[6].as_u32(), 256u);
    if (block == Dim3{want, 1, 1}) return std::nullopt;
    return fmt::format("block ({},{},{}) but mla_cache_assemble needs ({},1,1) = max(mla_cache_dim, 256)", block.x,
                       block.y, block.z, want);
  };
}

}  // namespace

void register_mla_absorbed(Registry& r) {
  const char* m = "mla_absorbed";
  const Dim3 b256{256, 1, 1};
  r.add<&mla_batched_gemv>(m, "mla_batched_gemv",
                           {"input", "weight", "output", "n_out", "k", "input_stride", "output_stride"},
                           block_is(b256));
  r.add<&mla_q_rope_scatter>(
      m, "mla_q_rope_scatter",
      {"q_full", "q_absorbed_buf", "q_rope_contiguous", "nq", "hd", "nope", "rope", "kv_lora", "mla_cache_dim"},
      block_is(b256));
  r.add<&mla_q_rope_writeback>(m, "mla_q_rope_writeback",
                               {"q_rope_direct", "q_absorbed_buf", "nq", "rope", "kv_lora", "mla_cache_dim"},
                               block_is(b256));
  r.add<&mla_cache_assemble>(m, "mla_cache_assemble",
                             {"kv_latent", "k_rope", "k_cache", "v_cache", "kv_lora", "rope", "mla_cache_dim"},
                             assemble_block());
  r.add<&rope_pairs_bf16>(m, "rope_pairs_bf16", {"x", "rows", "rope", "pos", "theta"}, block_is(b256));
  r.add<&mla_paged_decode_nvfp4>(
      m, "mla_paged_decode_nvfp4",
      {"q", "k_cache", "v_cache", "o", "block_tables", "seq_lens", "max_blocks_per_seq", "num_q_heads", "num_kv_heads",
       "q_head_dim", "kv_cache_dim", "block_size", "inv_sqrt_d", "block_stride_bytes", "data_section_bytes"},
      block_is(b256));
  r.add<&mla_paged_decode_fp8>(m, "mla_paged_decode_fp8",
                               {"q",
                                "k_cache",
                                "v_cache",
                                "o",
                                "block_tables",
                                "seq_lens",
                                "max_blocks_per_seq",
                                "num_q_heads",
                                "num_kv_heads",
                                "q_head_dim",
                                "kv_cache_dim",
                                "block_size",
                                "inv_sqrt_d",
                                "k_scale",
                                "v_scale",
                                "cache_stride",
                                "sliding_window",
                                "sinks",
                                "comp_pool",
                                "comp_block_count"},
                               block_is(b256));
  r.add<&mla_paged_cache_store_fp8>(m, "mla_paged_cache_store_fp8",
                                    {"k_src", "v_src", "k_cache", "v_cache", "slot_mapping", "num_tokens", "row_width",
                                     "block_size", "cache_stride", "k_scale", "v_scale"},
                                    block_is(b256));
  r.add<&mla_paged_cache_store_nvfp4>(m, "mla_paged_cache_store_nvfp4",
                                      {"k_src", "v_src", "k_cache", "v_cache", "slot_mapping", "num_tokens",
                                       "row_width", "block_size", "block_stride_bytes", "data_section_bytes"},
                                      block_is(b256));
}

}  // namespace metrale::emu
