// The launchers of modules mla_fast and k3_fast (issue 6) and mla_decode (SPEC §4) as generic
// launcher definitions: valid sentinel arguments (boundaries included), the record, every rule.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "arb.hpp"
#include "launcher_defs.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/launch.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/mla_fast.hpp"

namespace metrale::props::defs {

namespace {

constexpr Dim3 k256{256, 1, 1};
constexpr const char* kFast = "mla_fast";
constexpr const char* kWgmma = "mla_wgmma";
constexpr const char* kK3 = "mla_decode";
constexpr const char* kK3Fast = "k3_fast";

// ---- mla_batched_gemv_wide -----------------------------------------------------------------

Def<BatchedGemvArgs> gemv_wide() {
  const char* kn = "mla_batched_gemv_wide";
  Def<BatchedGemvArgs> d{kFast, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    BatchedGemvArgs a{s.next(), s.next(), s.next()};
    a.n_out = u(1, 1u << 24);
    a.num_heads = coin() ? 65535 : u(1, 65535);
    a.k = 8 * u_fit(1, 1u << 21, 16ull * a.num_heads * a.n_out);  // the weights within their slot
    a.input_stride = 8 * u(0, 1u << 28);
    a.output_stride = coin() ? a.n_out : u(a.n_out, kU32Max);
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const BatchedGemvArgs& a) { mla_batched_gemv_wide(g, k, a); };
  d.expect = [kn](const BatchedGemvArgs& a) {
    auto e = launch_of(kFast, kn, {div_ceil(a.n_out, wide_gemv_rows(a.k)), a.num_heads, 1}, k256);
    e.args = {{"input", P(a.input)}, {"weight", P(a.weight)}, {"output", P(a.output)},
              {"n_out", U(a.n_out)}, {"k", U(a.k)},           {"input_stride", U(a.input_stride)},
              {"output_stride", U(a.output_stride)}};
    return e;
  };
  using A = BatchedGemvArgs;
  d.rules = {null_rule<A>(kn, "input", &A::input),
             null_rule<A>(kn, "weight", &A::weight),
             null_rule<A>(kn, "output", &A::output),
             zero_rule<A>(kn, "n_out", &A::n_out),
             zero_rule<A>(kn, "k", &A::k),
             zero_rule<A>(kn, "num_heads", &A::num_heads),
             over_rule<A>(kn, "num_heads", &A::num_heads, 65535),
             [kn](A& a) {
               a.output_stride = u(0, a.n_out - 1);
               return BrokenRule{"output_stride < n_out",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("output_stride {} < n_out {}", a.output_stride, a.n_out)}};
             },
             [kn](A& a) {
               a.k = 8 * u(0, 1u << 20) + u(1, 7);
               return BrokenRule{"k not a multiple of 8", Errc::invalid_argument,
                                 {kn, fmt::format("k {} and input_stride {} must be multiples of 8", a.k,
                                                  a.input_stride)}};
             },
             [kn](A& a) {
               a.input_stride = 8 * u(0, 1u << 20) + u(1, 7);
               return BrokenRule{"input_stride not a multiple of 8", Errc::invalid_argument,
                                 {kn, fmt::format("k {} and input_stride {} must be multiples of 8", a.k,
                                                  a.input_stride)}};
             }};
  return d;
}

// ---- split decode -------------------------------------------------------------------------------

// Shapes the split kernels take: one KV head implied, q_head_dim a multiple of 32 up to
// kv_cache_dim, kv_cache_dim a multiple of 64 up to 576, 256-aligned sentinels.
void arb_split(SplitDecodeArgs& a) {
  Sentinels s;
  a.q = s.next(), a.k_cache = s.next(), a.v_cache = s.next(), a.o_partial = s.next();
  a.ml_partial = s.next(), a.block_tables = s.next(), a.seq_lens = s.next();
  a.kv_cache_dim = 64 * u(1, 9);
  a.q_head_dim = 32 * u(1, a.kv_cache_dim / 32);
  a.rows_per_block = 16 * u(1, 4);
  a.num_q_heads = u(1, 65535 * a.rows_per_block);  // ⌈num_q_heads / rows_per_block⌉ is the grid's y
  a.block_size = u(1, 1u << 12);
  a.max_blocks_per_seq = u(1, 1u << 12);
  a.logit_scale = finite_float();
  a.keys_per_split = 32 * u(1, 1u << 16);
  a.num_seqs = coin() ? 65535 : u(1, 65535);
  a.num_splits = u(1, 1u << 16);
}

// Enough chunks for every key the table (and `comp` compressed entries) can hold, and no more
// sequences than keep the partials (num_seqs × num_q_heads × num_splits rows of kv_cache_dim
// floats) within kMaxExtent, apart from the other sentinels as the launchers require.
void cover_keys(SplitDecodeArgs& a, std::uint64_t comp) {
  const std::uint64_t capacity = std::uint64_t{a.max_blocks_per_seq} * a.block_size + comp;
  a.num_splits = static_cast<std::uint32_t>(
      std::max<std::uint64_t>(a.num_splits, (capacity + a.keys_per_split - 1) / a.keys_per_split));
  const std::uint64_t per_seq = std::uint64_t{a.num_q_heads} * a.num_splits * a.kv_cache_dim * 4;
  a.num_seqs = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(kMaxExtent / per_seq, 1, a.num_seqs));
}

