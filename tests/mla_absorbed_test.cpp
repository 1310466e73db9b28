// Each port of module mla_absorbed against the float64 reference (or an exact
// expectation), at odd sizes and the model's, with outputs poisoned with NaN.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "metrale/buffer.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/formats.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/reference.hpp"
#include "paged_cases.hpp"
#include "support.hpp"

using namespace metrale;

namespace {

constexpr Bf16 kNanBf16{0x7FC0};
constexpr std::uint64_t kB = sizeof(Bf16);

std::vector<Bf16> random_bf16(std::size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> uni(lo, hi);
  std::vector<Bf16> v(n);
  for (auto& x : v) x = Bf16::from_float(uni(rng));
  return v;
}

std::vector<float> floats(const std::vector<Bf16>& v) {
  std::vector<float> f(v.size());
  std::transform(v.begin(), v.end(), f.begin(), [](Bf16 b) { return b.to_float(); });
  return f;
}

bool same_bits(Bf16 a, Bf16 b) { return a.bits == b.bits; }

}  // namespace

TEST_CASE("mla_batched_gemv matches the float64 reference", "[mla_absorbed][gemv]") {
  struct Shape {
    std::uint32_t n_out, k, heads, in_pad, out_pad;
  };
  const Shape shapes[] = {
      {1, 1, 1, 0, 0},     {3, 7, 1, 2, 1},   {7, 19, 3, 0, 5},       {19, 733, 7, 3, 0},
      {733, 3, 1, 0, 2},   {9, 33, 19, 1, 1}, {512, 128, 16, 64, 64},  // absorb: q_full → q_absorbed
      {128, 512, 8, 64, 0}};                                           // W_UV: o → attn_out
  std::mt19937_64 rng(7);
  for (const auto& s : shapes) {
    const std::uint32_t is = s.k + s.in_pad, os = s.n_out + s.out_pad;
    INFO("n_out=" << s.n_out << " k=" << s.k << " heads=" << s.heads << " input_stride=" << is
                  << " output_stride=" << os);
    emu::EmulatorBackend gpu;
    const auto x = random_bf16(std::size_t{s.heads} * is, rng),
               w = random_bf16(std::size_t{s.heads} * s.n_out * s.k, rng);
    const auto x_d = DeviceBuffer::from_host<Bf16>(gpu, x), w_d = DeviceBuffer::from_host<Bf16>(gpu, w);
    const auto y_d = DeviceBuffer::from_host<Bf16>(gpu, std::vector<Bf16>(std::size_t{s.heads} * os, kNanBf16));
    mla_batched_gemv(gpu, gpu.kernel("mla_absorbed", "mla_batched_gemv"),
                     {x_d.ptr(), w_d.ptr(), y_d.ptr(), s.n_out, s.k, s.heads, is, os});
    const auto y = y_d.to_host<Bf16>();
    const auto xf = floats(x), wf = floats(w);
    const auto ref = ref::batched_gemv(xf, wf, s.n_out, s.k, s.heads, is);
    for (std::uint32_t h = 0; h < s.heads; ++h) {
      for (std::uint32_t n = 0; n < os; ++n) {
        const Bf16 got = y[std::size_t{h} * os + n];
        if (n >= s.n_out) {  // the gap between heads is never written
          REQUIRE(same_bits(got, kNanBf16));
          continue;
        }
        double mag = 0;  // Σ|w·x| bounds the FP32 accumulation error
        for (std::uint32_t j = 0; j < s.k; ++j)
          mag += std::fabs(double{wf[(std::size_t{h} * s.n_out + n) * s.k + j]} * xf[std::size_t{h} * is + j]);
        const double want = ref[std::size_t{h} * s.n_out + n];
        INFO("h=" << h << " n=" << n);
        REQUIRE(std::fabs(got.to_float() - want) <= 0x1p-8 * std::fabs(want) + s.k * 0x1p-23 * mag);
      }
    }
  }
}

