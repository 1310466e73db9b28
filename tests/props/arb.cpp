#include "arb.hpp"

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "metrale/error.hpp"

namespace metrale::props {

namespace {

using rc::gen::element;

constexpr std::int32_t kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t kI32Min = std::numeric_limits<std::int32_t>::min();

std::uint32_t arb_block_size() {
  return *rc::gen::oneOf(in_range<std::uint32_t>(1, 9),
                         element<std::uint32_t>(15, 16, 17, 31, 32, 33, 63, 64, 127, 128, 255, 256, 511, 512));
}

// One sequence length against a table of `max_blocks` blocks of `bs` tokens: the edges first.
std::int32_t arb_seq_len(std::uint32_t bs, std::uint32_t max_blocks) {
  const auto b = static_cast<std::int32_t>(bs), cap = static_cast<std::int32_t>(bs * max_blocks);
  switch (*in_range(0, 10)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return b - 1;
    case 3:
      return std::min(b, cap);
    case 4:
      return std::min(b + 1, cap);
    case 5:
      return b * *in_range<std::int32_t>(1, static_cast<std::int32_t>(max_blocks) + 1);  // a multiple
    case 6:
      return cap;  // the maximum
    case 7:
      return cap + *in_range<std::int32_t>(1, b + 2);  // past it: clamped by the kernel
    case 8:
      return -*in_range<std::int32_t>(1, 1000);  // negative: treated as 0
    default:
      return *in_range<std::int32_t>(0, cap + 1);
  }
}

// The fields both paged generators share once the shape is fixed.
void arb_batch(gen::PagedSpec& p, std::uint32_t max_seqs, std::uint32_t max_table) {
  p.num_seqs = *in_range<std::uint32_t>(1, max_seqs + 1);
  p.max_blocks_per_seq = *in_range<std::uint32_t>(1, max_table + 1);
  p.seq_lens.clear();
  std::uint64_t needed = 0;
  for (std::uint32_t s = 0; s < p.num_seqs; ++s) {
    const std::int32_t len = arb_seq_len(p.block_size, p.max_blocks_per_seq);
    p.seq_lens.push_back(len);
    const std::int64_t used = std::clamp<std::int64_t>(len, 0, std::int64_t{p.block_size} * p.max_blocks_per_seq);
    needed += static_cast<std::uint64_t>((used + p.block_size - 1) / p.block_size);
  }
  // Spare physical blocks: the tables' blocks are a sparse, shuffled subset of the pool.
  p.num_blocks = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, needed + *in_range<std::uint32_t>(0, 9)));
  p.fill = *rc::gen::oneOf(rc::gen::just(-1), rc::gen::just(kI32Max), rc::gen::just(kI32Min),
                           rc::gen::resize(100, rc::gen::arbitrary<std::int32_t>()));
  p.inv_sqrt_d =
      *rc::gen::arbitrary<bool>() ? 1.0f / std::sqrt(static_cast<float>(p.q_head_dim)) : arb_scale(0.01f, 1.0f);
  const std::uint32_t cap = p.block_size * p.max_blocks_per_seq;
  if (p.format == KvFormat::fp8) {
    p.k_scale = arb_scale(0.005f, 2.0f);
    p.v_scale = arb_scale(0.005f, 2.0f);
    switch (*in_range(0, 4)) {  // windows that cover none, some or all of the keys
      case 0:
        p.sliding_window = 0;
        break;
      case 1:
        p.sliding_window = 1;
        break;
      case 2:
        p.sliding_window = *in_range<std::uint32_t>(1, cap + 1);
        break;
      default:
        p.sliding_window = cap + *in_range<std::uint32_t>(0, 5);
    }
    p.sinks = *rc::gen::arbitrary<bool>();
    p.comp_pool = *rc::gen::arbitrary<bool>();
    p.comp_block_count = *in_range<std::uint32_t>(0, 5);
  } else {
    p.zero_groups_every = *in_range<std::uint32_t>(0, 8);
  }
  p.seed = *rc::gen::resize(100, rc::gen::arbitrary<std::uint64_t>());
}

}  // namespace

float arb_scale(float lo, float hi) {
  const float x = lo + (hi - lo) * static_cast<float>(*in_range(0, 1'000'001)) / 1e6f;
  int e = 0;
  // A power of two has mantissa exactly 0.5 in frexp: nudge it off.
  return std::frexp(x, &e) == 0.5f ? x * 1.0625f : x;
}

std::vector<float> arb_floats(std::size_t n) {
  // One drawn seed, not n draws: the values matter only through the reference comparison.
  std::mt19937_64 rng(*rc::gen::resize(100, rc::gen::arbitrary<std::uint64_t>()));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = uni(rng);
  return v;
}