// The wgmma entries' shapes: 64-head (or 16-head) blocks, 64-key tiles, DeepSeek's rows.
void arb_wgmma(SplitDecodeArgs& a, std::uint32_t rows) {
  arb_split(a);
  a.rows_per_block = rows;
  a.num_q_heads = u(1, 65535 * rows);
  a.keys_per_split = 64 * u(1, 1u << 15);
  a.q_head_dim = a.kv_cache_dim = 576;
}

// Dynamic shared memory of a wgmma entry's block, from its carve-up in kernels/mla_wgmma.cu (1 KiB
// to align the swizzled tiles; Q and P as FP16; the raw tiles (FP8 576 bytes a key, NVFP4 288 +
// 36) or FP16 tiles; the per-head factors; the mbarriers), written out here, not read from the
// library: 64 heads, two slots of raw K and V tiles; 16 heads, FP16 K and V tiles; 16 staged, raw
// K and V half-tiles.
std::uint32_t wgmma_entry_bytes(std::string_view kn) {
  const bool nvfp4 = kn.ends_with("nvfp4");
  if (kn.starts_with("mla_paged_decode_wgmma16_rs")) return nvfp4 ? 63312 : 95568;
  if (kn.starts_with("mla_paged_decode_wgmma16")) return 169280;
  return nvfp4 ? 167248 : 231760;
}

ExpectedLaunch split_launch(const char* kn, const SplitDecodeArgs& a, bool wgmma) {
  const bool staged16 = std::string_view(kn).starts_with("mla_paged_decode_wgmma16_rs");
  auto e = launch_of(wgmma ? kWgmma : kFast, kn,
                     {a.num_splits, div_ceil(a.num_q_heads, a.rows_per_block), a.num_seqs},
                     {wgmma ? wgmma_threads(a.rows_per_block, staged16) : 8 * a.rows_per_block, 1, 1});
  const KvFormat format = std::string_view(kn).ends_with("nvfp4") ? KvFormat::nvfp4 : KvFormat::fp8;
  e.shared_bytes = wgmma ? wgmma_entry_bytes(kn)
                         : split_shared_bytes(a.rows_per_block, a.kv_cache_dim,
                                              a.staged ? split_raw_pitch(format, a.kv_cache_dim) : 0);
  e.args = {{"q", P(a.q)},
            {"k_cache", P(a.k_cache)},
            {"v_cache", P(a.v_cache)},
            {"o_partial", P(a.o_partial)},
            {"ml_partial", P(a.ml_partial)},
            {"block_tables", P(a.block_tables)},
            {"seq_lens", P(a.seq_lens)},
            {"max_blocks_per_seq", U(a.max_blocks_per_seq)},
            {"num_q_heads", U(a.num_q_heads)},
            {"q_head_dim", U(a.q_head_dim)},
            {"kv_cache_dim", U(a.kv_cache_dim)},
            {"block_size", U(a.block_size)},
            {"logit_scale", F(a.logit_scale)}};
  return e;
}

// A 16-byte misalignment of a pointer or a pitch.
template <class A, class Member>
std::function<BrokenRule(A&)> misalign_rule(const char* kn, const char* name, Member field) {
  return [=](A& a) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(a.*field)>, DevicePtr>) {
      if (!(a.*field)) a.*field = Sentinels(0x80).next();  // comp_pool may be null: misalign a real one
      a.*field = a.*field + u(1, 15);
      return BrokenRule{fmt::format("{} misaligned", name),
                        Errc::invalid_argument,
                        {kn, fmt::format("{} {:#x} is not 16-byte aligned", name, (a.*field).addr)}};
    } else {
      a.*field = a.*field + u(1, 15);
      return BrokenRule{fmt::format("{} misaligned", name),
                        Errc::invalid_argument,
                        {kn, fmt::format("{} {:#x} is not 16-byte aligned", name, a.*field)}};
    }
  };
}