TEST_CASE("mla_q_rope_scatter and mla_q_rope_writeback copy exactly the rope columns", "[mla_absorbed][rope]") {
  struct Shape {
    std::uint32_t nq, nope, rope, kv_lora, extra_hd, extra_cd;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 0, 0},      {3, 7, 2, 19, 1, 3},  {19, 3, 7, 1, 0, 2},
                          {7, 128, 64, 512, 0, 0}, {733, 2, 3, 5, 1, 1}, {128, 128, 64, 512, 0, 0}};
  std::mt19937_64 rng(11);
  for (const auto& s : shapes) {
    const std::uint32_t hd = s.nope + s.rope + s.extra_hd, cd = s.kv_lora + s.rope + s.extra_cd;
    INFO("nq=" << s.nq << " hd=" << hd << " nope=" << s.nope << " rope=" << s.rope << " kv_lora=" << s.kv_lora
               << " mla_cache_dim=" << cd);
    emu::EmulatorBackend gpu;
    const auto k = MlaAbsorbedKernels::resolve(gpu);
    const auto q_full = random_bf16(std::size_t{s.nq} * hd, rng);
    const auto q_full_d = DeviceBuffer::from_host<Bf16>(gpu, q_full);
    const auto q_abs_d = DeviceBuffer::from_host<Bf16>(gpu, std::vector<Bf16>(std::size_t{s.nq} * cd, kNanBf16));
    const auto q_rope_d = DeviceBuffer::from_host<Bf16>(gpu, std::vector<Bf16>(std::size_t{s.nq} * s.rope, kNanBf16));
    mla_q_rope_scatter(gpu, k.q_rope_scatter,
                       {q_full_d.ptr(), q_abs_d.ptr(), q_rope_d.ptr(), s.nq, hd, s.nope, s.rope, s.kv_lora, cd});
    auto q_abs = q_abs_d.to_host<Bf16>();
    const auto q_rope = q_rope_d.to_host<Bf16>();
    for (std::uint32_t h = 0; h < s.nq; ++h) {
      for (std::uint32_t c = 0; c < cd; ++c) {
        const bool rope_col = c >= s.kv_lora && c < s.kv_lora + s.rope;
        const Bf16 want = rope_col ? q_full[std::size_t{h} * hd + s.nope + (c - s.kv_lora)] : kNanBf16;
        REQUIRE(same_bits(q_abs[std::size_t{h} * cd + c], want));
      }
      for (std::uint32_t i = 0; i < s.rope; ++i)
        REQUIRE(same_bits(q_rope[std::size_t{h} * s.rope + i], q_full[std::size_t{h} * hd + s.nope + i]));
    }
    // Writeback of other values into the same columns.
    const auto direct = random_bf16(std::size_t{s.nq} * s.rope, rng);
    const auto direct_d = DeviceBuffer::from_host<Bf16>(gpu, direct);
    mla_q_rope_writeback(gpu, k.q_rope_writeback, {direct_d.ptr(), q_abs_d.ptr(), s.nq, s.rope, s.kv_lora, cd});
    const auto after = q_abs_d.to_host<Bf16>();
    for (std::uint32_t h = 0; h < s.nq; ++h)
      for (std::uint32_t c = 0; c < cd; ++c) {
        const bool rope_col = c >= s.kv_lora && c < s.kv_lora + s.rope;
        REQUIRE(same_bits(after[std::size_t{h} * cd + c],
                          rope_col ? direct[std::size_t{h} * s.rope + (c - s.kv_lora)] : kNanBf16));
      }
  }
}

TEST_CASE("mla_cache_assemble builds [latent | rope | 0] and [latent | 0]", "[mla_absorbed][assemble]") {
  struct Shape {
    std::uint32_t kv_lora, rope, cd;
  };
  const Shape shapes[] = {{1, 0, 1}, {3, 1, 7}, {7, 7, 19}, {19, 3, 733}, {512, 64, 576}, {733, 19, 1024}};
  std::mt19937_64 rng(3);
  for (const auto& s : shapes) {
    INFO("kv_lora=" << s.kv_lora << " rope=" << s.rope << " mla_cache_dim=" << s.cd);
    emu::EmulatorBackend gpu;
    const auto latent = random_bf16(s.kv_lora, rng), rope = random_bf16(std::max(s.rope, 1u), rng);
    const auto latent_d = DeviceBuffer::from_host<Bf16>(gpu, latent), rope_d = DeviceBuffer::from_host<Bf16>(gpu, rope);
    const std::vector<Bf16> poison(s.cd, kNanBf16);
    const auto k_d = DeviceBuffer::from_host<Bf16>(gpu, poison), v_d = DeviceBuffer::from_host<Bf16>(gpu, poison);
    mla_cache_assemble(gpu, gpu.kernel("mla_absorbed", "mla_cache_assemble"),
                       {latent_d.ptr(), rope_d.ptr(), k_d.ptr(), v_d.ptr(), s.kv_lora, s.rope, s.cd});
    const auto kr = k_d.to_host<Bf16>(), vr = v_d.to_host<Bf16>();
    for (std::uint32_t c = 0; c < s.cd; ++c) {
      const Bf16 want_k = c < s.kv_lora ? latent[c] : c < s.kv_lora + s.rope ? rope[c - s.kv_lora] : Bf16{};
      REQUIRE(same_bits(kr[c], want_k));
      REQUIRE(same_bits(vr[c], c < s.kv_lora ? latent[c] : Bf16{}));
    }
  }
}