gen::PagedSpec arb_paged_spec(KvFormat format) {
  gen::PagedSpec p;
  p.format = format;
  p.block_size = arb_block_size();
  p.num_kv_heads = *in_range<std::uint32_t>(1, 4);
  p.num_q_heads = p.num_kv_heads * *in_range<std::uint32_t>(1, 5);
  if (format == KvFormat::fp8) {
    p.kv_cache_dim = *in_range<std::uint32_t>(1, 41);
    p.cache_stride = *rc::gen::arbitrary<bool>() ? 0 : p.num_kv_heads * p.kv_cache_dim + *in_range(1, 33);
  } else if (p.num_kv_heads % 2 == 0 && *rc::gen::arbitrary<bool>()) {
    p.kv_cache_dim = 8 * (2 * *in_range<std::uint32_t>(0, 3) + 1);  // a head's groups straddle the next head
  } else {
    p.kv_cache_dim = 16 * *in_range<std::uint32_t>(1, 4);
  }
  p.q_head_dim = *in_range<std::uint32_t>(1, p.kv_cache_dim + 1);
  const bool long_blocks = p.block_size >= 64;  // keep a case's key count in the thousands
  arb_batch(p, long_blocks ? 3 : 6, long_blocks ? 3 : 6);
  return p;
}

gen::PagedSpec arb_split_spec(KvFormat format) {
  gen::PagedSpec p;
  p.format = format;
  p.block_size = arb_block_size();
  p.num_kv_heads = 1;
  p.num_q_heads = *in_range<std::uint32_t>(1, 21);
  p.kv_cache_dim = *element<std::uint32_t>(64, 128, 192);
  p.q_head_dim = 32 * *in_range<std::uint32_t>(1, p.kv_cache_dim / 32 + 1);
  if (format == KvFormat::fp8) p.cache_stride = *rc::gen::arbitrary<bool>() ? 0 : p.kv_cache_dim + 16 * *in_range(1, 3);
  const bool long_blocks = p.block_size >= 64;
  arb_batch(p, long_blocks ? 2 : 4, long_blocks ? 3 : 6);
  return p;
}

MlaConfig arb_k3_config() {
  MlaConfig c;
  c.heads = *in_range<std::uint32_t>(1, 5);
  c.qk_nope_head_dim = *in_range<std::uint32_t>(0, 8);
  c.mla_use_nope = *rc::gen::arbitrary<bool>();
  // An odd rope only under NoPE (rotating, its last dim would have no partner: refused).
  c.qk_rope_head_dim = c.mla_use_nope ? *in_range<std::uint32_t>(c.qk_nope_head_dim == 0 ? 1 : 0, 8)
                                      : 2 * *in_range<std::uint32_t>(c.qk_nope_head_dim == 0 ? 1 : 0, 4);
  c.v_head_dim = *in_range<std::uint32_t>(1, 8);
  c.mla_use_output_gate = *rc::gen::arbitrary<bool>();
  return c;
}