template <class A>
std::vector<std::function<BrokenRule(A&)>> split_rules(const char* kn) {
  return {
      null_rule<A>(kn, "q", &A::q),
      null_rule<A>(kn, "k_cache", &A::k_cache),
      null_rule<A>(kn, "v_cache", &A::v_cache),
      null_rule<A>(kn, "o_partial", &A::o_partial),
      null_rule<A>(kn, "ml_partial", &A::ml_partial),
      null_rule<A>(kn, "block_tables", &A::block_tables),
      null_rule<A>(kn, "seq_lens", &A::seq_lens),
      zero_rule<A>(kn, "num_seqs", &A::num_seqs),
      zero_rule<A>(kn, "num_q_heads", &A::num_q_heads),
      zero_rule<A>(kn, "num_splits", &A::num_splits),
      zero_rule<A>(kn, "block_size", &A::block_size),
      zero_rule<A>(kn, "max_blocks_per_seq", &A::max_blocks_per_seq),
      over_rule<A>(kn, "num_seqs", &A::num_seqs, 65535),
      [kn](A& a) {
        const std::uint32_t bad = *rc::gen::element(0u, 8u, 15u, 17u, 24u, 80u, 128u);
        a.rows_per_block = bad;
        return BrokenRule{"rows_per_block not 16, 32, 48 or 64",
                          Errc::invalid_argument,
                          {kn, fmt::format("rows_per_block {} is not 16, 32, 48 or 64", bad)}};
      },
      [kn](A& a) {
        a.keys_per_split = coin() ? 0 : 32 * u(0, 1u << 20) + u(1, 31);
        return BrokenRule{"keys_per_split not a positive multiple of 32",
                          Errc::invalid_argument,
                          {kn, fmt::format("keys_per_split {} is not a positive multiple of 32", a.keys_per_split)}};
      },
      [kn](A& a) {
        a.logit_scale = non_finite_float();
        return BrokenRule{"logit_scale not finite",
                          Errc::invalid_argument,
                          {kn, fmt::format("logit_scale {} is not finite", a.logit_scale)}};
      },
      logit_scale_rule<A>(kn, "logit_scale", &A::logit_scale),
      [kn](A& a) {
        a.q_head_dim = coin() ? 0 : std::min(a.kv_cache_dim - 1, 32 * u(0, a.kv_cache_dim / 32) + u(1, 31));
        return BrokenRule{"q_head_dim not a multiple of 32",
                          Errc::invalid_argument,
                          {kn, fmt::format("q_head_dim {} is not a multiple of 32", a.q_head_dim)}};
      },
      [kn](A& a) {
        a.kv_cache_dim =
            coin() || a.q_head_dim >= 512 ? 64 * u(10, 1u << 20) : 64 * u(a.q_head_dim / 64 + 1, 8) + u(1, 63);
        return BrokenRule{"kv_cache_dim not a multiple of 64 up to 576",
                          Errc::invalid_argument,
                          {kn, fmt::format("kv_cache_dim {} is not a multiple of 64 up to 576", a.kv_cache_dim)}};
      },
      [kn](A& a) {
        a.kv_cache_dim = 64 * u(1, 8);
        a.q_head_dim = a.kv_cache_dim + 32 * u(1, 1u << 20);
        return BrokenRule{"q_head_dim > kv_cache_dim",
                          Errc::invalid_argument,
                          {kn, fmt::format("q_head_dim {} > kv_cache_dim {}", a.q_head_dim, a.kv_cache_dim)}};
      },
      misalign_rule<A>(kn, "k_cache", &A::k_cache),
      misalign_rule<A>(kn, "v_cache", &A::v_cache),
      misalign_rule<A>(kn, "q", &A::q),
      [kn](A& a) {
        a.keys_per_split = 32;
        a.num_splits = std::max(1u, a.max_blocks_per_seq * a.block_size / 64);
        a.max_blocks_per_seq = std::max(a.max_blocks_per_seq, 2u), a.block_size = std::max(a.block_size, 64u);
        return BrokenRule{"chunks cover fewer keys than the table",
                          Errc::invalid_argument,
                          {kn, fmt::format("num_splits {} x keys_per_split 32 covers fewer keys", a.num_splits)}};
      }};
}