TEST_CASE("rope_pairs_bf16 matches the float64 rotation", "[mla_absorbed][rope]") {
  struct Shape {
    std::uint32_t rows, rope, pos;
    float theta;
  };
  const Shape shapes[] = {{1, 2, 0, 10000},   {3, 64, 1, 10000},     {7, 6, 19, 50000},   {19, 64, 299, 50000},
                          {733, 2, 7, 10000}, {16, 64, 4095, 10000}, {1, 64, 65535, 1e6f}};
  std::mt19937_64 rng(5);
  for (const auto& s : shapes) {
    INFO("rows=" << s.rows << " rope=" << s.rope << " pos=" << s.pos << " theta=" << s.theta);
    emu::EmulatorBackend gpu;
    const auto x = random_bf16(std::size_t{s.rows} * s.rope, rng);
    const auto x_d = DeviceBuffer::from_host<Bf16>(gpu, x);
    rope_pairs_bf16(gpu, gpu.kernel("mla_absorbed", "rope_pairs_bf16"), {x_d.ptr(), s.rows, s.rope, s.pos, s.theta});
    const auto got = x_d.to_host<Bf16>();
    const auto xf = floats(x);
    std::vector<double> want(xf.begin(), xf.end());
    ref::rope_pairs(want, s.rope, s.pos, s.theta);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::size_t pair = i / 2 * 2;
      const double norm = std::fabs(xf[pair]) + std::fabs(xf[pair + 1]);
      // BF16 rounding of the output, plus FP32 angle error (pos · 2^-24 rad) and trig error.
      const double tol = 0x1p-8 * std::fabs(want[i]) + norm * (s.pos * 0x1p-23 + 0x1p-20);
      INFO("element " << i);
      REQUIRE(std::fabs(got[i].to_float() - want[i]) <= tol);
    }
  }
}

namespace {

// Poison the cache with a byte pattern (so every byte counts as written), store, and return the pools.
struct StoreCase {
  KvFormat format;
  std::uint32_t num_tokens, row_width, block_size, num_blocks;
  std::uint64_t pitch;  // FP8 cache_stride
};

}  // namespace

