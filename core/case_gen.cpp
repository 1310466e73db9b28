#include "metrale/case_gen.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <sstream>

#include <fmt/format.h>

#include "metrale/error.hpp"
#include "metrale/formats.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/reference.hpp"
#include "validate.hpp"

namespace metrale::gen {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr Bf16 kNanBf16{0x7FC0};

using Shape = std::vector<std::int64_t>;

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

template <class T>
Tensor tensor(Shape shape, const std::vector<T>& v) {
  return Tensor::from<T>(std::move(shape), std::span<const T>(v));
}

// Input `name` of a case, or the input it aliases.
const Tensor& pool_input(const KernelCase& c, const std::string& name) {
  const auto alias = c.aliases.find(name);
  return c.inputs.at(alias != c.aliases.end() ? alias->second : name);
}

KernelCase make_case(std::string name, const char* entry) {
  KernelCase c;
  c.name = std::move(name);
  c.module = "mla_absorbed";
  c.entry = entry;
  return c;
}

// The largest |value| of the rows of an NVFP4 pool (blocks of block_size rows of `width` values:
// codes at i·width/2, scales at data_section + i·width/16; the padding between holds no values).
double nvfp4_pool_max(std::span<const std::uint8_t> pool, std::uint64_t block_size, std::uint64_t width,
                      std::uint64_t block_stride, std::uint64_t data_section) {
  double big = 0;
  for (std::uint64_t base = 0; base + block_stride <= pool.size(); base += block_stride)
    for (std::uint64_t i = 0; i < block_size; ++i)
      for (std::uint64_t e = 0; e < width; ++e) {
        const std::uint8_t byte = pool[base + i * width / 2 + e / 2];
        const double scale = e4m3_decode(pool[base + data_section + i * width / 16 + e / 16]);
        big = std::max(big, std::fabs(e2m1_decode(e % 2 == 0 ? byte & 0xF : byte >> 4) * scale));
      }
  return big;
}

// E4M3 codes below 0x70 in magnitude (|x| < 2): random data that never hits NaN.
std::vector<std::uint8_t> random_codes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::uint8_t> b(n);
  for (auto& c : b) c = static_cast<std::uint8_t>((rng() % 0x70) | (rng() % 2 ? 0x80 : 0));
  return b;
}

}  // namespace

std::string PagedSpec::vars() const {
  std::ostringstream s;
  s << "format=" << to_string(format) << " num_seqs=" << num_seqs << " num_q_heads=" << num_q_heads
    << " num_kv_heads=" << num_kv_heads << " q_head_dim=" << q_head_dim << " kv_cache_dim=" << kv_cache_dim
    << " block_size=" << block_size << " max_blocks_per_seq=" << max_blocks_per_seq << " num_blocks=" << num_blocks
    << " fill=" << fill << " inv_sqrt_d=" << inv_sqrt_d << " q_range=" << q_range << " k_scale=" << k_scale
    << " v_scale=" << v_scale << " cache_stride=" << cache_stride << " sliding_window=" << sliding_window
    << " sinks=" << sinks << " comp_pool=" << comp_pool << " comp_block_count=" << comp_block_count
    << " zero_groups_every=" << zero_groups_every << " seed=" << seed;
  if (key_ramp != 0.0f) s << " key_ramp=" << key_ramp;  // (older case names stay as they were)
  if (zero_k) s << " zero_k=1";
  if (latent) s << " latent=1";
  s << " seq_lens=[";
  for (std::size_t i = 0; i < seq_lens.size(); ++i) s << (i ? " " : "") << seq_lens[i];
  s << "]";
  return s.str();
}

namespace {
// What the generator needs of a spec to build its pools, tables and reference (the launch's own
// rules are the launcher's to check): `invalid_argument` naming the field. Negative or too long
// seq_lens, garbage fills and the like stay allowed: they are the cases.
void require_buildable(const PagedSpec& p) {
  const detail::Validator v{"paged_decode_case"};
  v.check(p.num_seqs != 0 && p.num_q_heads != 0 && p.q_head_dim != 0 && p.kv_cache_dim != 0,
          "num_seqs {}, num_q_heads {}, q_head_dim {} and kv_cache_dim {} must be positive", p.num_seqs, p.num_q_heads,
          p.q_head_dim, p.kv_cache_dim);
  v.check(p.block_size != 0 && p.num_blocks != 0 && p.max_blocks_per_seq != 0,
          "block_size {}, num_blocks {} and max_blocks_per_seq {} must be positive", p.block_size, p.num_blocks,
          p.max_blocks_per_seq);
  v.check(p.num_kv_heads != 0 && p.num_q_heads % p.num_kv_heads == 0,
          "num_kv_heads {} must be positive and divide num_q_heads {}", p.num_kv_heads, p.num_q_heads);
  v.check(p.seq_lens.size() == p.num_seqs, "{} seq_lens for num_seqs {} (one a sequence)", p.seq_lens.size(),
          p.num_seqs);
  const std::uint64_t width = std::uint64_t{p.num_kv_heads} * p.kv_cache_dim;
  v.check(p.format != KvFormat::fp8 || p.cache_stride == 0 || p.cache_stride >= width,
          "cache_stride {} is below the row width {}", p.cache_stride, width);
  v.check(p.format != KvFormat::nvfp4 || width % 16 == 0,
          "an nvfp4 row width {} (num_kv_heads x kv_cache_dim) that is not a multiple of 16", width);
}
}  // namespace