// What the wgmma launchers refuse beyond the split launchers' rules.
template <class A>
void add_wgmma_rules(std::vector<std::function<BrokenRule(A&)>>& rules, const char* kn) {
  rules.push_back([kn](A& a) {
    a.o_partial = a.o_partial + 4 * u(1, 1);
    return BrokenRule{"o_partial not 8-byte aligned",
                      Errc::invalid_argument,
                      {kn, fmt::format("o_partial {:#x} is not 8-byte aligned", a.o_partial.addr)}};
  });
  rules.push_back([kn](A& a) {
    a.rows_per_block = 16 * u(2, 3);
    a.num_q_heads = std::min(a.num_q_heads, 65535 * a.rows_per_block);  // the grid's y stays valid
    return BrokenRule{"rows_per_block not 64 or 16",
                      Errc::invalid_argument,
                      {kn, fmt::format("rows_per_block {} is not 64 or 16 (the wgmma blocks)", a.rows_per_block)}};
  });
  rules.push_back([kn](A& a) {
    a.rows_per_block = 80 - a.rows_per_block;  // 64 <-> 16
    a.num_q_heads = std::min(a.num_q_heads, 65535 * a.rows_per_block);
    return BrokenRule{"the other block size's rows_per_block",
                      Errc::invalid_argument,
                      {fmt::format("rows_per_block {} does not fit kernel mla_wgmma.{}", a.rows_per_block, kn)}};
  });
  rules.push_back([kn](A& a) {
    a.keys_per_split = 64 * u(0, 1u << 15) + 32;
    // Chunks still covering the table: the split launchers' coverage rule is checked first.
    if constexpr (std::is_same_v<A, SplitDecodeFp8Args>) {
      cover_keys(a, a.comp_block_count);
    } else {
      cover_keys(a, 0);
    }
    return BrokenRule{"keys_per_split not a multiple of 64",
                      Errc::invalid_argument,
                      {kn, fmt::format("keys_per_split {} is not a multiple of 64 (the wgmma tile)",
                                       a.keys_per_split)}};
  });
  rules.push_back([kn](A& a) {
    a.kv_cache_dim = 64 * u(1, 8);
    a.q_head_dim = 32 * u(1, a.kv_cache_dim / 32);
    return BrokenRule{"rows not 576 wide",
                      Errc::invalid_argument,
                      {kn, fmt::format("q_head_dim {} and kv_cache_dim {} are not both 576", a.q_head_dim,
                                       a.kv_cache_dim)}};
  });
}

// The split launchers' entries: mla_fast's split entry, or mla_wgmma's 64-head or 16-head entry,
// or its staged 16-head entry.
enum class SplitDef { split, wgmma, wgmma16, wgmma16_rs };
const char* entry_of(SplitDef which, const char* split, const char* wgmma, const char* wgmma16,
                     const char* wgmma16_rs = nullptr) {
  return which == SplitDef::split   ? split
         : which == SplitDef::wgmma ? wgmma
         : which == SplitDef::wgmma16 ? wgmma16
                                      : wgmma16_rs;
}
std::uint32_t wgmma_rows_of(SplitDef which) { return which == SplitDef::wgmma ? 64 : 16; }

// mla_paged_decode_split_fp8, mla_paged_decode_wgmma_fp8, mla_paged_decode_wgmma16_fp8 or
// mla_paged_decode_wgmma16_rs_fp8.
Def<SplitDecodeFp8Args> split_fp8(SplitDef which) {
  const bool wgmma = which != SplitDef::split;
  const char* kn = entry_of(which, "mla_paged_decode_split_fp8", "mla_paged_decode_wgmma_fp8",
                            "mla_paged_decode_wgmma16_fp8", "mla_paged_decode_wgmma16_rs_fp8");
  Def<SplitDecodeFp8Args> d{wgmma ? kWgmma : kFast, kn, {}, {}, {}, {}};
  d.arb = [wgmma, which] {
    SplitDecodeFp8Args a;
    wgmma ? arb_wgmma(a, wgmma_rows_of(which)) : arb_split(a);
    a.cache_stride = 16 * u(a.kv_cache_dim / 16, std::min(1u << 16, ((1u << 31) / a.block_size - 1) / 8));
    a.sliding_window = u(0, kU32Max);
    a.comp_pool = coin() ? Sentinels(0x80).next() : DevicePtr{};
    a.comp_block_count = u(0, 1u << 16);
    // Chunks that cover the compressed entries even without a pool: a rule that sets one (a
    // misaligned comp_pool) must not trip the coverage rule first.
    cover_keys(a, a.comp_block_count);
    return a;
  };
  d.launch = [wgmma](GpuBackend& g, KernelHandle k, const SplitDecodeFp8Args& a) {
    wgmma ? mla_paged_decode_wgmma_fp8(g, k, a) : mla_paged_decode_split_fp8(g, k, a);
  };
  d.expect = [kn, wgmma](const SplitDecodeFp8Args& a) {
    auto e = split_launch(kn, a, wgmma);
    e.args.insert(e.args.end(), {{"cache_stride", Q(a.cache_stride)},
                                 {"sliding_window", U(a.sliding_window)},
                                 {"comp_pool", P(a.comp_pool)},
                                 {"comp_block_count", U(a.comp_block_count)},
                                 {"keys_per_split", U(a.keys_per_split)}});
    return e;
  };
  using A = SplitDecodeFp8Args;
  d.rules = split_rules<A>(kn);
  d.rules.push_back(misalign_rule<A>(kn, "comp_pool", &A::comp_pool));
  d.rules.push_back(misalign_rule<A>(kn, "cache_stride", &A::cache_stride));
  if (wgmma)
    add_wgmma_rules<A>(d.rules, kn);
  return d;
}