TEST_CASE("mla_paged_cache_store_fp8 and _nvfp4 write the encoded rows at their slots", "[mla_absorbed][store]") {
  const StoreCase cases[] = {{KvFormat::fp8, 1, 1, 1, 2, 1},       {KvFormat::fp8, 3, 7, 3, 3, 9},
                             {KvFormat::fp8, 19, 733, 7, 5, 736},  {KvFormat::fp8, 7, 576, 16, 2, 576},
                             {KvFormat::nvfp4, 1, 16, 1, 2, 0},    {KvFormat::nvfp4, 7, 48, 3, 5, 0},
                             {KvFormat::nvfp4, 19, 576, 16, 3, 0}, {KvFormat::nvfp4, 3, 1024, 1, 4, 0}};
  std::mt19937_64 rng(9);
  for (const auto& c : cases) {
    INFO("format=" << to_string(c.format) << " num_tokens=" << c.num_tokens << " row_width=" << c.row_width
                   << " block_size=" << c.block_size << " num_blocks=" << c.num_blocks);
    emu::EmulatorBackend gpu;
    const auto kernels = MlaAbsorbedKernels::resolve(gpu);
    auto k_src = random_bf16(std::size_t{c.num_tokens} * c.row_width, rng, -3, 3);
    const auto v_src = random_bf16(k_src.size(), rng, -3, 3);
    if (c.format == KvFormat::nvfp4 && c.row_width >= 32)
      std::fill_n(k_src.begin() + 16, 16, Bf16{});  // an all-zero group of token 0
    // Distinct random slots, one token skipped with -1.
    std::vector<std::int32_t> slots(std::size_t{c.num_blocks} * c.block_size);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(c.num_tokens);
    if (c.num_tokens > 2) slots[1] = -1;
    const float k_scale = 0.37f, v_scale = 1.9f;  // not powers of two
    const std::uint64_t width = c.row_width;
    const std::uint64_t data_section = std::uint64_t{c.block_size} * width / 2 + 16;
    const std::uint64_t block_stride = data_section + std::uint64_t{c.block_size} * width / 16 + 16;
    const std::uint64_t pool = c.format == KvFormat::fp8 ? std::uint64_t{c.num_blocks} * c.block_size * c.pitch
                                                         : std::uint64_t{c.num_blocks} * block_stride;
    const std::vector<std::uint8_t> poison(pool, 0xA5);
    const auto k_d = DeviceBuffer::from_host<std::uint8_t>(gpu, poison),
               v_d = DeviceBuffer::from_host<std::uint8_t>(gpu, poison);
    const auto ks_d = DeviceBuffer::from_host<Bf16>(gpu, k_src), vs_d = DeviceBuffer::from_host<Bf16>(gpu, v_src);
    const auto slots_d = DeviceBuffer::from_host<std::int32_t>(gpu, slots);
    const CacheStoreCommon common{ks_d.ptr(),    vs_d.ptr(),   k_d.ptr(),   v_d.ptr(),
                                  slots_d.ptr(), c.num_tokens, c.row_width, c.block_size};
    if (c.format == KvFormat::fp8)
      mla_paged_cache_store_fp8(gpu, kernels.paged_cache_store_fp8, {common, c.pitch, k_scale, v_scale});
    else
      mla_paged_cache_store_nvfp4(gpu, kernels.paged_cache_store_nvfp4, {common, block_stride, data_section});

    // The expected pools: the poison, with each stored token's row encoded in place.
    std::vector<std::uint8_t> want_k = poison, want_v = poison;
    for (std::uint32_t t = 0; t < c.num_tokens; ++t) {
      if (slots[t] < 0) continue;
      const auto slot = static_cast<std::uint64_t>(slots[t]);
      for (std::uint64_t e = 0; e < width; ++e) {
        if (c.format == KvFormat::fp8) {
          want_k[slot * c.pitch + e] = e4m3_encode(k_src[t * width + e].to_float() / k_scale);
          want_v[slot * c.pitch + e] = e4m3_encode(v_src[t * width + e].to_float() / v_scale);
        }
      }
      if (c.format == KvFormat::nvfp4) {
        const std::uint64_t base = slot / c.block_size * block_stride, i = slot % c.block_size;
        for (std::uint64_t g = 0; g < width / 16; ++g) {
          for (auto* which : {&want_k, &want_v}) {
            const auto& src = which == &want_k ? k_src : v_src;
            std::array<float, 16> x{};
            for (int e = 0; e < 16; ++e) x[e] = src[t * width + g * 16 + e].to_float();
            std::array<std::uint8_t, 8> packed{};
            std::uint8_t scale = 0;
            nvfp4_encode_group(x, packed, scale);
            std::copy(packed.begin(), packed.end(),
                      which->begin() + static_cast<std::ptrdiff_t>(base + i * width / 2 + g * 8));
            (*which)[base + data_section + i * width / 16 + g] = scale;
          }
        }
      }
    }
    REQUIRE(k_d.to_host<std::uint8_t>() == want_k);
    REQUIRE(v_d.to_host<std::uint8_t>() == want_v);
  }
}

namespace {

// o against the reference: BF16 output rounding, plus an absolute term for the FP32 softmax that
// is far below the change one missing or extra key makes (≥ 1/keys of |V|).
void check_paged(const test::PagedCase& c) {
  INFO(c.vars());
  emu::EmulatorBackend gpu;
  const auto got = c.run(gpu);
  const auto want = c.reference();
  REQUIRE(got.size() == want.size());
  double vmax = 0;
  for (std::uint8_t b : c.v_pool) vmax = std::max(vmax, std::fabs(double{e4m3_decode(b)}));
  if (c.format == KvFormat::fp8)
    vmax *= c.v_scale;
  else
    vmax = 6.0 * 448;  // bounded by the largest E2M1 code times the largest scale used
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("o[" << i << "] = " << got[i] << ", reference " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= 0x1p-8 * std::fabs(want[i]) + 1e-5 * vmax);
  }
}

}  // namespace