KernelCase paged_decode_case(const PagedSpec& p) {
  require_buildable(p);
  std::mt19937_64 rng(p.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const std::uint64_t width = std::uint64_t{p.num_kv_heads} * p.kv_cache_dim;
  const std::uint64_t stride = p.cache_stride != 0 ? p.cache_stride : width;
  const auto q = random_bf16(std::size_t{p.num_seqs} * p.num_q_heads * p.q_head_dim, rng, -p.q_range, p.q_range);

  std::vector<std::uint8_t> k_pool, v_pool;
  std::uint64_t data_section = 0, block_stride = 0;
  if (p.format == KvFormat::fp8) {
    k_pool = random_codes(std::size_t{p.num_blocks} * p.block_size * stride, rng);
    v_pool = random_codes(k_pool.size(), rng);
  } else {
    // Slack beyond the minimum (≥ is allowed), 16-byte aligned as a real pool is.
    data_section = (std::uint64_t{p.block_size} * width / 2 + 16 + 15) / 16 * 16;
    block_stride = (data_section + std::uint64_t{p.block_size} * width / 16 + 32 + 15) / 16 * 16;
    auto pool = [&] {
      std::vector<std::uint8_t> b(std::size_t{p.num_blocks} * block_stride);
      for (auto& c : b) c = static_cast<std::uint8_t>(rng());
      for (std::uint64_t blk = 0; blk < p.num_blocks; ++blk)
        for (std::uint64_t i = 0; i < p.block_size; ++i)
          for (std::uint64_t g = 0; g < width / 16; ++g) {
            std::uint8_t& scale = b[blk * block_stride + data_section + i * width / 16 + g];
            scale = static_cast<std::uint8_t>(0x20 + rng() % 0x30);  // finite positive scales
            const std::uint64_t n = (blk * p.block_size + i) * (width / 16) + g;
            if (p.zero_groups_every != 0 && n % p.zero_groups_every == 0) {
              scale = 0;
              std::fill_n(b.begin() + static_cast<std::ptrdiff_t>(blk * block_stride + i * width / 2 + g * 8), 8, 0);
            }
          }
      return b;
    };
    k_pool = pool();
    v_pool = pool();
  }
  // Each sequence's blocks come from a shuffled pool: permuted, sparse physical blocks.
  std::vector<std::int32_t> phys(p.num_blocks);
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng);
  std::vector<std::int32_t> tables(std::size_t{p.num_seqs} * p.max_blocks_per_seq, p.fill);
  // Sequence s's tokens in the cache: its length clamped to the table.
  const auto cached_len = [&](std::uint32_t s) {
    return std::clamp<std::int64_t>(p.seq_lens.at(s), 0, std::int64_t{p.max_blocks_per_seq} * p.block_size);
  };
  std::size_t next = 0;
  for (std::uint32_t s = 0; s < p.num_seqs; ++s) {
    const std::int64_t len = cached_len(s);
    for (std::int64_t b = 0; b < (len + p.block_size - 1) / p.block_size; ++b)
      tables[s * p.max_blocks_per_seq + b] = phys[next++ % p.num_blocks];
  }
  std::vector<float> sinks;
  if (p.sinks)
    for (std::uint32_t h = 0; h < p.num_q_heads; ++h) sinks.push_back(uni(rng) * 4.0f);
  std::vector<std::uint8_t> comp;
  if (p.comp_pool) comp = random_codes(std::size_t{p.num_seqs} * std::max(p.comp_block_count, 1u) * 2 * stride, rng);
  if (p.key_ramp != 0.0f) {  // dim 0 of the K row at position t about key_ramp·t (PagedSpec)
    if (!std::isfinite(p.key_ramp))
      fail(Errc::invalid_argument, "paged_decode_case: key_ramp {} is not finite", p.key_ramp);
    const bool fp8 = p.format == KvFormat::fp8;
    if (fp8) {
      const auto below_one = [](std::uint8_t& c) { c = static_cast<std::uint8_t>((c & 0x80) | ((c & 0x7F) % 0x38)); };
      std::for_each(k_pool.begin(), k_pool.end(), below_one);
      for (std::size_t i = 0; i < comp.size(); i += 2 * stride)  // a compressed entry's K row
        std::for_each(comp.begin() + static_cast<std::ptrdiff_t>(i),
                      comp.begin() + static_cast<std::ptrdiff_t>(i + stride), below_one);
    }
    for (std::uint32_t s = 0; s < p.num_seqs; ++s) {
      for (std::int64_t t = 0, len = cached_len(s); t < len; ++t) {
        const auto blk = static_cast<std::uint64_t>(
            tables[std::size_t{s} * p.max_blocks_per_seq + static_cast<std::size_t>(t / p.block_size)]);
        const std::uint64_t slot = static_cast<std::uint64_t>(t) % p.block_size;
        const float ramp = p.key_ramp * static_cast<float>(t);
        if (fp8) {
          k_pool[(blk * p.block_size + slot) * stride] = e4m3_encode(ramp);
          continue;
        }
        const auto data = static_cast<std::ptrdiff_t>(blk * block_stride + slot * width / 2);
        std::fill_n(k_pool.begin() + data, 8, std::uint8_t{0});  // group 0: dim 0 alone, E2M1 6
        k_pool[static_cast<std::size_t>(data)] = 0x07;
        k_pool[blk * block_stride + data_section + slot * width / 16] = e4m3_encode(ramp / 6.0f);
      }
    }
  }
  if (p.zero_k) {
    std::fill(k_pool.begin(), k_pool.end(), std::uint8_t{0});
    for (std::size_t i = 0; i < comp.size(); i += 2 * stride)  // a compressed entry's K row
      std::fill_n(comp.begin() + static_cast<std::ptrdiff_t>(i), stride, std::uint8_t{0});
  }
  if (p.latent) v_pool = k_pool;
  // The float64 reference.
  const auto qf = floats(q);
  ref::PagedAttentionProblem r;
  r.format = p.format, r.q = qf, r.k_pool = k_pool, r.v_pool = v_pool, r.block_tables = tables;
  r.seq_lens = p.seq_lens, r.num_seqs = p.num_seqs, r.max_blocks_per_seq = p.max_blocks_per_seq;
  r.num_q_heads = p.num_q_heads, r.num_kv_heads = p.num_kv_heads, r.q_head_dim = p.q_head_dim;
  r.kv_cache_dim = p.kv_cache_dim, r.block_size = p.block_size, r.inv_sqrt_d = p.inv_sqrt_d;
  r.k_scale = p.k_scale, r.v_scale = p.v_scale, r.cache_stride = stride, r.sliding_window = p.sliding_window;
  r.sinks = sinks;
  if (p.comp_pool) r.comp_pool = comp;
  r.comp_block_count = p.comp_pool ? p.comp_block_count : 0;
  r.block_stride_bytes = block_stride, r.data_section_bytes = data_section;
  const auto o_ref = ref::paged_attention(r);

  const bool fp8 = p.format == KvFormat::fp8;
  KernelCase c = make_case(std::string(fp8 ? "paged_decode_fp8 " : "paged_decode_nvfp4 ") + p.vars(),
                           fp8 ? "mla_paged_decode_fp8" : "mla_paged_decode_nvfp4");
  const Shape o_shape{p.num_seqs, p.num_q_heads, p.kv_cache_dim};
  c.inputs["q"] = tensor<Bf16>({p.num_seqs, p.num_q_heads, p.q_head_dim}, q);
  c.inputs["k_cache"] = tensor<std::uint8_t>({static_cast<std::int64_t>(k_pool.size())}, k_pool);
  if (p.latent) {
    c.aliases["v_cache"] = "k_cache";
  } else {
    c.inputs["v_cache"] = tensor<std::uint8_t>({static_cast<std::int64_t>(v_pool.size())}, v_pool);
  }
  c.inputs["o"] = tensor<Bf16>(o_shape, std::vector<Bf16>(o_ref.size(), kNanBf16));
  c.inputs["block_tables"] = tensor<std::int32_t>({p.num_seqs, p.max_blocks_per_seq}, tables);
  c.inputs["seq_lens"] = tensor<std::int32_t>({p.num_seqs}, p.seq_lens);
  if (!sinks.empty()) c.inputs["sinks"] = tensor<float>({p.num_q_heads}, sinks);
  if (!comp.empty()) c.inputs["comp_pool"] = tensor<std::uint8_t>({static_cast<std::int64_t>(comp.size())}, comp);
  c.expected["o"] = tensor<double>(o_shape, o_ref);
  double vmax = 0, kmax = 0;  // the largest |V| and |K| the pools hold
  if (!fp8) {
    vmax = nvfp4_pool_max(v_pool, p.block_size, width, block_stride, data_section);
    kmax = nvfp4_pool_max(k_pool, p.block_size, width, block_stride, data_section);
  } else {
    for (std::uint8_t b : v_pool) vmax = std::max(vmax, std::fabs(double{e4m3_decode(b)}) * p.v_scale);
    for (std::uint8_t b : comp) vmax = std::max(vmax, std::fabs(double{e4m3_decode(b)}) * p.v_scale);
    for (std::uint8_t b : k_pool) kmax = std::max(kmax, std::fabs(double{e4m3_decode(b)}) * p.k_scale);
    for (std::uint8_t b : comp) kmax = std::max(kmax, std::fabs(double{e4m3_decode(b)}) * p.k_scale);
  }
  // FP32 logits carry an error δ that grows with their size (4·√d ulps of the largest possible
  // |logit|, Σ|q|·max|k|·inv_sqrt_d); the softmax passes it on as up to 2δ·max|V| in o.
  double q_l1 = 0;
  for (std::size_t row = 0; row < std::size_t{p.num_seqs} * p.num_q_heads; ++row) {
    double sum = 0;
    for (std::uint32_t d = 0; d < p.q_head_dim; ++d) sum += std::fabs(qf[row * p.q_head_dim + d]);
    q_l1 = std::max(q_l1, sum);
  }
  const double delta =
      4.0 * std::sqrt(static_cast<double>(p.q_head_dim)) * 0x1p-24 * q_l1 * kmax * std::fabs(p.inv_sqrt_d);
  c.tolerance["o"] = {(1e-5 + 2.0 * delta) * vmax, 0x1p-8, 0};
  // Between backends the same δ: the kernel's logits are fused multiply-adds, the port's separate
  // roundings (a 2-ulp BF16 difference at -1.5e-4 was seen with logits near 300 on the H200).
  c.backend_tolerance["o"] = {2.0 * delta * vmax, 0, 1};
  auto u32 = [&](const char* n, std::uint32_t v) { c.scalars[n] = KernelArg::u32(v); };
  u32("max_blocks_per_seq", p.max_blocks_per_seq), u32("num_q_heads", p.num_q_heads);
  u32("num_kv_heads", p.num_kv_heads), u32("q_head_dim", p.q_head_dim), u32("kv_cache_dim", p.kv_cache_dim);
  u32("block_size", p.block_size), u32("num_seqs", p.num_seqs);
  c.scalars["inv_sqrt_d"] = KernelArg::f32(p.inv_sqrt_d);
  if (fp8) {
    c.scalars["k_scale"] = KernelArg::f32(p.k_scale);
    c.scalars["v_scale"] = KernelArg::f32(p.v_scale);
    c.scalars["cache_stride"] = KernelArg::u64(stride);
    u32("sliding_window", p.sliding_window), u32("comp_block_count", p.comp_block_count);
  } else {
    c.scalars["block_stride_bytes"] = KernelArg::u64(block_stride);
    c.scalars["data_section_bytes"] = KernelArg::u64(data_section);
  }
  return c;
}

KernelCase split_path_case(const PagedSpec& spec) {
  KernelCase c = paged_decode_case(spec);
  c.module = "mla_fast";
  c.entry = spec.format == KvFormat::fp8 ? "paged_decode_fp8_split_path" : "paged_decode_nvfp4_split_path";
  c.name = "split " + c.name;
  double vmax = 0;  // the largest |V|, as paged_decode_case's bound
  if (spec.format == KvFormat::nvfp4) {
    vmax = nvfp4_pool_max(pool_input(c, "v_cache").values<std::uint8_t>(), spec.block_size,
                          std::uint64_t{spec.num_kv_heads} * spec.kv_cache_dim,
                          c.scalars.at("block_stride_bytes").as_u64(), c.scalars.at("data_section_bytes").as_u64());
  } else {
    for (const char* pool : {"v_cache", "comp_pool"})
      if (c.inputs.count(pool) != 0 || c.aliases.count(pool) != 0)
        for (std::byte b : pool_input(c, pool).data)
          vmax = std::max(vmax, std::fabs(double{e4m3_decode(static_cast<std::uint8_t>(b))}) * spec.v_scale);
  }
  c.tolerance["o"].abs += 0x1p-9 * vmax;
  c.backend_tolerance["o"] = {0x1p-9 * vmax, 0, 1};
  return c;
}