// mla_paged_decode_split_nvfp4, mla_paged_decode_wgmma_nvfp4, mla_paged_decode_wgmma16_nvfp4 or
// mla_paged_decode_wgmma16_rs_nvfp4.
Def<SplitDecodeNvfp4Args> split_nvfp4(SplitDef which) {
  const bool wgmma = which != SplitDef::split;
  const char* kn = entry_of(which, "mla_paged_decode_split_nvfp4", "mla_paged_decode_wgmma_nvfp4",
                            "mla_paged_decode_wgmma16_nvfp4", "mla_paged_decode_wgmma16_rs_nvfp4");
  Def<SplitDecodeNvfp4Args> d{wgmma ? kWgmma : kFast, kn, {}, {}, {}, {}};
  d.arb = [wgmma, which] {
    SplitDecodeNvfp4Args a;
    wgmma ? arb_wgmma(a, wgmma_rows_of(which)) : arb_split(a);
    const std::uint64_t data = std::uint64_t{a.block_size} * a.kv_cache_dim / 2;  // a multiple of 32
    const std::uint64_t scales = (std::uint64_t{a.block_size} * a.kv_cache_dim / 16 + 15) / 16 * 16;
    a.data_section_bytes = data + (coin() ? 0 : 16 * u(1, 256));
    a.block_stride_bytes = a.data_section_bytes + scales + (coin() ? 0 : 16 * u(1, 256));
    cover_keys(a, 0);
    return a;
  };
  d.launch = [wgmma](GpuBackend& g, KernelHandle k, const SplitDecodeNvfp4Args& a) {
    wgmma ? mla_paged_decode_wgmma_nvfp4(g, k, a) : mla_paged_decode_split_nvfp4(g, k, a);
  };
  d.expect = [kn, wgmma](const SplitDecodeNvfp4Args& a) {
    auto e = split_launch(kn, a, wgmma);
    e.args.insert(e.args.end(), {{"block_stride_bytes", Q(a.block_stride_bytes)},
                                 {"data_section_bytes", Q(a.data_section_bytes)},
                                 {"keys_per_split", U(a.keys_per_split)}});
    return e;
  };
  using A = SplitDecodeNvfp4Args;
  d.rules = split_rules<A>(kn);
  d.rules.push_back(misalign_rule<A>(kn, "block_stride_bytes", &A::block_stride_bytes));
  d.rules.push_back(misalign_rule<A>(kn, "data_section_bytes", &A::data_section_bytes));
  d.rules.push_back([kn](A& a) {
    const std::uint64_t data = std::uint64_t{a.block_size} * a.kv_cache_dim / 2;
    if (coin()) {
      a.data_section_bytes = 16 * u64(0, data / 16 - 1);
    } else {
      a.block_stride_bytes = a.data_section_bytes + 16 * u64(0, std::uint64_t{a.block_size} * a.kv_cache_dim / 256);
      if (a.block_stride_bytes - a.data_section_bytes >= std::uint64_t{a.block_size} * a.kv_cache_dim / 16)
        a.block_stride_bytes -= 16;
    }
    return BrokenRule{"NVFP4 sections too small",
                      Errc::invalid_argument,
                      {kn, fmt::format("NVFP4 sections (data {} bytes, block stride {} bytes) do not hold block_size {}",
                                       a.data_section_bytes, a.block_stride_bytes, a.block_size)}};
  });
  if (wgmma)
    add_wgmma_rules<A>(d.rules, kn);
  return d;
}

// ---- combine -------------------------------------------------------------------------------------

Def<CombineArgs> combine() {
  const char* kn = "mla_paged_decode_combine";
  Def<CombineArgs> d{kFast, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    CombineArgs a{s.next(), s.next(), coin() ? s.next() : DevicePtr{}, s.next()};
    a.num_q_heads = coin() ? kI32Max : u(1, kI32Max);
    a.num_seqs = coin() ? 65535 : u(1, 65535);
    // o_partial [num_seqs, num_q_heads, num_splits, kv_cache_dim] f32 within its slot.
    const std::uint64_t rows_bytes = 4ull * a.num_seqs * a.num_q_heads;
    a.kv_cache_dim = u_fit(1, 1u << 20, rows_bytes);
    a.num_splits = u_fit(1, 1u << 20, rows_bytes * a.kv_cache_dim);
    a.v_scale = positive_float();
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const CombineArgs& a) { mla_paged_decode_combine(g, k, a); };
  d.expect = [kn](const CombineArgs& a) {
    auto e = launch_of(kFast, kn, {a.num_q_heads, a.num_seqs, combine_blocks(a.num_q_heads, a.num_seqs, a.kv_cache_dim)},
                       k256);
    e.args = {{"o_partial", P(a.o_partial)},     {"ml_partial", P(a.ml_partial)},
              {"sinks", P(a.sinks)},             {"o", P(a.o)},
              {"num_q_heads", U(a.num_q_heads)}, {"kv_cache_dim", U(a.kv_cache_dim)},
              {"num_splits", U(a.num_splits)},   {"v_scale", F(a.v_scale)}};
    return e;
  };
  using A = CombineArgs;
  d.rules = {null_rule<A>(kn, "o_partial", &A::o_partial),
             null_rule<A>(kn, "ml_partial", &A::ml_partial),
             null_rule<A>(kn, "o", &A::o),
             zero_rule<A>(kn, "num_q_heads", &A::num_q_heads),
             zero_rule<A>(kn, "kv_cache_dim", &A::kv_cache_dim),
             zero_rule<A>(kn, "num_splits", &A::num_splits),
             zero_rule<A>(kn, "num_seqs", &A::num_seqs),
             over_rule<A>(kn, "num_seqs", &A::num_seqs, 65535),
             over_rule<A>(kn, "num_q_heads", &A::num_q_heads, kI32Max),
             scale_rule<A>(kn, "v_scale", &A::v_scale),
             e4m3_scale_rule<A>(kn, "v_scale", &A::v_scale)};
  return d;
}

