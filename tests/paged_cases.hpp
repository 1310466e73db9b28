// Random paged-attention cases for the tests: a cache pool filled with random
// codes, block tables over permuted physical blocks, and everything the paged
// decode launchers take. `run` launches on a backend and returns o; the
// float64 reference comes from `reference()`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "metrale/buffer.hpp"
#include "metrale/formats.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/paged_cache.hpp"
#include "metrale/reference.hpp"

namespace metrale::test {

struct PagedCase {
  KvFormat format = KvFormat::fp8;
  std::uint32_t num_seqs = 1, num_q_heads = 1, num_kv_heads = 1, q_head_dim = 8, kv_cache_dim = 8, block_size = 4;
  std::uint32_t max_blocks_per_seq = 4, num_blocks = 8;
  std::vector<std::int32_t> seq_lens;  // one per sequence; may be negative or past the table
  std::int32_t fill = -1;              // unused block-table columns
  float inv_sqrt_d = 0.125f;
  // FP8
  float k_scale = 0.75f, v_scale = 1.25f;
  std::uint64_t cache_stride = 0;  // 0: row width
  std::uint32_t sliding_window = 0;
  bool sinks = false;
  std::uint32_t comp_block_count = 0;
  bool comp_pool = false;
  std::uint32_t zero_groups_every = 0;  // NVFP4: every n-th group all zero (scale 0)
  std::uint64_t seed = 1;

  // Filled by build().
  std::vector<Bf16> q;
  std::vector<std::uint8_t> k_pool, v_pool, comp;
  std::vector<std::int32_t> block_tables;
  std::vector<float> sink_values;
  std::uint64_t data_section_bytes = 0, block_stride_bytes = 0;

  std::uint64_t row_width() const { return std::uint64_t{num_kv_heads} * kv_cache_dim; }

  /// Every parameter, for a failing test's report.
  std::string vars() const {
    std::ostringstream s;
    s << "format=" << to_string(format) << " num_seqs=" << num_seqs << " num_q_heads=" << num_q_heads
      << " num_kv_heads=" << num_kv_heads << " q_head_dim=" << q_head_dim << " kv_cache_dim=" << kv_cache_dim
      << " block_size=" << block_size << " max_blocks_per_seq=" << max_blocks_per_seq << " num_blocks=" << num_blocks
      << " fill=" << fill << " cache_stride=" << cache_stride << " sliding_window=" << sliding_window
      << " sinks=" << sinks << " comp_block_count=" << comp_block_count << " comp_pool=" << comp_pool
      << " zero_groups_every=" << zero_groups_every << " seed=" << seed << " seq_lens=[";
    for (auto l : seq_lens) s << l << ' ';
    s << "]";
    return s.str();
  }

  /// Random q, cache codes and block tables: each sequence's blocks are drawn
  /// from a shuffled pool, so physical blocks are permuted and sparse.
  void build() {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    if (cache_stride == 0) cache_stride = row_width();
    q.resize(std::size_t{num_seqs} * num_q_heads * q_head_dim);
    for (auto& x : q) x = Bf16::from_float(uni(rng));
    auto random_codes = [&](std::size_t n) {
      std::vector<std::uint8_t> b(n);
      // E4M3 codes below 0x70 in magnitude (|x| < 2): random data that never hits NaN.
      for (auto& c : b) c = static_cast<std::uint8_t>((rng() % 0x70) | (rng() % 2 ? 0x80 : 0));
      return b;
    };
    if (format == KvFormat::fp8) {
      k_pool = random_codes(std::size_t{num_blocks} * block_size * cache_stride);
      v_pool = random_codes(k_pool.size());
    } else {
      data_section_bytes = std::uint64_t{block_size} * row_width() / 2 + 16;  // slack: ≥ is allowed
      block_stride_bytes = data_section_bytes + std::uint64_t{block_size} * row_width() / 16 + 32;
      auto nvfp4_pool = [&] {
        std::vector<std::uint8_t> b(std::size_t{num_blocks} * block_stride_bytes);
        for (auto& c : b) c = static_cast<std::uint8_t>(rng());
        for (std::uint32_t blk = 0; blk < num_blocks; ++blk) {
          for (std::uint32_t i = 0; i < block_size; ++i) {
            for (std::uint64_t g = 0; g < row_width() / 16; ++g) {
              std::uint8_t& scale = b[blk * block_stride_bytes + data_section_bytes + i * row_width() / 16 + g];
              scale = static_cast<std::uint8_t>(0x20 + rng() % 0x30);  // finite positive scales
              const std::uint64_t n = (std::uint64_t{blk} * block_size + i) * (row_width() / 16) + g;
              if (zero_groups_every != 0 && n % zero_groups_every == 0) {
                scale = 0;
                for (int m = 0; m < 8; ++m) b[blk * block_stride_bytes + i * row_width() / 2 + g * 8 + m] = 0;
              }
            }
          }
        }
        return b;
      };
      k_pool = nvfp4_pool();
      v_pool = nvfp4_pool();
    }
    std::vector<std::int32_t> phys(num_blocks);
    std::iota(phys.begin(), phys.end(), 0);
    std::shuffle(phys.begin(), phys.end(), rng);
    block_tables.assign(std::size_t{num_seqs} * max_blocks_per_seq, fill);
    std::size_t next = 0;
    for (std::uint32_t s = 0; s < num_seqs; ++s) {
      const std::int64_t len = std::clamp<std::int64_t>(seq_lens[s], 0, std::int64_t{max_blocks_per_seq} * block_size);
      const std::int64_t used = (len + block_size - 1) / block_size;
      for (std::int64_t b = 0; b < used; ++b) block_tables[s * max_blocks_per_seq + b] = phys[next++ % num_blocks];
    }
    sink_values.clear();
    if (sinks)
      for (std::uint32_t h = 0; h < num_q_heads; ++h) sink_values.push_back(uni(rng) * 4.0f);
    comp.clear();
    if (comp_pool) comp = random_codes(std::size_t{num_seqs} * std::max(comp_block_count, 1u) * 2 * cache_stride);
  }