KernelCase split_kernel_case(const PagedSpec& spec, std::uint32_t tiles_per_split, SplitEntry which) {
  const KernelCase base = paged_decode_case(spec);  // the inputs, and the launch's scalars
  const bool fp8 = spec.format == KvFormat::fp8;
  const auto bytes = [&](const char* n) { return pool_input(base, n).values<std::uint8_t>(); };
  const auto qf = floats(base.inputs.at("q").values<Bf16>());
  const auto k_pool = bytes("k_cache"), v_pool = bytes("v_cache");
  const auto tables = base.inputs.at("block_tables").values<std::int32_t>();
  const auto comp = base.inputs.count("comp_pool") ? bytes("comp_pool") : std::vector<std::uint8_t>{};
  ref::PagedAttentionProblem r;
  r.format = spec.format, r.q = qf, r.k_pool = k_pool, r.v_pool = v_pool, r.block_tables = tables;
  r.seq_lens = spec.seq_lens, r.num_seqs = spec.num_seqs, r.max_blocks_per_seq = spec.max_blocks_per_seq;
  r.num_q_heads = spec.num_q_heads, r.q_head_dim = spec.q_head_dim, r.kv_cache_dim = spec.kv_cache_dim;
  r.block_size = spec.block_size, r.sliding_window = spec.sliding_window, r.comp_pool = comp;
  r.comp_block_count = spec.comp_pool ? spec.comp_block_count : 0;
  if (fp8) {
    r.cache_stride = base.scalars.at("cache_stride").as_u64();
  } else {
    r.block_stride_bytes = base.scalars.at("block_stride_bytes").as_u64();
    r.data_section_bytes = base.scalars.at("data_section_bytes").as_u64();
  }
  // As the dispatcher: the FP8 K scale folded into the logit scale (in FP32), V's left out.
  const float logit_scale = fp8 ? spec.inv_sqrt_d * spec.k_scale : spec.inv_sqrt_d;
  const bool rs = which == SplitEntry::wgmma16_rs, latent = which == SplitEntry::wgmma_latent;
  const bool sixteen = which == SplitEntry::split16, wgmma16 = which == SplitEntry::wgmma16 || rs;
  const bool wgmma = which == SplitEntry::wgmma || wgmma16 || latent;
  if (tiles_per_split == 0 || tiles_per_split > (1u << 24))
    fail(Errc::invalid_argument, "split_kernel_case: tiles_per_split {} is not 1 to 2^24", tiles_per_split);
  if (latent && (!spec.latent || r.comp_block_count != 0))
    fail(Errc::invalid_argument,
         "split_kernel_case: mla_paged_decode_wgmma_latent_{} takes one latent pool without compressed entries "
         "(spec: latent {}, {} compressed)",
         to_string(spec.format), spec.latent, r.comp_block_count);
  const std::uint32_t keys_per_split = (wgmma ? 64 : 32) * tiles_per_split;
  const std::uint64_t max_keys = std::uint64_t{spec.max_blocks_per_seq} * spec.block_size + r.comp_block_count;
  const auto num_splits = static_cast<std::uint32_t>((max_keys + keys_per_split - 1) / keys_per_split + 1);  // a spare
  const std::uint32_t rows =
      wgmma16 || sixteen ? 16 : wgmma ? 64 : 16 * std::min(4u, (spec.num_q_heads + 15) / 16);
  const ref::SplitPartials want = ref::split_partials(r, logit_scale, keys_per_split, num_splits);

  const std::string entry = std::string(latent    ? "mla_paged_decode_wgmma_latent_"
                                        : rs      ? "mla_paged_decode_wgmma16_rs_"
                                        : wgmma16 ? "mla_paged_decode_wgmma16_"
                                        : wgmma   ? "mla_paged_decode_wgmma_"
                                        : sixteen ? "mla_paged_decode_split16_"
                                                  : "mla_paged_decode_split_") +
                            std::string(to_string(spec.format));
  KernelCase c;
  c.name = fmt::format("{} keys_per_split={} {}", entry, keys_per_split, spec.vars());
  c.module = wgmma ? "mla_wgmma" : "mla_fast";
  c.entry = entry;
  for (const char* n : {"q", "k_cache", "v_cache", "block_tables", "seq_lens", "comp_pool"})
    if (base.inputs.count(n) != 0 && (fp8 || std::string_view(n) != "comp_pool")) c.inputs[n] = base.inputs.at(n);
  c.aliases = base.aliases;
  const std::int64_t slots = std::int64_t{spec.num_seqs} * spec.num_q_heads * num_splits;
  c.inputs["o_partial"] = tensor<float>({slots, spec.kv_cache_dim}, std::vector<float>(want.o.size(), NAN));
  c.inputs["ml_partial"] = tensor<float>({slots, 2}, std::vector<float>(want.ml.size(), NAN));
  c.expected["o_partial"] = tensor<double>({slots, spec.kv_cache_dim}, want.o);
  c.expected["ml_partial"] = tensor<double>({slots, 2}, want.ml);
  // FP32 logits carry δ = 4·√q_head_dim ulps of Σ|q·k|·|scale| (paged_decode_case's model) plus
  // the scaling's rounding; the exponentials 2δ relative; P is rounded to FP16 for P·V (2^-11
  // relative, taken as 2^-10) and summed in FP32. Against another backend the same: its
  // exponentials and FP32 order differ within δ, and a P element may round the other way.
  const double delta =
      4.0 * std::sqrt(static_cast<double>(spec.q_head_dim)) * 0x1p-24 * want.max_abs_qk + 0x1p-23 * want.max_abs_logit;
  const double sum = keys_per_split * 0x1p-23;
  c.tolerance["o_partial"] = {(0x1p-10 + 3 * delta + sum) * want.max_weighted_abs_v + 1e-30, 0, 0};
  c.tolerance["ml_partial"] = {1.01 * delta + 1e-30, 3 * delta + sum, 0};
  c.backend_tolerance = c.tolerance;
  for (const auto& [name, value] : base.scalars)
    if (name != "inv_sqrt_d" && name != "k_scale" && name != "v_scale" && name != "num_kv_heads")
      c.scalars[name] = value;
  c.scalars["logit_scale"] = KernelArg::f32(logit_scale);
  c.scalars["keys_per_split"] = KernelArg::u32(keys_per_split);
  c.scalars["num_splits"] = KernelArg::u32(num_splits);
  c.scalars["rows_per_block"] = KernelArg::u32(rows);
  return c;
}

KernelCase fused_decode_case(const PagedSpec& spec, std::uint32_t tiles_per_split, bool heads_in_m) {
  const bool wide = spec.num_q_heads > 32;  // the 64-head entries (above 32 heads)
  const bool fp8 = spec.format == KvFormat::fp8;
  const char* const entry =
      heads_in_m ? (fp8 ? "mla_paged_decode_wgmma_latent_combine_fp8" : "mla_paged_decode_wgmma_latent_combine_nvfp4")
      : wide     ? "mla_paged_decode_wgmma_combine_fp8"
                 : "mla_paged_decode_wgmma16_rs_combine_fp8";
  if ((!fp8 && !heads_in_m) || spec.q_head_dim != 576 || spec.kv_cache_dim != 576)
    fail(Errc::invalid_argument, "fused_decode_case: {} takes {} rows of 576 (spec: {}, {} and {})", entry,
         heads_in_m ? "FP8 or NVFP4" : "FP8", to_string(spec.format), spec.q_head_dim, spec.kv_cache_dim);
  if (heads_in_m && (!wide || !spec.latent || (spec.comp_pool && spec.comp_block_count != 0)))
    fail(Errc::invalid_argument,
         "fused_decode_case: {} takes more than 32 heads over one latent pool without compressed entries (spec: {} "
         "heads, latent {}, {} compressed)",
         entry, spec.num_q_heads, spec.latent, spec.comp_pool ? spec.comp_block_count : 0);
  if (tiles_per_split == 0 || tiles_per_split > (1u << 24))
    fail(Errc::invalid_argument, "fused_decode_case: tiles_per_split {} is not 1 to 2^24", tiles_per_split);
  KernelCase c = split_path_case(spec);  // the inputs, o and its tolerance
  const std::uint32_t keys_per_split = 64 * tiles_per_split;
  const std::uint64_t max_keys =
      std::uint64_t{spec.max_blocks_per_seq} * spec.block_size + (spec.comp_pool ? spec.comp_block_count : 0);
  const std::uint64_t num_splits = (max_keys + keys_per_split - 1) / keys_per_split + 1;  // a spare
  if (num_splits > 8)
    fail(Errc::invalid_argument, "fused_decode_case: {} chunks of {} keys, more than a cluster's 8", num_splits,
         keys_per_split);
  c.name = fmt::format("{} keys_per_split={} {}", entry, keys_per_split, spec.vars());
  c.module = "mla_wgmma";
  c.entry = entry;
  // As the dispatcher: FP8's K scale folded into the logit scale (in FP32), V's the combine's;
  // NVFP4's values carry their scales.
  c.scalars["logit_scale"] = KernelArg::f32(fp8 ? spec.inv_sqrt_d * spec.k_scale : spec.inv_sqrt_d);
  for (const char* n : {"inv_sqrt_d", "k_scale", "num_kv_heads"}) c.scalars.erase(n);
  if (!fp8) c.scalars.erase("v_scale");
  c.scalars["keys_per_split"] = KernelArg::u32(keys_per_split);
  c.scalars["num_splits"] = KernelArg::u32(static_cast<std::uint32_t>(num_splits));
  c.scalars["rows_per_block"] = KernelArg::u32(wide ? 64 : 16);
  return c;
}