KernelCase arb_kernel_case(const std::string& module, const std::string& entry) {
  const auto seed = *rc::gen::resize(100, rc::gen::arbitrary<std::uint64_t>());
  auto u = [](std::uint32_t lo, std::uint32_t hi) { return *in_range<std::uint32_t>(lo, hi + 1); };
  if (entry == "mla_batched_gemv") return gen::gemv_case(u(1, 40), u(1, 70), u(1, 4), u(0, 3), u(0, 3), seed);
  if (entry == "mla_batched_gemv_wide") {
    KernelCase c = gen::gemv_case(u(1, 80), 8 * u(1, 12), u(1, 4), 8 * u(0, 2), u(0, 3), seed);
    c.module = module;
    c.entry = entry;
    return c;
  }
  if (entry == "mla_q_rope_scatter")
    return gen::q_rope_scatter_case(u(1, 9), u(0, 9), u(1, 9), u(0, 9), u(0, 3), u(0, 3), seed);
  if (entry == "mla_q_rope_writeback") return gen::q_rope_writeback_case(u(1, 9), u(1, 9), u(0, 9), u(0, 3), seed);
  if (entry == "mla_cache_assemble") {
    const std::uint32_t kv = u(1, 40), rope = u(0, 10);
    return gen::cache_assemble_case(kv, rope, kv + rope + u(0, 5), seed);
  }
  if (entry == "rope_pairs_bf16") return gen::rope_case(u(1, 9), 2 * u(1, 8), u(0, 5000), arb_scale(100, 1e5f), seed);
  if (entry == "mla_paged_decode_fp8") return gen::paged_decode_case(arb_paged_spec(KvFormat::fp8));
  if (entry == "mla_paged_decode_nvfp4") return gen::paged_decode_case(arb_paged_spec(KvFormat::nvfp4));
  if (entry == "paged_decode_fp8_split_path") return gen::split_path_case(arb_split_spec(KvFormat::fp8));
  if (entry == "paged_decode_nvfp4_split_path") return gen::split_path_case(arb_split_spec(KvFormat::nvfp4));
  if (entry.starts_with("mla_paged_decode_split")) {
    const KvFormat format = entry.ends_with("fp8") ? KvFormat::fp8 : KvFormat::nvfp4;
    return gen::split_kernel_case(
        arb_split_spec(format), u(1, 4),
        entry.find("split16") != std::string::npos ? gen::SplitEntry::split16 : gen::SplitEntry::split);
  }
  if (entry.starts_with("mla_paged_decode_wgmma")) {
    // DeepSeek's rows, more than 32 heads (one or two head groups; wgmma16: 1-32 heads, one or two
    // groups of 16), and short tables: the port multiplies 64 (16) rows of 576 for every key, and
    // a property runs every launcher per case.
    const bool sixteen = entry.starts_with("mla_paged_decode_wgmma16");
    gen::PagedSpec p;
    p.format = entry.ends_with("fp8") ? KvFormat::fp8 : KvFormat::nvfp4;
    p.block_size = *rc::gen::oneOf(in_range<std::uint32_t>(1, 9), element<std::uint32_t>(15, 16, 17, 31, 32, 33, 64));
    p.num_kv_heads = 1, p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = sixteen ? u(1, 32) : u(33, 66);
    if (p.format == KvFormat::fp8) p.cache_stride = *rc::gen::arbitrary<bool>() ? 0 : 576 + 16 * u(1, 3);
    arb_batch(p, 2, 3);
    const bool in_m = entry.find("_latent_") != std::string::npos;  // one latent pool, no compressed entries
    if (in_m) p.latent = true, p.comp_pool = false, p.comp_block_count = 0;
    if (entry.ends_with("_combine_fp8")) {  // its cluster holds at most 8 chunks
      p.sinks = *rc::gen::arbitrary<bool>();
      const std::uint64_t keys =
          std::uint64_t{p.max_blocks_per_seq} * p.block_size + (p.comp_pool ? p.comp_block_count : 0);
      const auto least = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (keys + 7 * 64 - 1) / (7 * 64)));
      return gen::fused_decode_case(p, least + u(0, 1), in_m);
    }
    const gen::SplitEntry which = in_m                                      ? gen::SplitEntry::wgmma_latent
                                  : entry.find("_rs_") != std::string::npos ? gen::SplitEntry::wgmma16_rs
                                  : sixteen                                 ? gen::SplitEntry::wgmma16
                                                                            : gen::SplitEntry::wgmma;
    return gen::split_kernel_case(p, u(1, 2), which);
  }
  if (entry == "mla_paged_decode_combine")
    return gen::combine_case(u(1, 3), u(1, 5), u(1, 80), u(1, 9), *rc::gen::arbitrary<bool>(), seed);
  if (entry == "mla_paged_cache_store_fp8" || entry == "mla_paged_cache_store_nvfp4") {
    const bool fp8 = entry == "mla_paged_cache_store_fp8";
    const std::uint32_t block_size = u(1, 5), num_blocks = u(1, 4), width = fp8 ? u(1, 40) : 16 * u(1, 3);
    return gen::cache_store_case(fp8 ? KvFormat::fp8 : KvFormat::nvfp4, u(1, block_size * num_blocks), width,
                                 block_size, num_blocks, fp8 ? width + u(0, 5) : 0, seed);
  }
  if (entry == "k3_mla_maybe_rope_f32") {
    const bool use_nope = *rc::gen::arbitrary<bool>();  // an odd rope only under NoPE
    const std::uint32_t nope = u(0, 8), rope = use_nope ? u(nope == 0 ? 1 : 0, 8) : 2 * u(nope == 0 ? 1 : 0, 4);
    return gen::k3_rope_case(u(1, 9), nope, rope, u(0, 5000), arb_scale(100, 1e5f), use_nope, seed);
  }
  if (entry == "k3_mla_sdpa_gate_f32" || entry == "k3_sdpa_split_path")
    return gen::k3_sdpa_case(u(1, 5), u(1, 40), u(1, 40), u(0, 20), *rc::gen::arbitrary<bool>(), seed,
                             entry == "k3_sdpa_split_path");
  if (entry == "k3_mla_sdpa_split_f32") {
    const std::uint32_t seq_len = u(0, 40), keys_per_chunk = u(1, 9);
    const std::uint32_t needed = (std::max(seq_len, 1u) + keys_per_chunk - 1) / keys_per_chunk;
    return gen::k3_split_case(u(1, 5), u(1, 40), u(1, 40), seq_len, keys_per_chunk, ((needed + 3) / 4 + u(0, 1)) * 4,
                              seed);
  }
  if (entry == "k3_mla_sdpa_combine_f32")
    return gen::k3_combine_case(u(1, 5), u(1, 40), 4 * u(1, 5), *rc::gen::arbitrary<bool>(), seed);
  fail(Errc::not_found, "no generator for kernel {}.{}", module, entry);
}

}  // namespace metrale::props