  ref::PagedAttentionProblem problem(const std::vector<float>& q_f32) const {
    ref::PagedAttentionProblem p;
    p.format = format;
    p.q = q_f32;
    p.k_pool = k_pool;
    p.v_pool = v_pool;
    p.block_tables = block_tables;
    p.seq_lens = seq_lens;
    p.num_seqs = num_seqs;
    p.max_blocks_per_seq = max_blocks_per_seq;
    p.num_q_heads = num_q_heads;
    p.num_kv_heads = num_kv_heads;
    p.q_head_dim = q_head_dim;
    p.kv_cache_dim = kv_cache_dim;
    p.block_size = block_size;
    p.inv_sqrt_d = inv_sqrt_d;
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    p.cache_stride = cache_stride;
    p.sliding_window = sliding_window;
    p.sinks = sink_values;
    if (comp_pool) p.comp_pool = comp;
    p.comp_block_count = comp_pool ? comp_block_count : 0;
    p.block_stride_bytes = block_stride_bytes;
    p.data_section_bytes = data_section_bytes;
    return p;
  }

  /// The float64 reference o [num_seqs, num_q_heads, kv_cache_dim].
  std::vector<double> reference() const {
    std::vector<float> qf(q.size());
    std::transform(q.begin(), q.end(), qf.begin(), [](Bf16 b) { return b.to_float(); });
    return ref::paged_attention(problem(qf));
  }

  /// Launch on `gpu` with o poisoned with NaN first; returns o as floats.
  std::vector<float> run(GpuBackend& gpu) const {
    const auto k = MlaAbsorbedKernels::resolve(gpu);
    const auto q_d = DeviceBuffer::from_host<Bf16>(gpu, q);
    const auto k_d = DeviceBuffer::from_host<std::uint8_t>(gpu, k_pool);
    const auto v_d = DeviceBuffer::from_host<std::uint8_t>(gpu, v_pool);
    const auto bt_d = DeviceBuffer::from_host<std::int32_t>(gpu, block_tables);
    const auto sl_d = DeviceBuffer::from_host<std::int32_t>(gpu, seq_lens);
    const auto sink_d = DeviceBuffer::from_host<float>(gpu, sink_values);
    const auto comp_d = DeviceBuffer::from_host<std::uint8_t>(gpu, comp);
    const std::vector<Bf16> poison(std::size_t{num_seqs} * num_q_heads * kv_cache_dim, Bf16{0x7FC0});
    const auto o_d = DeviceBuffer::from_host<Bf16>(gpu, poison);
    const PagedDecodeCommon c{q_d.ptr(),    k_d.ptr(),          v_d.ptr(),   o_d.ptr(),    bt_d.ptr(),
                              sl_d.ptr(),   max_blocks_per_seq, num_q_heads, num_kv_heads, q_head_dim,
                              kv_cache_dim, block_size,         inv_sqrt_d,  num_seqs};
    if (format == KvFormat::fp8) {
      mla_paged_decode_fp8(
          gpu, k.paged_decode_fp8,
          {c, k_scale, v_scale, cache_stride, sliding_window, sink_d.ptr(), comp_d.ptr(), comp_block_count});
    } else {
      mla_paged_decode_nvfp4(gpu, k.paged_decode_nvfp4, {c, block_stride_bytes, data_section_bytes});
    }
    gpu.synchronize(0);
    const auto o = o_d.to_host<Bf16>();
    std::vector<float> out(o.size());
    std::transform(o.begin(), o.end(), out.begin(), [](Bf16 b) { return b.to_float(); });
    return out;
  }
};

}  // namespace metrale::test