TEST_CASE("mla_paged_decode_fp8 matches the float64 reference", "[mla_absorbed][paged][fp8]") {
  test::PagedCase c;
  SECTION("model dims: 576-wide rows, 16 heads, block 16, a partial last block") {
    c.num_q_heads = 16, c.q_head_dim = 576, c.kv_cache_dim = 576, c.block_size = 16;
    c.num_seqs = 3, c.max_blocks_per_seq = 20, c.num_blocks = 60, c.seq_lens = {300, 1, 17};
    c.inv_sqrt_d = 1.0f / std::sqrt(192.0f), c.k_scale = 0.013f, c.v_scale = 0.021f;
  }
  SECTION("odd sizes: 733 keys over blocks of 7, q_head_dim < kv_cache_dim, row pitch > row") {
    c.num_q_heads = 7, c.q_head_dim = 3, c.kv_cache_dim = 19, c.block_size = 7, c.cache_stride = 23;
    c.num_seqs = 1, c.max_blocks_per_seq = 105, c.num_blocks = 110, c.seq_lens = {733};
  }
  SECTION("empty, one-token and block-edge sequences; garbage in unused columns") {
    c.block_size = 5, c.num_seqs = 7, c.max_blocks_per_seq = 3, c.num_blocks = 40, c.fill = INT32_MAX;
    c.seq_lens = {0, 1, 4, 5, 6, 15, -3};
  }
  SECTION("seq_len past the table is clamped to max_blocks_per_seq x block_size") {
    c.block_size = 3, c.max_blocks_per_seq = 2, c.num_blocks = 4, c.seq_lens = {1000};
  }
  SECTION("grouped heads: 6 q heads over 3 kv heads") {
    c.num_q_heads = 6, c.num_kv_heads = 3, c.q_head_dim = 7, c.kv_cache_dim = 9, c.block_size = 4;
    c.num_seqs = 2, c.max_blocks_per_seq = 5, c.num_blocks = 10, c.seq_lens = {19, 3};
  }
  SECTION("sliding windows covering none, some and all keys, with sinks") {
    c.sinks = true, c.block_size = 4, c.num_seqs = 4, c.max_blocks_per_seq = 8, c.num_blocks = 32;
    c.seq_lens = {30, 5, 7, 0};
    c.sliding_window = GENERATE(1u, 6u, 7u, 31u);
  }
  SECTION("compressed pool of C entries, with and without a window") {
    c.comp_pool = true, c.comp_block_count = GENERATE(0u, 1u, 3u), c.sliding_window = GENERATE(0u, 2u);
    c.num_seqs = 3, c.block_size = 2, c.max_blocks_per_seq = 6, c.num_blocks = 18, c.seq_lens = {0, 3, 11};
    c.sinks = true;
  }
  c.build();
  check_paged(c);
}

TEST_CASE("mla_paged_decode_nvfp4 matches the float64 reference", "[mla_absorbed][paged][nvfp4]") {
  test::PagedCase c;
  c.format = KvFormat::nvfp4;
  SECTION("model dims with all-zero groups") {
    c.num_q_heads = 16, c.q_head_dim = 576, c.kv_cache_dim = 576, c.block_size = 16;
    c.num_seqs = 2, c.max_blocks_per_seq = 20, c.num_blocks = 40, c.seq_lens = {300, 17};
    c.inv_sqrt_d = 1.0f / std::sqrt(192.0f), c.zero_groups_every = 7;
  }
  SECTION("odd sizes: 733 keys, blocks of 7, 19 heads") {
    c.num_q_heads = 19, c.q_head_dim = 5, c.kv_cache_dim = 16, c.block_size = 7;
    c.num_seqs = 1, c.max_blocks_per_seq = 105, c.num_blocks = 105, c.seq_lens = {733};
  }
  SECTION("kv heads whose rows straddle scale groups") {
    c.num_q_heads = 4, c.num_kv_heads = 2, c.q_head_dim = 8, c.kv_cache_dim = 24, c.block_size = 3;
    c.num_seqs = 3, c.max_blocks_per_seq = 4, c.num_blocks = 12, c.seq_lens = {0, 1, 12}, c.fill = INT32_MAX;
  }
  c.build();
  check_paged(c);
}