// ---- Kimi K3 ----------------------------------------------------------------------------------------

// Non-null k and v (the K3 SDPA launchers need both once there are keys), from slots the draws
// do not use.
template <class A>
void give_keys(A& a) {
  Sentinels s(0xC0);
  a.k = a.k ? a.k : s.next();
  a.v = a.v ? a.v : s.next();
}

// Rule: `field` (k or v) null with keys. Message "<kernel>: <name> is null".
template <class A>
std::function<BrokenRule(A&)> keys_null_rule(const char* kn, const char* name, DevicePtr A::*field) {
  return [=](A& a) {
    a.seq_len = std::max(a.seq_len, 1u);
    give_keys(a);  // the other of k and v stays non-null
    a.*field = {};
    return BrokenRule{fmt::format("{} null with keys", name), Errc::invalid_argument,
                      {kn, fmt::format("{} is null", name)}};
  };
}

Def<K3RopeArgs> k3_rope() {
  const char* kn = "k3_mla_maybe_rope_f32";
  Def<K3RopeArgs> d{kK3, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    K3RopeArgs a{s.next(), s.next()};
    a.nope = u(0, 1u << 30);
    a.use_nope = coin();
    a.rope = a.use_nope ? u(0, 1u << 30) : 2 * u(0, 1u << 29);          // rotating, an even width
    a.heads = u_fit(1, kU32Max, 4 * (std::uint64_t{a.nope} + a.rope));  // q and k_new within their slots
    a.pos = a.use_nope ? u(0, kU32Max) : u(0, 1u << 24);  // a position rotates only up to 2^24
    // Under NoPE theta is never used, so any value is accepted.
    a.theta = a.use_nope && coin() ? *rc::gen::element(0.0f, -1.0f, non_finite_float()) : positive_float();
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const K3RopeArgs& a) { k3_mla_maybe_rope_f32(g, k, a); };
  d.expect = [kn](const K3RopeArgs& a) {
    auto e = launch_of(kK3, kn, {div_ceil(a.heads, 128u), 1, 1}, {128, 1, 1});
    e.args = {{"q", P(a.q)},       {"k_new", P(a.k_new)}, {"heads", U(a.heads)},    {"nope", U(a.nope)},
              {"rope", U(a.rope)}, {"pos", U(a.pos)},     {"theta", F(a.theta)}, {"use_nope", U(a.use_nope ? 1 : 0)}};
    return e;
  };
  using A = K3RopeArgs;
  d.rules = {null_rule<A>(kn, "q", &A::q),
             null_rule<A>(kn, "k_new", &A::k_new),
             zero_rule<A>(kn, "heads", &A::heads),
             [kn](A& a) {
               a.nope = u(1u << 31, kU32Max);
               a.rope = u(kU32Max - a.nope + 1, kU32Max);
               return BrokenRule{"nope + rope past 2^32 - 1",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("nope + rope {} exceeds", std::uint64_t{a.nope} + a.rope)}};
             },
             [kn](A& a) {
               a.use_nope = false, a.rope = 2 * u(0, 1u << 29) + 1;
               return BrokenRule{
                   "an odd rope when rotating", Errc::invalid_argument, {kn, fmt::format("rope {} is odd", a.rope)}};
             },
             [kn](A& a) {
               a.use_nope = false, a.rope -= a.rope % 2;
               a.theta = bad_positive_float();
               return BrokenRule{"theta not finite or not positive",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("theta {} is not a finite positive number", a.theta)}};
             },
             [kn](A& a) {
               a.use_nope = false;
               a.theta = positive_float();
               a.rope = std::max(a.rope - a.rope % 2, 2u), a.heads = 1;  // a pair rotates (rope 0 takes any position)
               a.pos = u((1u << 24) + 1, kU32Max);
               return BrokenRule{"a rotated position past 2^24",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("position {} is past 2^24", a.pos)}};
             }};
  return d;
}