namespace {

// A split decode's partial rows as a combine reads them: `rows` of O (dim values in ±20) and
// (m, l), a quarter of them chunks without keys (m = −∞, l = 0, O NaN: never counted).
void random_partials(std::size_t rows, std::size_t dim, std::mt19937_64& rng, std::vector<float>& o,
                     std::vector<float>& ml) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  o.resize(rows * dim);
  ml.resize(rows * 2);
  for (auto& x : o) x = uni(rng) * 20.0f;
  for (std::size_t r = 0; r < rows; ++r) {
    const bool empty = rng() % 4 == 0;
    ml[2 * r] = empty ? -std::numeric_limits<float>::infinity() : uni(rng) * 4.0f;
    ml[2 * r + 1] = empty ? 0.0f : 1.0f + std::fabs(uni(rng)) * 8.0f;  // a chunk's l ≥ 1 (its max term)
    if (empty) std::fill_n(o.begin() + static_cast<std::ptrdiff_t>(r * dim), dim, std::numeric_limits<float>::quiet_NaN());
  }
}

}  // namespace

KernelCase combine_case(std::uint32_t num_seqs, std::uint32_t heads, std::uint32_t dim, std::uint32_t num_splits,
                        bool sinks, std::uint64_t seed) {
  // (an empty tensor would reach the launcher as "o_partial is null")
  detail::Validator{"combine_case"}.positive(
      {{"num_seqs", num_seqs}, {"heads", heads}, {"dim", dim}, {"num_splits", num_splits}});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const std::size_t slots = std::size_t{num_seqs} * heads * num_splits;
  std::vector<float> o, ml, sink;
  random_partials(slots, dim, rng, o, ml);
  if (sinks)
    for (std::uint32_t h = 0; h < heads; ++h) sink.push_back(uni(rng) * 12.0f);  // from negligible to dominant
  const float v_scale = 0.5f + std::fabs(uni(rng));
  const ref::CombineResult want = ref::combine_partials(o, ml, sink, num_seqs, heads, num_splits, dim, v_scale);
  KernelCase c = make_case(fmt::format("combine num_seqs={} heads={} dim={} num_splits={} sinks={} seed={}", num_seqs,
                                       heads, dim, num_splits, sinks, seed),
                           "mla_paged_decode_combine");
  c.module = "mla_fast";
  c.inputs["o_partial"] = tensor<float>({static_cast<std::int64_t>(slots), dim}, o);
  c.inputs["ml_partial"] = tensor<float>({static_cast<std::int64_t>(slots), 2}, ml);
  if (sinks) c.inputs["sinks"] = tensor<float>({heads}, sink);
  c.inputs["o"] = tensor<Bf16>({num_seqs, heads, dim}, std::vector<Bf16>(want.o.size(), kNanBf16));
  c.expected["o"] = tensor<double>({num_seqs, heads, dim}, want.o);
  // BF16 output (2^-8 relative) and the FP32 sums, relative to Σ|weight·O|/denominator.
  c.tolerance["o"] = {num_splits * 0x1p-22 * want.max_abs_terms + 1e-30, 0x1p-8, 0};
  c.scalars = {{"num_q_heads", KernelArg::u32(heads)},
               {"kv_cache_dim", KernelArg::u32(dim)},
               {"num_splits", KernelArg::u32(num_splits)},
               {"v_scale", KernelArg::f32(v_scale)},
               {"num_seqs", KernelArg::u32(num_seqs)}};
  return c;
}

KernelCase gemv_case(std::uint32_t n_out, std::uint32_t k, std::uint32_t heads, std::uint32_t in_pad,
                     std::uint32_t out_pad, std::uint64_t seed) {
  detail::Validator{"gemv_case"}.positive({{"n_out", n_out}, {"k", k}, {"heads", heads}});
  std::mt19937_64 rng(seed);
  const std::uint32_t is = k + in_pad, os = n_out + out_pad;
  const auto x = random_bf16(std::size_t{heads} * is, rng), w = random_bf16(std::size_t{heads} * n_out * k, rng);
  const auto xf = floats(x), wf = floats(w);
  const auto y = ref::batched_gemv(xf, wf, n_out, k, heads, is);
  std::vector<double> want(std::size_t{heads} * os, kNaN);  // the gap between heads stays unwritten
  double mag = 0;                                           // max Σ|w·x| bounds the FP32 accumulation error
  for (std::uint32_t h = 0; h < heads; ++h)
    for (std::uint32_t n = 0; n < n_out; ++n) {
      want[std::size_t{h} * os + n] = y[std::size_t{h} * n_out + n];
      double m = 0;
      for (std::uint32_t j = 0; j < k; ++j)
        m += std::fabs(double{wf[(std::size_t{h} * n_out + n) * k + j]} * xf[std::size_t{h} * is + j]);
      mag = std::max(mag, m);
    }
  KernelCase c =
      make_case(fmt::format("gemv n_out={} k={} heads={} input_stride={} output_stride={}", n_out, k, heads, is, os),
                "mla_batched_gemv");
  c.inputs["input"] = tensor<Bf16>({heads, is}, x);
  c.inputs["weight"] = tensor<Bf16>({heads, n_out, k}, w);
  c.inputs["output"] = tensor<Bf16>({heads, os}, std::vector<Bf16>(want.size(), kNanBf16));
  c.expected["output"] = tensor<double>({heads, os}, want);
  c.tolerance["output"] = {k * 0x1p-23 * mag, 0x1p-8, 0};
  c.scalars = {{"n_out", KernelArg::u32(n_out)},
               {"k", KernelArg::u32(k)},
               {"num_heads", KernelArg::u32(heads)},
               {"input_stride", KernelArg::u32(is)},
               {"output_stride", KernelArg::u32(os)}};
  return c;
}

KernelCase q_rope_scatter_case(std::uint32_t nq, std::uint32_t nope, std::uint32_t rope, std::uint32_t kv_lora,
                               std::uint32_t extra_hd, std::uint32_t extra_cd, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::uint32_t hd = nope + rope + extra_hd, cd = kv_lora + rope + extra_cd;
  const auto q_full = random_bf16(std::size_t{nq} * hd, rng);
  std::vector<Bf16> abs_want(std::size_t{nq} * cd, kNanBf16), rope_want(std::size_t{nq} * rope);
  for (std::size_t h = 0; h < nq; ++h)
    for (std::size_t i = 0; i < rope; ++i)
      abs_want[h * cd + kv_lora + i] = rope_want[h * rope + i] = q_full[h * hd + nope + i];
  KernelCase c = make_case(fmt::format("q_rope_scatter nq={} hd={} nope={} rope={} kv_lora={} mla_cache_dim={}", nq, hd,
                                       nope, rope, kv_lora, cd),
                           "mla_q_rope_scatter");
  c.inputs["q_full"] = tensor<Bf16>({nq, hd}, q_full);
  c.inputs["q_absorbed_buf"] = tensor<Bf16>({nq, cd}, std::vector<Bf16>(abs_want.size(), kNanBf16));
  c.inputs["q_rope_contiguous"] = tensor<Bf16>({nq, rope}, std::vector<Bf16>(rope_want.size(), kNanBf16));
  c.expected["q_absorbed_buf"] = tensor<Bf16>({nq, cd}, abs_want);
  c.expected["q_rope_contiguous"] = tensor<Bf16>({nq, rope}, rope_want);
  c.tolerance["q_absorbed_buf"] = c.tolerance["q_rope_contiguous"] = {};
  c.scalars = {{"nq", KernelArg::u32(nq)},           {"hd", KernelArg::u32(hd)},
               {"nope", KernelArg::u32(nope)},       {"rope", KernelArg::u32(rope)},
               {"kv_lora", KernelArg::u32(kv_lora)}, {"mla_cache_dim", KernelArg::u32(cd)}};
  return c;
}

KernelCase q_rope_writeback_case(std::uint32_t nq, std::uint32_t rope, std::uint32_t kv_lora, std::uint32_t extra_cd,
                                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::uint32_t cd = kv_lora + rope + extra_cd;
  const auto direct = random_bf16(std::size_t{nq} * rope, rng);
  const auto before = random_bf16(std::size_t{nq} * cd, rng);
  std::vector<Bf16> want = before;
  for (std::size_t h = 0; h < nq; ++h)
    for (std::size_t i = 0; i < rope; ++i) want[h * cd + kv_lora + i] = direct[h * rope + i];
  KernelCase c =
      make_case(fmt::format("q_rope_writeback nq={} rope={} kv_lora={} mla_cache_dim={}", nq, rope, kv_lora, cd),
                "mla_q_rope_writeback");
  c.inputs["q_rope_direct"] = tensor<Bf16>({nq, rope}, direct);
  c.inputs["q_absorbed_buf"] = tensor<Bf16>({nq, cd}, before);
  c.expected["q_absorbed_buf"] = tensor<Bf16>({nq, cd}, want);
  c.tolerance["q_absorbed_buf"] = {};
  c.scalars = {{"nq", KernelArg::u32(nq)},
               {"rope", KernelArg::u32(rope)},
               {"kv_lora", KernelArg::u32(kv_lora)},
               {"mla_cache_dim", KernelArg::u32(cd)}};
  return c;
}