Def<K3SdpaArgs> k3_sdpa() {
  const char* kn = "k3_mla_sdpa_gate_f32";
  Def<K3SdpaArgs> d{kK3, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    K3SdpaArgs a;
    a.q = s.next();
    a.out = s.next();
    a.heads = coin() ? kI32Max : u(1, kI32Max);
    a.dq = u(1, 1u << 20);
    a.dv = u(1, 1u << 20);
    // k and v within their slots.
    a.seq_len = coin() ? 0 : u_fit(1, kU32Max, 4ull * a.heads * std::max(a.dq, a.dv));
    // k and v may be null without keys, g without the gate.
    a.k = a.seq_len == 0 && coin() ? DevicePtr{} : s.next();
    a.v = a.seq_len == 0 && coin() ? DevicePtr{} : s.next();
    a.use_gate = coin();
    a.g = !a.use_gate && coin() ? DevicePtr{} : s.next();
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const K3SdpaArgs& a) { k3_mla_sdpa_gate_f32(g, k, a); };
  d.expect = [kn](const K3SdpaArgs& a) {
    auto e = launch_of(kK3, kn, {a.heads, 1, 1}, {32, 1, 1});
    e.args = {{"q", P(a.q)},           {"k", P(a.k)},         {"v", P(a.v)},   {"g", P(a.g)},
              {"out", P(a.out)},       {"seq_len", U(a.seq_len)}, {"heads", U(a.heads)},
              {"dq", U(a.dq)},         {"dv", U(a.dv)},       {"use_gate", U(a.use_gate ? 1 : 0)}};
    return e;
  };
  using A = K3SdpaArgs;
  d.rules = {null_rule<A>(kn, "q", &A::q),
             null_rule<A>(kn, "out", &A::out),
             keys_null_rule<A>(kn, "k", &A::k),
             keys_null_rule<A>(kn, "v", &A::v),
             [kn](A& a) {
               a.use_gate = true;
               a.g = {};
               return BrokenRule{"g null with the gate", Errc::invalid_argument, {kn, "g is null"}};
             },
             zero_rule<A>(kn, "heads", &A::heads),
             zero_rule<A>(kn, "dq", &A::dq),
             zero_rule<A>(kn, "dv", &A::dv),
             over_rule<A>(kn, "heads", &A::heads, kI32Max)};
  return d;
}

// ---- k3_fast -----------------------------------------------------------------------------------------

// Rule: num_chunks not a positive multiple of 4 up to 4096.
template <class A>
std::function<BrokenRule(A&)> chunks_rule(const char* kn) {
  return [kn](A& a) {
    a.num_chunks = coin() ? u(kK3MaxChunks + 1, kU32Max) : 4 * u(0, kK3MaxChunks / 4) + u(1, 3);
    return BrokenRule{"num_chunks not a multiple of 4 up to 4096",
                      Errc::invalid_argument,
                      {kn, fmt::format("num_chunks {} is not a positive multiple of 4 up to 4096", a.num_chunks)}};
  };
}