KernelCase cache_assemble_case(std::uint32_t kv_lora, std::uint32_t rope, std::uint32_t cd, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto latent = random_bf16(kv_lora, rng), k_rope = random_bf16(std::max(rope, 1u), rng);
  std::vector<Bf16> k_want(cd), v_want(cd);
  for (std::uint32_t i = 0; i < cd; ++i) {
    k_want[i] = i < kv_lora ? latent[i] : i < kv_lora + rope ? k_rope[i - kv_lora] : Bf16{};
    v_want[i] = i < kv_lora ? latent[i] : Bf16{};
  }
  KernelCase c = make_case(fmt::format("cache_assemble kv_lora={} rope={} mla_cache_dim={}", kv_lora, rope, cd),
                           "mla_cache_assemble");
  c.inputs["kv_latent"] = tensor<Bf16>({kv_lora}, latent);
  c.inputs["k_rope"] = tensor<Bf16>({static_cast<std::int64_t>(k_rope.size())}, k_rope);
  c.inputs["k_cache"] = c.inputs["v_cache"] = tensor<Bf16>({cd}, std::vector<Bf16>(cd, kNanBf16));
  c.expected["k_cache"] = tensor<Bf16>({cd}, k_want);
  c.expected["v_cache"] = tensor<Bf16>({cd}, v_want);
  c.tolerance["k_cache"] = c.tolerance["v_cache"] = {};
  c.scalars = {
      {"kv_lora", KernelArg::u32(kv_lora)}, {"rope", KernelArg::u32(rope)}, {"mla_cache_dim", KernelArg::u32(cd)}};
  return c;
}

KernelCase rope_case(std::uint32_t rows, std::uint32_t rope, std::uint32_t pos, float theta, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto x = random_bf16(std::size_t{rows} * rope, rng);
  const auto xf = floats(x);
  std::vector<double> want(xf.begin(), xf.end());
  ref::rope_pairs(want, rope, pos, theta);
  KernelCase c =
      make_case(fmt::format("rope rows={} rope={} pos={} theta={}", rows, rope, pos, theta), "rope_pairs_bf16");
  c.inputs["x"] = tensor<Bf16>({rows, rope}, x);
  c.expected["x"] = tensor<double>({rows, rope}, want);
  // |a|,|b| ≤ 1: BF16 rounding, plus the FP32 angle (pos·2^-24 rad) and trig errors on a pair of norm ≤ 2.
  c.tolerance["x"] = {2.0 * (pos * 0x1p-23 + 0x1p-20), 0x1p-8, 0};
  // libm and CUDA's powf/sinf/cosf differ in their last bits, which the angle multiplies by pos.
  c.backend_tolerance["x"] = {2.0 * (4.0 * pos * 0x1p-24 + 0x1p-20), 0, 1};
  c.scalars = {{"rows", KernelArg::u32(rows)},
               {"rope", KernelArg::u32(rope)},
               {"pos", KernelArg::u32(pos)},
               {"theta", KernelArg::f32(theta)}};
  return c;
}

KernelCase cache_store_case(KvFormat format, std::uint32_t num_tokens, std::uint32_t row_width,
                            std::uint32_t block_size, std::uint32_t num_blocks, std::uint64_t pitch,
                            std::uint64_t seed) {
  const detail::Validator v{"cache_store_case"};
  v.check(block_size != 0 && num_blocks != 0 && row_width != 0,
          "block_size {}, num_blocks {} and row_width {} must be positive", block_size, num_blocks, row_width);
  const std::uint64_t slot_count = std::uint64_t{num_blocks} * block_size;
  v.check(num_tokens <= slot_count, "{} tokens for {} slots (num_blocks {} x block_size {})", num_tokens, slot_count,
          num_blocks, block_size);
  v.check(format != KvFormat::fp8 || pitch >= row_width, "pitch {} is below row_width {}", pitch, row_width);
  v.check(format != KvFormat::nvfp4 || row_width % 16 == 0, "an nvfp4 row_width {} that is not a multiple of 16",
          row_width);
  std::mt19937_64 rng(seed);
  auto k_src = random_bf16(std::size_t{num_tokens} * row_width, rng, -3, 3);
  const auto v_src = random_bf16(k_src.size(), rng, -3, 3);
  if (format == KvFormat::nvfp4 && row_width >= 32) std::fill_n(k_src.begin() + 16, 16, Bf16{});  // a zero group
  std::vector<std::int32_t> slots(std::size_t{num_blocks} * block_size);  // distinct slots, one skipped
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  if (num_tokens > 2) slots[1] = -1;
  const float k_scale = 0.37f, v_scale = 1.9f;  // not powers of two
  const std::uint64_t w = row_width;
  const std::uint64_t data_section = std::uint64_t{block_size} * w / 2 + 16;
  const std::uint64_t block_stride = data_section + std::uint64_t{block_size} * w / 16 + 16;
  const bool fp8 = format == KvFormat::fp8;
  const std::uint64_t pool =
      fp8 ? std::uint64_t{num_blocks} * block_size * pitch : std::uint64_t{num_blocks} * block_stride;
  const std::vector<std::uint8_t> poison(pool, 0xA5);
  std::vector<std::uint8_t> want_k = poison, want_v = poison;
  for (std::uint32_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0) continue;
    const auto slot = static_cast<std::uint64_t>(slots[t]);
    if (fp8) {
      for (std::uint64_t e = 0; e < w; ++e) {
        want_k[slot * pitch + e] = e4m3_encode(k_src[t * w + e].to_float() / k_scale);
        want_v[slot * pitch + e] = e4m3_encode(v_src[t * w + e].to_float() / v_scale);
      }
      continue;
    }
    const std::uint64_t base = slot / block_size * block_stride, i = slot % block_size;
    for (std::uint64_t g = 0; g < w / 16; ++g)
      for (auto* dst : {&want_k, &want_v}) {
        const auto& src = dst == &want_k ? k_src : v_src;
        std::array<float, 16> x{};
        for (std::size_t e = 0; e < 16; ++e) x[e] = src[t * w + g * 16 + e].to_float();
        std::array<std::uint8_t, 8> packed{};
        std::uint8_t scale = 0;
        nvfp4_encode_group(x, packed, scale);
        std::copy(packed.begin(), packed.end(), dst->begin() + static_cast<std::ptrdiff_t>(base + i * w / 2 + g * 8));
        (*dst)[base + data_section + i * w / 16 + g] = scale;
      }
  }
  KernelCase c = make_case(fmt::format("cache_store_{} num_tokens={} row_width={} block_size={} num_blocks={}",
                                       to_string(format), num_tokens, row_width, block_size, num_blocks),
                           fp8 ? "mla_paged_cache_store_fp8" : "mla_paged_cache_store_nvfp4");
  const Shape pool_shape{static_cast<std::int64_t>(pool)};
  c.inputs["k_src"] = tensor<Bf16>({num_tokens, row_width}, k_src);
  c.inputs["v_src"] = tensor<Bf16>({num_tokens, row_width}, v_src);
  c.inputs["k_cache"] = c.inputs["v_cache"] = tensor<std::uint8_t>(pool_shape, poison);
  c.inputs["slot_mapping"] = tensor<std::int32_t>({num_tokens}, slots);
  c.expected["k_cache"] = tensor<std::uint8_t>(pool_shape, want_k);
  c.expected["v_cache"] = tensor<std::uint8_t>(pool_shape, want_v);
  c.tolerance["k_cache"] = c.tolerance["v_cache"] = {};
  c.scalars = {{"num_tokens", KernelArg::u32(num_tokens)},
               {"row_width", KernelArg::u32(row_width)},
               {"block_size", KernelArg::u32(block_size)}};
  if (fp8) {
    c.scalars["cache_stride"] = KernelArg::u64(pitch);
    c.scalars["k_scale"] = KernelArg::f32(k_scale);
    c.scalars["v_scale"] = KernelArg::f32(v_scale);
  } else {
    c.scalars["block_stride_bytes"] = KernelArg::u64(block_stride);
    c.scalars["data_section_bytes"] = KernelArg::u64(data_section);
  }
  return c;
}

namespace {

constexpr double kU = 0x1p-24;  // FP32 unit roundoff

// Head h's FP32 logit error δ (dq/32 + 8 rounded additions per lane sum and butterfly, over
// Σ|q·k|/√dq) and its largest |V|.
struct K3SdpaTerms {
  double delta = 0, vmax = 0;
};

K3SdpaTerms k3_sdpa_terms(const ref::K3SdpaProblem& p, std::size_t h) {
  double qk = 0, vmax = 0;
  for (std::size_t j = 0; j < p.seq_len; ++j) {
    double s = 0;
    for (std::size_t d = 0; d < p.dq; ++d)
      s += std::fabs(double{p.q[h * p.dq + d]} * p.k[(j * p.heads + h) * p.dq + d]);
    qk = std::max(qk, s);
    for (std::size_t d = 0; d < p.dv; ++d) vmax = std::max(vmax, std::fabs(double{p.v[(j * p.heads + h) * p.dv + d]}));
  }
  return {qk / std::sqrt(static_cast<double>(p.dq)) * (p.dq / 32.0 + 8) * 2 * kU, vmax};
}

}  // namespace

double k3_sdpa_bound(const ref::K3SdpaProblem& p, std::size_t h) {
  const auto t = k3_sdpa_terms(p, h);
  return t.vmax * (4 * t.delta + (4.0 * p.seq_len + 32) * kU) + 1e-30;
}

double k3_sdpa_backend_bound(const ref::K3SdpaProblem& p, std::size_t h) {
  const auto t = k3_sdpa_terms(p, h);
  return t.vmax * (2 * t.delta + 16 * kU) + 1e-30;
}

namespace {

// n values uniform on [-1, 1) in steps of 2^-23, two from each 64-bit draw (the K3 cases hold tens
// of millions: std::uniform_real_distribution took half the conformance sweep's generation time).
std::vector<float> random_f32(std::size_t n, std::mt19937_64& rng) {
  std::vector<float> v(n);
  auto from = [](std::uint64_t bits24) {
    return static_cast<float>(static_cast<std::int64_t>(bits24) - (1 << 23)) * 0x1p-23f;
  };
  for (std::size_t i = 0; i < n; i += 2) {
    const std::uint64_t r = rng();
    v[i] = from(r >> 40);
    if (i + 1 < n) v[i + 1] = from((r >> 8) & 0xFFFFFF);
  }
  return v;
}

}  // namespace

KernelCase k3_rope_case(std::uint32_t heads, std::uint32_t nope, std::uint32_t rope, std::uint32_t pos, float theta,
                        bool use_nope, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::uint32_t dq = nope + rope;
  const auto q = random_f32(std::size_t{heads} * dq, rng), k = random_f32(q.size(), rng);
  KernelCase c = make_case(fmt::format("k3_rope heads={} nope={} rope={} pos={} theta={} use_nope={}", heads, nope,
                                       rope, pos, theta, use_nope),
                           "k3_mla_maybe_rope_f32");
  c.module = "mla_decode";
  c.inputs["q"] = tensor<float>({heads, dq}, q);
  c.inputs["k_new"] = tensor<float>({heads, dq}, k);
  c.expected["q"] = tensor<double>({heads, dq}, ref::k3_rope(q, heads, nope, rope, pos, theta, use_nope));
  c.expected["k_new"] = tensor<double>({heads, dq}, ref::k3_rope(k, heads, nope, rope, pos, theta, use_nope));
  // |a|, |b| < 1: FP32 rounding of the products, the FP32 angle (pos·2^-24 rad) and the trig error.
  c.tolerance["q"] = c.tolerance["k_new"] = {2.0 * (4.0 * pos * 0x1p-24 + 0x1p-20), 0, 0};
  // libm and CUDA's powf/sinf/cosf differ in their last bits, which the angle multiplies by pos.
  c.backend_tolerance["q"] = c.backend_tolerance["k_new"] = c.tolerance["q"];
  c.scalars = {{"heads", KernelArg::u32(heads)}, {"nope", KernelArg::u32(nope)},
               {"rope", KernelArg::u32(rope)},   {"pos", KernelArg::u32(pos)},
               {"theta", KernelArg::f32(theta)}, {"use_nope", KernelArg::u32(use_nope ? 1 : 0)}};
  return c;
}

ref::K3SdpaProblem k3_sdpa_problem(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len,
                                   bool use_gate, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ref::K3SdpaProblem p{heads,
                       dq,
                       dv,
                       seq_len,
                       use_gate,
                       random_f32(std::size_t{heads} * dq, rng),
                       random_f32(std::size_t{seq_len} * heads * dq, rng),
                       random_f32(std::size_t{seq_len} * heads * dv, rng),
                       random_f32(std::size_t{heads} * dv, rng)};
  for (auto& x : p.q) x *= 4.0f;  // logits spread enough that the softmax is not flat
  return p;
}

KernelCase k3_sdpa_case(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len, bool use_gate,
                        std::uint64_t seed, bool split_path) {
  const ref::K3SdpaProblem p = k3_sdpa_problem(heads, dq, dv, seq_len, use_gate, seed);
  double bound = 0, backend_bound = 0;
  for (std::size_t h = 0; h < heads; ++h) {
    bound = std::max(bound, k3_sdpa_bound(p, h));
    backend_bound = std::max(backend_bound, k3_sdpa_backend_bound(p, h));
  }
  KernelCase c =
      make_case(fmt::format("k3_sdpa{} heads={} dq={} dv={} seq_len={} use_gate={}", split_path ? "_split_path" : "",
                            heads, dq, dv, seq_len, use_gate),
                split_path ? "k3_sdpa_split_path" : "k3_mla_sdpa_gate_f32");
  c.module = split_path ? kK3FastModule : kMlaDecodeModule;
  c.inputs["q"] = tensor<float>({heads, dq}, p.q);
  if (seq_len > 0) {
    c.inputs["k"] = tensor<float>({seq_len, heads, dq}, p.k);
    c.inputs["v"] = tensor<float>({seq_len, heads, dv}, p.v);
  }
  c.inputs["g"] = tensor<float>({heads, dv}, p.g);
  c.inputs["out"] = tensor<float>({heads, dv}, std::vector<float>(std::size_t{heads} * dv, std::nanf("")));
  c.expected["out"] = tensor<double>({heads, dv}, ref::k3_sdpa_gate(p));
  c.tolerance["out"] = {bound, 0, 0};
  // Between backends the logits' δ: the kernels' fused multiply-adds and expf round differently
  // from the ports' separate roundings and std::exp (4e-6 of a one-dim output, dq = 23, seen on
  // the H200 against a same-arithmetic tolerance of 1e-6).
  c.backend_tolerance["out"] = {backend_bound, 0, 0};
  c.scalars = {{"seq_len", KernelArg::u32(seq_len)},
               {"heads", KernelArg::u32(heads)},
               {"dq", KernelArg::u32(dq)},
               {"dv", KernelArg::u32(dv)},
               {"use_gate", KernelArg::u32(use_gate ? 1 : 0)}};
  return c;
}

KernelCase k3_split_case(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len,
                         std::uint32_t keys_per_chunk, std::uint32_t num_chunks, std::uint64_t seed) {
  const ref::K3SdpaProblem p = k3_sdpa_problem(heads, dq, dv, seq_len, false, seed);
  const ref::K3SplitPartials want = ref::k3_split_partials(p, keys_per_chunk, num_chunks);
  KernelCase c = make_case(fmt::format("k3_split heads={} dq={} dv={} seq_len={} keys_per_chunk={} num_chunks={}",
                                       heads, dq, dv, seq_len, keys_per_chunk, num_chunks),
                           "k3_mla_sdpa_split_f32");
  c.module = kK3FastModule;
  c.inputs["q"] = tensor<float>({heads, dq}, p.q);
  if (seq_len > 0) {
    c.inputs["k"] = tensor<float>({seq_len, heads, dq}, p.k);
    c.inputs["v"] = tensor<float>({seq_len, heads, dv}, p.v);
  }
  const std::int64_t rows = std::int64_t{num_chunks} * heads;
  c.inputs["o_partial"] = tensor<float>({rows, dv}, std::vector<float>(want.o.size(), NAN));
  c.inputs["ml_partial"] = tensor<float>({rows, 2}, std::vector<float>(want.ml.size(), NAN));
  c.expected["o_partial"] = tensor<double>({rows, dv}, want.o);
  c.expected["ml_partial"] = tensor<double>({rows, 2}, want.ml);
  // A logit is off by δ ≤ (dq/32 + 8)·2u·Σ|q·k|/√dq (a lane's sum, the butterfly, the scale); a
  // weight e^(s − m) by 2δ and the roundings of its exp and of the running rescales, a few u per
  // key of the chunk: O within l·max|v|·(4δ + (keys + 32)u), l ≥ 1 relatively the same, m by δ.
  constexpr double kU = 0x1p-24;
  const double delta = want.max_abs_qk * (dq / 32.0 + 8) * 2 * kU;
  const double rel = 4 * delta + (keys_per_chunk + 32.0) * kU;
  double max_l = 0;
  for (std::size_t i = 1; i < want.ml.size(); i += 2) max_l = std::max(max_l, want.ml[i]);
  c.tolerance["o_partial"] = {max_l * want.max_abs_v * rel + 1e-30, 0, 0};
  c.tolerance["ml_partial"] = {2 * delta + 1e-30, rel, 0};
  c.scalars = {{"seq_len", KernelArg::u32(seq_len)},
               {"heads", KernelArg::u32(heads)},
               {"dq", KernelArg::u32(dq)},
               {"dv", KernelArg::u32(dv)},
               {"keys_per_chunk", KernelArg::u32(keys_per_chunk)},
               {"num_chunks", KernelArg::u32(num_chunks)}};
  return c;
}

KernelCase k3_combine_case(std::uint32_t heads, std::uint32_t dv, std::uint32_t num_chunks, bool use_gate,
                           std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const std::size_t rows = std::size_t{num_chunks} * heads;
  std::vector<float> o, ml, g(std::size_t{heads} * dv);
  random_partials(rows, dv, rng, o, ml);
  for (auto& x : g) x = uni(rng) * 4.0f;
  // The reference takes DeepSeek's layout [sequence, head, chunk, dim]: one sequence, no sinks.
  std::vector<float> o_t(o.size()), ml_t(ml.size());
  for (std::size_t c = 0; c < num_chunks; ++c)
    for (std::size_t h = 0; h < heads; ++h) {
      std::copy_n(o.begin() + static_cast<std::ptrdiff_t>((c * heads + h) * dv), dv,
                  o_t.begin() + static_cast<std::ptrdiff_t>((h * num_chunks + c) * dv));
      std::copy_n(ml.begin() + static_cast<std::ptrdiff_t>((c * heads + h) * 2), 2,
                  ml_t.begin() + static_cast<std::ptrdiff_t>((h * num_chunks + c) * 2));
    }
  ref::CombineResult want = ref::combine_partials(o_t, ml_t, {}, 1, heads, num_chunks, dv, 1.0);
  if (use_gate)
    for (std::size_t i = 0; i < want.o.size(); ++i) want.o[i] /= 1.0 + std::exp(-double{g[i]});
  KernelCase c = make_case(
      fmt::format("k3_combine heads={} dv={} num_chunks={} use_gate={} seed={}", heads, dv, num_chunks, use_gate, seed),
      "k3_mla_sdpa_combine_f32");
  c.module = kK3FastModule;
  c.inputs["o_partial"] = tensor<float>({static_cast<std::int64_t>(rows), dv}, o);
  c.inputs["ml_partial"] = tensor<float>({static_cast<std::int64_t>(rows), 2}, ml);
  c.inputs["g"] = tensor<float>({heads, dv}, g);
  c.inputs["out"] = tensor<float>({heads, dv}, std::vector<float>(std::size_t{heads} * dv, NAN));
  c.expected["out"] = tensor<double>({heads, dv}, want.o);
  // The FP32 sums over the chunks, relative to Σ|weight·O|/denominator, and a few roundings.
  c.tolerance["out"] = {(num_chunks + 8) * 0x1p-22 * want.max_abs_terms + 1e-30, 0x1p-20, 0};
  c.scalars = {{"heads", KernelArg::u32(heads)},
               {"dv", KernelArg::u32(dv)},
               {"num_chunks", KernelArg::u32(num_chunks)},
               {"use_gate", KernelArg::u32(use_gate ? 1 : 0)}};
  return c;
}