Def<K3SdpaSplitArgs> k3_split() {
  const char* kn = "k3_mla_sdpa_split_f32";
  Def<K3SdpaSplitArgs> d{kK3Fast, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    K3SdpaSplitArgs a;
    a.q = s.next(), a.o_partial = s.next(), a.ml_partial = s.next();
    a.heads = coin() ? 65535 : u(1, 65535);
    a.dq = coin() ? kK3SplitMaxDim : u(1, kK3SplitMaxDim);
    a.dv = coin() ? kK3SplitMaxDim : u(1, kK3SplitMaxDim);
    a.num_chunks = 4 * u(1, kK3MaxChunks / 4);
    a.keys_per_chunk = u(1, (1u << 19) - 1);
    const std::uint32_t covered = a.num_chunks * a.keys_per_chunk;  // < 2^31 - 1
    a.seq_len = coin() ? 0 : coin() ? covered : u(1, covered);
    // k and v within their slots.
    a.seq_len = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(a.seq_len, kMaxExtent / (4ull * a.heads * std::max(a.dq, a.dv))));
    // k and v may be null without keys.
    a.k = a.seq_len == 0 && coin() ? DevicePtr{} : s.next();
    a.v = a.seq_len == 0 && coin() ? DevicePtr{} : s.next();
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const K3SdpaSplitArgs& a) { k3_mla_sdpa_split_f32(g, k, a); };
  d.expect = [kn](const K3SdpaSplitArgs& a) {
    auto e = launch_of(kK3Fast, kn, {a.num_chunks / 4, a.heads, 1}, {128, 1, 1});
    e.args = {{"q", P(a.q)},
              {"k", P(a.k)},
              {"v", P(a.v)},
              {"o_partial", P(a.o_partial)},
              {"ml_partial", P(a.ml_partial)},
              {"seq_len", U(a.seq_len)},
              {"heads", U(a.heads)},
              {"dq", U(a.dq)},
              {"dv", U(a.dv)},
              {"keys_per_chunk", U(a.keys_per_chunk)}};
    return e;
  };
  using A = K3SdpaSplitArgs;
  d.rules = {null_rule<A>(kn, "q", &A::q),
             null_rule<A>(kn, "o_partial", &A::o_partial),
             null_rule<A>(kn, "ml_partial", &A::ml_partial),
             keys_null_rule<A>(kn, "k", &A::k),
             keys_null_rule<A>(kn, "v", &A::v),
             zero_rule<A>(kn, "heads", &A::heads),
             zero_rule<A>(kn, "dq", &A::dq),
             zero_rule<A>(kn, "dv", &A::dv),
             zero_rule<A>(kn, "keys_per_chunk", &A::keys_per_chunk),
             over_rule<A>(kn, "dq", &A::dq, kK3SplitMaxDim),
             over_rule<A>(kn, "dv", &A::dv, kK3SplitMaxDim),
             over_rule<A>(kn, "heads", &A::heads, 65535),
             chunks_rule<A>(kn),
             [kn](A& a) {
               give_keys(a);
               const std::uint32_t covered = a.num_chunks * a.keys_per_chunk;
               a.seq_len = u(covered + 1, kI32Max);
               return BrokenRule{"chunks short of seq_len",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("num_chunks {} x keys_per_chunk {} covers fewer keys than seq_len {}",
                                                  a.num_chunks, a.keys_per_chunk, a.seq_len)}};
             },
             [kn](A& a) {
               give_keys(a);
               a.seq_len = u(kI32Max + 1u, kU32Max);
               return BrokenRule{"seq_len past 2^31 - 1",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("seq_len {} exceeds {}", a.seq_len, kI32Max)}};
             }};
  return d;
}

Def<K3SdpaCombineArgs> k3_combine() {
  const char* kn = "k3_mla_sdpa_combine_f32";
  Def<K3SdpaCombineArgs> d{kK3Fast, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    K3SdpaCombineArgs a;
    a.o_partial = s.next(), a.ml_partial = s.next(), a.out = s.next();
    a.use_gate = coin();
    a.g = !a.use_gate && coin() ? DevicePtr{} : s.next();  // g may be null without the gate
    a.heads = coin() ? kI32Max : u(1, kI32Max);
    a.num_chunks = 4 * u(1, kK3MaxChunks / 4);
    a.dv = u_fit(1, 1u << 20, 4ull * a.num_chunks * a.heads);  // o_partial within its slot
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const K3SdpaCombineArgs& a) { k3_mla_sdpa_combine_f32(g, k, a); };
  d.expect = [kn](const K3SdpaCombineArgs& a) {
    auto e = launch_of(kK3Fast, kn, {a.heads, div_ceil(a.dv, 32u), 1}, k256);
    e.args = {{"o_partial", P(a.o_partial)}, {"ml_partial", P(a.ml_partial)}, {"g", P(a.g)},
              {"out", P(a.out)},             {"heads", U(a.heads)},           {"dv", U(a.dv)},
              {"num_chunks", U(a.num_chunks)}, {"use_gate", U(a.use_gate ? 1 : 0)}};
    return e;
  };
  using A = K3SdpaCombineArgs;
  d.rules = {null_rule<A>(kn, "o_partial", &A::o_partial),
             null_rule<A>(kn, "ml_partial", &A::ml_partial),
             null_rule<A>(kn, "out", &A::out),
             [kn](A& a) {
               a.use_gate = true;
               a.g = {};
               return BrokenRule{"g null with the gate", Errc::invalid_argument, {kn, "g is null"}};
             },
             zero_rule<A>(kn, "heads", &A::heads),
             zero_rule<A>(kn, "dv", &A::dv),
             over_rule<A>(kn, "heads", &A::heads, kI32Max),
             over_rule<A>(kn, "dv", &A::dv, 65535 * 32),
             chunks_rule<A>(kn)};
  return d;
}

}  // namespace

std::vector<Launcher> fast_and_k3_launchers() {
  return {erase(gemv_wide()),
          erase(split_fp8(SplitDef::split)),
          erase(split_nvfp4(SplitDef::split)),
          erase(split_fp8(SplitDef::wgmma)),
          erase(split_nvfp4(SplitDef::wgmma)),
          erase(split_fp8(SplitDef::wgmma16)),
          erase(split_nvfp4(SplitDef::wgmma16)),
          erase(split_fp8(SplitDef::wgmma16_rs)),
          erase(split_nvfp4(SplitDef::wgmma16_rs)),
          erase(combine()),        erase(k3_rope()),          erase(k3_sdpa()),
          erase(k3_split()),        erase(k3_combine())};
}

}  // namespace metrale::props::defs