std::vector<KernelCase> conformance_sweep(std::uint64_t seed) {
  std::vector<KernelCase> out;
  std::uint64_t s = seed;
  for (auto [n, k, h, ip, op] : std::vector<std::array<std::uint32_t, 5>>{{1, 1, 1, 0, 0},
                                                                          {3, 7, 1, 2, 1},
                                                                          {7, 19, 3, 0, 5},
                                                                          {19, 733, 7, 3, 0},
                                                                          {733, 3, 1, 0, 2},
                                                                          {512, 128, 16, 64, 64},
                                                                          {128, 512, 8, 64, 0}})
    out.push_back(gemv_case(n, k, h, ip, op, ++s));
  for (auto [nq, nope, rope, kv, ehd, ecd] : std::vector<std::array<std::uint32_t, 6>>{{1, 1, 1, 1, 0, 0},
                                                                                       {3, 7, 2, 19, 1, 3},
                                                                                       {19, 3, 7, 1, 0, 2},
                                                                                       {733, 2, 3, 5, 1, 1},
                                                                                       {128, 128, 64, 512, 0, 0}})
    out.push_back(q_rope_scatter_case(nq, nope, rope, kv, ehd, ecd, ++s));
  for (auto [nq, rope, kv, ecd] :
       std::vector<std::array<std::uint32_t, 4>>{{1, 1, 1, 0}, {7, 3, 19, 2}, {733, 64, 5, 1}, {128, 64, 512, 0}})
    out.push_back(q_rope_writeback_case(nq, rope, kv, ecd, ++s));
  for (auto [kv, rope, cd] : std::vector<std::array<std::uint32_t, 3>>{
           {1, 0, 1}, {3, 1, 7}, {7, 7, 19}, {19, 3, 733}, {512, 64, 576}, {733, 19, 1024}})
    out.push_back(cache_assemble_case(kv, rope, cd, ++s));
  for (auto [rows, rope, pos] : std::vector<std::array<std::uint32_t, 3>>{
           {1, 2, 0}, {3, 64, 1}, {7, 6, 19}, {19, 64, 299}, {733, 2, 7}, {128, 64, 4095}, {1, 64, 65535}})
    out.push_back(rope_case(rows, rope, pos, pos % 2 ? 50000.0f : 10000.0f, ++s));
  out.push_back(cache_store_case(KvFormat::fp8, 1, 1, 1, 2, 1, ++s));
  out.push_back(cache_store_case(KvFormat::fp8, 3, 7, 3, 3, 9, ++s));
  out.push_back(cache_store_case(KvFormat::fp8, 19, 733, 7, 5, 736, ++s));
  out.push_back(cache_store_case(KvFormat::fp8, 7, 576, 16, 2, 576, ++s));
  out.push_back(cache_store_case(KvFormat::nvfp4, 1, 16, 1, 2, 0, ++s));
  out.push_back(cache_store_case(KvFormat::nvfp4, 7, 48, 3, 5, 0, ++s));
  out.push_back(cache_store_case(KvFormat::nvfp4, 19, 576, 16, 3, 0, ++s));
  out.push_back(cache_store_case(KvFormat::nvfp4, 3, 1024, 1, 4, 0, ++s));

  auto paged = [&](PagedSpec p) {
    p.seed = ++s;
    out.push_back(paged_decode_case(p));
  };
  PagedSpec model;  // DeepSeek: 576-wide rows, 1/√192, a partial last block
  model.num_q_heads = 16, model.q_head_dim = 576, model.kv_cache_dim = 576, model.block_size = 16;
  model.num_seqs = 3, model.max_blocks_per_seq = 20, model.num_blocks = 60, model.seq_lens = {300, 1, 17};
  model.inv_sqrt_d = 1.0f / std::sqrt(192.0f), model.k_scale = 0.013f, model.v_scale = 0.021f;
  for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4}) {
    PagedSpec p = model;
    p.format = f;
    p.zero_groups_every = f == KvFormat::nvfp4 ? 7 : 0;
    paged(p);
    PagedSpec odd;  // 733 keys over blocks of 7, q_head_dim < kv_cache_dim
    odd.format = f, odd.num_q_heads = 7, odd.q_head_dim = 3, odd.kv_cache_dim = f == KvFormat::fp8 ? 19 : 32;
    odd.block_size = 7, odd.max_blocks_per_seq = 105, odd.num_blocks = 110, odd.seq_lens = {733};
    odd.cache_stride = f == KvFormat::fp8 ? 23 : 0;
    paged(odd);
    PagedSpec edges;  // empty, one-token, block-edge and negative lengths; garbage in unused columns
    edges.format = f, edges.block_size = 5, edges.num_seqs = 7, edges.max_blocks_per_seq = 3, edges.num_blocks = 40;
    edges.kv_cache_dim = edges.q_head_dim = 16, edges.fill = std::numeric_limits<std::int32_t>::max();
    edges.seq_lens = {0, 1, 4, 5, 6, 15, -3};
    paged(edges);
    PagedSpec clamp = edges;  // seq_len past the table is clamped
    clamp.num_seqs = 1, clamp.seq_lens = {1000}, clamp.fill = -1;
    paged(clamp);
    PagedSpec grouped;  // 6 q heads over 3 kv heads
    grouped.format = f, grouped.num_q_heads = 6, grouped.num_kv_heads = 3, grouped.q_head_dim = 7;
    grouped.kv_cache_dim = f == KvFormat::fp8 ? 9 : 16, grouped.num_seqs = 2, grouped.max_blocks_per_seq = 5;
    grouped.num_blocks = 10, grouped.seq_lens = {19, 3};
    paged(grouped);
  }
  for (std::uint32_t window : {1u, 6u, 7u, 31u}) {  // windows covering some, most and all keys, with sinks
    PagedSpec p;
    p.sinks = true, p.block_size = 4, p.num_seqs = 4, p.max_blocks_per_seq = 8, p.num_blocks = 32;
    p.seq_lens = {30, 5, 7, 0}, p.sliding_window = window;
    paged(p);
  }
  for (std::uint32_t comp : {0u, 1u, 3u})
    for (std::uint32_t window : {0u, 2u}) {  // compressed pools of C entries, with and without a window
      PagedSpec p;
      p.comp_pool = true, p.comp_block_count = comp, p.sliding_window = window, p.sinks = true;
      p.num_seqs = 3, p.block_size = 2, p.max_blocks_per_seq = 6, p.num_blocks = 18, p.seq_lens = {0, 3, 11};
      paged(p);
    }
  // The fast paths: the wide GEMV on the same shapes where k allows, the split decode on the
  // model's rows and on small ones where a single key's weight is far above P's BF16 rounding.
  for (auto [n, k, h, ip, op] : std::vector<std::array<std::uint32_t, 5>>{{1, 8, 1, 0, 0},
                                                                          {7, 24, 3, 8, 5},
                                                                          {19, 736, 7, 8, 0},
                                                                          {65, 16, 2, 0, 1},
                                                                          {512, 128, 16, 64, 64},
                                                                          {128, 512, 8, 64, 0}}) {
    KernelCase c = gemv_case(n, k, h, ip, op, ++s);
    c.module = "mla_fast";
    c.entry = "mla_batched_gemv_wide";
    c.name = "wide " + c.name;
    out.push_back(std::move(c));
  }
  for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4}) {
    PagedSpec p = model;  // 576-wide rows, 16 heads, 300 keys
    p.format = f, p.seed = ++s;
    out.push_back(split_path_case(p));
    PagedSpec wide = model;  // 128 heads: a small step, in eight 16-head groups (wgmma_rows) on 132 SMs
    wide.format = f, wide.num_q_heads = 128, wide.num_seqs = 2, wide.seq_lens = {1000, 33},
    wide.max_blocks_per_seq = 70;
    wide.num_blocks = 140, wide.seed = ++s;
    out.push_back(split_path_case(wide));
    PagedSpec small;  // few keys, odd head count, block-edge and empty sequences, garbage columns
    small.format = f, small.num_q_heads = 19, small.q_head_dim = 32, small.kv_cache_dim = 64, small.block_size = 5;
    small.num_seqs = 5, small.max_blocks_per_seq = 8, small.num_blocks = 40, small.seq_lens = {0, 1, 5, 6, 33};
    small.fill = std::numeric_limits<std::int32_t>::max(), small.seed = ++s;
    out.push_back(split_path_case(small));
  }
  // The raw split kernels (every entry) on the model's rows, and the combine. The mma.sync
  // entries run on their own here: on sm_90 the dispatcher takes the wgmma ones, so a device
  // conformance run would otherwise launch split16_nvfp4 nowhere and split_fp8 only inside a
  // split path (fresh-user trial, fiftieth session).
  for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4}) {
    PagedSpec p;
    p.format = f, p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = f == KvFormat::fp8 ? 16 : 40;
    p.block_size = 16, p.num_seqs = 2, p.max_blocks_per_seq = 12, p.num_blocks = 30, p.seq_lens = {150, 41};
    p.k_scale = 0.013f, p.v_scale = 0.021f, p.seed = ++s;
    if (f == KvFormat::fp8) p.sliding_window = 100, p.comp_pool = true, p.comp_block_count = 3;
    out.push_back(split_kernel_case(p, 2, f == KvFormat::fp8 ? SplitEntry::split16 : SplitEntry::split));
    p.seed = ++s;  // the other mma.sync entry: FP8's 64-row groups over 16 heads, NVFP4's 16-row ones over 40
    out.push_back(split_kernel_case(p, 2, f == KvFormat::fp8 ? SplitEntry::split : SplitEntry::split16));
    p.num_q_heads = 70, p.seed = ++s;  // the wgmma entries: two head groups, the second mostly empty
    out.push_back(split_kernel_case(p, 1, SplitEntry::wgmma));
    if (f == KvFormat::fp8) {  // the 64-head entry with the combine in its clusters: 5 chunks, sinks
      p.sinks = true, p.seed = ++s;
      out.push_back(fused_decode_case(p, 1));
      p.sinks = false;
    }
    p.num_q_heads = 13, p.seed = ++s;  // the wgmma16 entries: one head group, three heads short
    out.push_back(split_kernel_case(p, 1, SplitEntry::wgmma16));
    p.seed = ++s, out.push_back(split_kernel_case(p, 1, SplitEntry::wgmma16_rs));
    if (f == KvFormat::fp8) {
      p.sinks = true, p.seed = ++s;  // the staged entry with the combine in its clusters: 4 chunks
      out.push_back(fused_decode_case(p, 1));
      p.sinks = false;
    }
  }
  out.push_back(combine_case(3, 5, 576, 7, true, ++s));
  for (std::uint32_t comp : {0u, 2u}) {  // windows, sinks and compressed entries through the split path
    PagedSpec p;
    p.q_head_dim = 64, p.kv_cache_dim = 128, p.num_q_heads = 4, p.sinks = true, p.block_size = 4, p.num_seqs = 4;
    p.max_blocks_per_seq = 80, p.num_blocks = 320, p.seq_lens = {300, 5, 7, 0}, p.sliding_window = 40;
    p.comp_pool = comp > 0, p.comp_block_count = comp, p.seed = ++s;
    out.push_back(split_path_case(p));
  }
  // Kimi K3: odd head counts and dims, rope 0, an odd rope under NoPE (rotating, the launcher
  // refuses it), positions far out; SDPA with and without the gate over histories from empty to
  // several hundred keys.
  for (auto [heads, nope, rope, pos] : std::vector<std::array<std::uint32_t, 4>>{
           {1, 1, 2, 0}, {3, 7, 0, 5}, {7, 19, 5, 299}, {7, 19, 6, 299}, {64, 128, 64, 4095}, {70, 3, 64, 65535}})
    for (bool use_nope : {false, true})
      if (use_nope || rope % 2 == 0) out.push_back(k3_rope_case(heads, nope, rope, pos, 10000.0f, use_nope, ++s));
  for (auto [heads, dq, dv, seq] : std::vector<std::array<std::uint32_t, 4>>{
           {1, 1, 1, 0}, {3, 7, 19, 1}, {7, 33, 5, 19}, {64, 192, 128, 300}, {19, 192, 128, 733}, {70, 65, 129, 7}})
    for (bool gate : {false, true}) out.push_back(k3_sdpa_case(heads, dq, dv, seq, gate, ++s));
  // Its split path: the same shapes, chunks longer and shorter than a four-key step, the widest
  // rows the split kernel takes (256), and a history of many chunks per head.
  for (auto [heads, dq, dv, seq] : std::vector<std::array<std::uint32_t, 4>>{{1, 1, 1, 0},
                                                                            {3, 7, 19, 1},
                                                                            {7, 33, 5, 19},
                                                                            {64, 192, 128, 300},
                                                                            {19, 192, 128, 733},
                                                                            {70, 65, 129, 7},
                                                                            {5, 256, 256, 130},
                                                                            {16, 192, 128, 4099}})
    for (bool gate : {false, true}) out.push_back(k3_sdpa_case(heads, dq, dv, seq, gate, ++s, true));
  // Its two kernels alone: chunks ending mid-step and a block of chunks past the keys; a combine
  // with empty chunks.
  out.push_back(k3_split_case(19, 192, 128, 733, 13, 64, ++s));
  for (bool gate : {false, true}) out.push_back(k3_combine_case(7, 128, 12, gate, ++s));
  // The wgmma entries' online softmax over logits that rise along the keys (the FP8 64-head
  // block's lazy rescale moves a head's maximum after its first tile): two head groups, chunks of
  // three tiles, one ending inside a tile, compressed entries first.
  PagedSpec ramp;
  ramp.q_head_dim = ramp.kv_cache_dim = 576, ramp.num_q_heads = 70, ramp.block_size = 16, ramp.num_seqs = 2;
  ramp.max_blocks_per_seq = 21, ramp.num_blocks = 48, ramp.seq_lens = {330, 201}, ramp.k_scale = 0.5f;
  ramp.v_scale = 0.021f, ramp.key_ramp = 2.0f, ramp.comp_pool = true, ramp.comp_block_count = 3, ramp.seed = ++s;
  out.push_back(split_kernel_case(ramp, 3, SplitEntry::wgmma));
  // One latent pool as both caches (v_cache aliasing k_cache, V = K): the staged FP8 16-head
  // entry's ring of two slots over pages of 7 keys, its cluster combine, and the split path; the
  // FP8 64-head entries (reading the row twice), two head groups (the second short), alone and in
  // clusters.
  PagedSpec latent = ramp;
  latent.num_q_heads = 16, latent.block_size = 7, latent.max_blocks_per_seq = 47, latent.num_blocks = 100;
  latent.comp_pool = false, latent.comp_block_count = 0, latent.sliding_window = 300, latent.sinks = true;
  latent.latent = true, latent.seed = ++s;
  out.push_back(split_kernel_case(latent, 3, SplitEntry::wgmma16_rs));
  latent.seed = ++s, out.push_back(fused_decode_case(latent, 1));
  latent.seed = ++s, out.push_back(split_path_case(latent));
  latent.num_q_heads = 70, latent.seed = ++s;
  out.push_back(split_kernel_case(latent, 2, SplitEntry::wgmma));
  latent.seed = ++s, out.push_back(fused_decode_case(latent, 1));
  for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4}) {  // the seed kernel and NVFP4's split path too
    PagedSpec p = model;
    p.format = f, p.latent = true;
    paged(p);
    if (f == KvFormat::nvfp4) p.seed = ++s, out.push_back(split_path_case(p));
  }
  // The FP8 64-head entry with the heads in M over the same latent pool: two head groups (the
  // second short), chunks of two tiles, one ending inside a tile; and with the combine in its
  // clusters, seven chunks of one tile (the last without keys).
  latent.seed = ++s, out.push_back(split_kernel_case(latent, 2, SplitEntry::wgmma_latent));
  latent.seed = ++s, out.push_back(fused_decode_case(latent, 1, true));
  // Its NVFP4 entry over an NVFP4 latent pool of the same shape (no window, no sinks: the NVFP4
  // kernels have neither).
  PagedSpec latent4 = latent;
  latent4.format = KvFormat::nvfp4, latent4.sliding_window = 0, latent4.sinks = false, latent4.seed = ++s;
  out.push_back(split_kernel_case(latent4, 2, SplitEntry::wgmma_latent));
  latent4.sinks = true, latent4.seed = ++s;  // in clusters, with sinks (the combine's)
  out.push_back(fused_decode_case(latent4, 1, true));
  // And the NVFP4 split path to it: a table of 4200 keys, which the dispatcher gives the
  // heads-in-M block (or its clusters) on an sm_90 device.
  latent4.sinks = false, latent4.max_blocks_per_seq = 600, latent4.seed = ++s;
  out.push_back(split_path_case(latent4));
  // The warp-specialised 16-head entry over one latent pool converts each tile once, into its K
  // and V buffers by turns: chunks of five tiles (the K buffer refilled twice, the V buffer once;
  // the last chunk ending inside a tile) and of two, both formats.
  latent.num_q_heads = 16, latent4.num_q_heads = 16, latent4.max_blocks_per_seq = 47;
  for (std::uint32_t tiles : {5u, 2u}) {
    latent.seed = ++s, out.push_back(split_kernel_case(latent, tiles, SplitEntry::wgmma16));
    latent4.seed = ++s, out.push_back(split_kernel_case(latent4, tiles, SplitEntry::wgmma16));
  }
  return out;
}

}  // namespace metrale::gen
