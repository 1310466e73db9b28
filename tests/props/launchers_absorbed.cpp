// The launchers of module mla_absorbed (SPEC §3) as generic launcher definitions: valid
// sentinel arguments (boundaries included), the record they must produce, every rule.
#include <algorithm>
#include <cmath>

#include "arb.hpp"
#include "launcher_defs.hpp"
#include "metrale/launch.hpp"
#include "metrale/mla_absorbed.hpp"

namespace metrale::props::defs {

namespace {

constexpr Dim3 k256{256, 1, 1};
constexpr const char* kAbs = "mla_absorbed";

// ---- mla_batched_gemv ------------------------------------------------------------------

Def<BatchedGemvArgs> gemv() {
  const char* kn = "mla_batched_gemv";
  Def<BatchedGemvArgs> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    BatchedGemvArgs a{s.next(), s.next(), s.next()};
    a.n_out = u(1, 1u << 24);
    a.num_heads = coin() ? 65535 : u(1, 65535);
    a.k = u_fit(1, 1u << 24, 2ull * a.num_heads * a.n_out);  // the weights within their slot
    a.input_stride = u(0, kU32Max);
    a.output_stride = coin() ? a.n_out : u(a.n_out, kU32Max);  // == n_out: heads exactly abut
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const BatchedGemvArgs& a) { mla_batched_gemv(g, k, a); };
  d.expect = [kn](const BatchedGemvArgs& a) {
    auto e = launch_of(kAbs, kn, {div_ceil(a.n_out, 8u), a.num_heads, 1}, k256);
    e.args = {{"input", P(a.input)},   {"weight", P(a.weight)},           {"output", P(a.output)},
              {"n_out", U(a.n_out)},   {"k", U(a.k)},                     {"input_stride", U(a.input_stride)},
              {"output_stride", U(a.output_stride)}};
    return e;
  };
  using A = BatchedGemvArgs;
  d.rules = {null_rule<A>(kn, "input", &A::input),   null_rule<A>(kn, "weight", &A::weight),
             null_rule<A>(kn, "output", &A::output), zero_rule<A>(kn, "n_out", &A::n_out),
             zero_rule<A>(kn, "k", &A::k),           zero_rule<A>(kn, "num_heads", &A::num_heads),
             over_rule<A>(kn, "num_heads", &A::num_heads, 65535),
             [kn](A& a) {
               a.output_stride = u(0, a.n_out - 1);
               return BrokenRule{"output_stride < n_out",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("output_stride {} < n_out {}", a.output_stride, a.n_out)}};
             }};
  return d;
}

// ---- mla_q_rope_scatter / writeback ----------------------------------------------------

// `lhs + rope > total` by drawing a smaller total or an lhs so large that the 32-bit sum wraps.
BrokenRule sum_over(const char* kn, const char* lhs_name, std::uint32_t& lhs, std::uint32_t rope,
                    const char* total_name, std::uint32_t& total) {
  if (coin() && std::uint64_t{lhs} + rope > 0) {
    total = u(0, static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{lhs} + rope - 1, kU32Max)));
  } else {
    lhs = u(static_cast<std::uint32_t>(std::max<std::int64_t>(std::int64_t{total} - rope + 1, 0)), kU32Max);
  }
  return {fmt::format("{} + rope > {}", lhs_name, total_name),
          Errc::invalid_argument,
          {kn, fmt::format("{} {} + rope {} > {} {}", lhs_name, lhs, rope, total_name, total)}};
}

Def<QRopeScatterArgs> scatter() {
  const char* kn = "mla_q_rope_scatter";
  Def<QRopeScatterArgs> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    QRopeScatterArgs a{s.next(), s.next(), s.next()};
    a.nq = u(1, 1u << 24);
    a.nope = u(0, 1u << 20);
    a.rope = u(1, 1u << 20);
    a.hd = a.nope + a.rope + (coin() ? 0 : u(1, 1u << 20));  // == nope + rope: the boundary
    a.kv_lora = u(0, 1u << 20);
    a.mla_cache_dim = a.kv_lora + a.rope + (coin() ? 0 : u(1, 1u << 20));
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const QRopeScatterArgs& a) { mla_q_rope_scatter(g, k, a); };
  d.expect = [kn](const QRopeScatterArgs& a) {
    auto e = launch_of(kAbs, kn, {1, 1, 1}, k256);
    e.args = {{"q_full", P(a.q_full)},   {"q_absorbed_buf", P(a.q_absorbed_buf)},
              {"q_rope_contiguous", P(a.q_rope_contiguous)},
              {"nq", U(a.nq)},           {"hd", U(a.hd)},
              {"nope", U(a.nope)},       {"rope", U(a.rope)},
              {"kv_lora", U(a.kv_lora)}, {"mla_cache_dim", U(a.mla_cache_dim)}};
    return e;
  };
  using A = QRopeScatterArgs;
  d.rules = {null_rule<A>(kn, "q_full", &A::q_full),
             null_rule<A>(kn, "q_absorbed_buf", &A::q_absorbed_buf),
             null_rule<A>(kn, "q_rope_contiguous", &A::q_rope_contiguous),
             zero_rule<A>(kn, "nq", &A::nq),
             zero_rule<A>(kn, "rope", &A::rope),
             [kn](A& a) { return sum_over(kn, "nope", a.nope, a.rope, "hd", a.hd); },
             [kn](A& a) { return sum_over(kn, "kv_lora", a.kv_lora, a.rope, "mla_cache_dim", a.mla_cache_dim); }};
  return d;
}

Def<QRopeWritebackArgs> writeback() {
  const char* kn = "mla_q_rope_writeback";
  Def<QRopeWritebackArgs> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    QRopeWritebackArgs a{s.next(), s.next()};
    a.nq = u(1, 1u << 24);
    a.rope = u(1, 1u << 20);
    a.kv_lora = u(0, 1u << 20);
    a.mla_cache_dim = a.kv_lora + a.rope + (coin() ? 0 : u(1, 1u << 20));
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const QRopeWritebackArgs& a) { mla_q_rope_writeback(g, k, a); };
  d.expect = [kn](const QRopeWritebackArgs& a) {
    auto e = launch_of(kAbs, kn, {1, 1, 1}, k256);
    e.args = {{"q_rope_direct", P(a.q_rope_direct)},
              {"q_absorbed_buf", P(a.q_absorbed_buf)},
              {"nq", U(a.nq)},
              {"rope", U(a.rope)},
              {"kv_lora", U(a.kv_lora)},
              {"mla_cache_dim", U(a.mla_cache_dim)}};
    return e;
  };
  using A = QRopeWritebackArgs;
  d.rules = {null_rule<A>(kn, "q_rope_direct", &A::q_rope_direct),
             null_rule<A>(kn, "q_absorbed_buf", &A::q_absorbed_buf), zero_rule<A>(kn, "nq", &A::nq),
             zero_rule<A>(kn, "rope", &A::rope),
             [kn](A& a) { return sum_over(kn, "kv_lora", a.kv_lora, a.rope, "mla_cache_dim", a.mla_cache_dim); }};
  return d;
}

// ---- mla_cache_assemble ------------------------------------------------------------------

Def<CacheAssembleArgs> assemble() {
  const char* kn = "mla_cache_assemble";
  Def<CacheAssembleArgs> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    CacheAssembleArgs a{s.next(), s.next(), s.next(), s.next()};
    a.mla_cache_dim = coin() ? 1024 : u(1, 1024);
    a.kv_lora = u(1, a.mla_cache_dim);
    a.rope = coin() ? a.mla_cache_dim - a.kv_lora : u(0, a.mla_cache_dim - a.kv_lora);
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const CacheAssembleArgs& a) { mla_cache_assemble(g, k, a); };
  d.expect = [kn](const CacheAssembleArgs& a) {
    auto e = launch_of(kAbs, kn, {1, 1, 1}, {std::max(a.mla_cache_dim, 256u), 1, 1});
    e.args = {{"kv_latent", P(a.kv_latent)}, {"k_rope", P(a.k_rope)}, {"k_cache", P(a.k_cache)},
              {"v_cache", P(a.v_cache)},     {"kv_lora", U(a.kv_lora)}, {"rope", U(a.rope)},
              {"mla_cache_dim", U(a.mla_cache_dim)}};
    return e;
  };
  using A = CacheAssembleArgs;
  d.rules = {null_rule<A>(kn, "kv_latent", &A::kv_latent),
             null_rule<A>(kn, "k_rope", &A::k_rope),
             null_rule<A>(kn, "k_cache", &A::k_cache),
             null_rule<A>(kn, "v_cache", &A::v_cache),
             zero_rule<A>(kn, "kv_lora", &A::kv_lora),
             [kn](A& a) { return sum_over(kn, "kv_lora", a.kv_lora, a.rope, "mla_cache_dim", a.mla_cache_dim); },
             [kn](A& a) {
               a.mla_cache_dim = u(1025, kU32Max - a.kv_lora);  // the sum rule still holds
               a.rope = u(0, a.mla_cache_dim - a.kv_lora);
               return BrokenRule{"mla_cache_dim past 1024",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("mla_cache_dim {} exceeds 1024", a.mla_cache_dim)}};
             }};
  return d;
}

// ---- rope_pairs_bf16 ------------------------------------------------------------------------

Def<RopePairsArgs> rope() {
  const char* kn = "rope_pairs_bf16";
  Def<RopePairsArgs> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    Sentinels s;
    RopePairsArgs a{s.next()};
    a.rows = u(1, 1u << 24);
    a.rope = 2 * u(1, 1u << 10);
    a.pos = u(0, 1u << 24);  // FP32 holds positions exactly up to 2^24
    a.theta = positive_float();
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const RopePairsArgs& a) { rope_pairs_bf16(g, k, a); };
  d.expect = [kn](const RopePairsArgs& a) {
    const auto blocks = div_ceil<std::uint64_t>(std::uint64_t{a.rows} * (a.rope / 2), 256);
    auto e = launch_of(kAbs, kn, {static_cast<std::uint32_t>(blocks), 1, 1}, k256);
    e.args = {{"x", P(a.x)}, {"rows", U(a.rows)}, {"rope", U(a.rope)}, {"pos", U(a.pos)}, {"theta", F(a.theta)}};
    return e;
  };
  using A = RopePairsArgs;
  d.rules = {null_rule<A>(kn, "x", &A::x),
             zero_rule<A>(kn, "rows", &A::rows),
             zero_rule<A>(kn, "rope", &A::rope),
             [kn](A& a) {
               a.rope = 2 * u(0, 1u << 10) + 1;
               return BrokenRule{"odd rope", Errc::invalid_argument, {kn, fmt::format("rope {} is odd", a.rope)}};
             },
             scale_rule<A>(kn, "theta", &A::theta),
             [kn](A& a) {
               // theta^(−(rope − 2)/rope) past FP32 for a theta this small and rope ≥ 64, at any position.
               a.rope = 2 * u(32, 1u << 10);
               a.theta = *rc::gen::element(1e-40f, 1e-42f, 1e-45f);
               return BrokenRule{"theta's frequencies past FP32",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("theta {} overflows FP32's rotation angles", a.theta)}};
             },
             [kn](A& a) {
               // More pairs than a grid of 2^31 − 1 blocks of 256 threads covers.
               a.rows = u(1u << 31, kU32Max);
               a.rope = 2 * u(257, 1u << 20);
               return BrokenRule{"too many pairs", Errc::invalid_argument, {kn, "rows x rope / 2"}};
             },
             [kn](A& a) {
               a.pos = u((1u << 24) + 1, kU32Max);
               return BrokenRule{"a position past 2^24",
                                 Errc::invalid_argument,
                                 {kn, fmt::format("position {} is past 2^24", a.pos)}};
             }};
  return d;
}

// ---- paged decode ------------------------------------------------------------------------------

// The fields both formats share: q heads a multiple of 1..64 KV heads, q_head_dim ≤ kv_cache_dim ≤
// 1024 (`dim_step` apart: 16 for NVFP4 rows), table capacity within 2^31 − 1 keys.
void arb_common(PagedDecodeCommon& a, std::uint32_t dim_step) {
  Sentinels s;
  a.q = s.next(), a.k_cache = s.next(), a.v_cache = s.next(), a.o = s.next();
  a.block_tables = s.next(), a.seq_lens = s.next();
  a.num_kv_heads = u(1, 64);
  a.num_q_heads = a.num_kv_heads * u(1, 1u << 16);
  a.kv_cache_dim = coin() ? 1024 : dim_step * u(1, 1024 / dim_step);
  a.q_head_dim = coin() ? a.kv_cache_dim : u(1, a.kv_cache_dim);
  a.block_size = u(1, 1u << 12);
  a.max_blocks_per_seq = u(1, 1u << 12);
  a.inv_sqrt_d = finite_float();
  a.num_seqs = coin() ? 65535 : u(1, 65535);
}

std::vector<std::pair<std::string, KernelArg>> common_args(const PagedDecodeCommon& a) {
  return {{"q", P(a.q)},
          {"k_cache", P(a.k_cache)},
          {"v_cache", P(a.v_cache)},
          {"o", P(a.o)},
          {"block_tables", P(a.block_tables)},
          {"seq_lens", P(a.seq_lens)},
          {"max_blocks_per_seq", U(a.max_blocks_per_seq)},
          {"num_q_heads", U(a.num_q_heads)},
          {"num_kv_heads", U(a.num_kv_heads)},
          {"q_head_dim", U(a.q_head_dim)},
          {"kv_cache_dim", U(a.kv_cache_dim)},
          {"block_size", U(a.block_size)},
          {"inv_sqrt_d", F(a.inv_sqrt_d)}};
}

template <class A>
std::vector<std::function<BrokenRule(A&)>> common_rules(const char* kn) {
  return {
      null_rule<A>(kn, "q", &A::q),
      null_rule<A>(kn, "k_cache", &A::k_cache),
      null_rule<A>(kn, "v_cache", &A::v_cache),
      null_rule<A>(kn, "o", &A::o),
      null_rule<A>(kn, "block_tables", &A::block_tables),
      null_rule<A>(kn, "seq_lens", &A::seq_lens),
      zero_rule<A>(kn, "num_seqs", &A::num_seqs),
      zero_rule<A>(kn, "num_q_heads", &A::num_q_heads),
      zero_rule<A>(kn, "num_kv_heads", &A::num_kv_heads),
      zero_rule<A>(kn, "q_head_dim", &A::q_head_dim),
      zero_rule<A>(kn, "block_size", &A::block_size),
      zero_rule<A>(kn, "max_blocks_per_seq", &A::max_blocks_per_seq),
      over_rule<A>(kn, "num_seqs", &A::num_seqs, 65535),
      over_rule<A>(kn, "num_q_heads", &A::num_q_heads, kI32Max),
      [kn](A& a) {
        a.num_kv_heads = u(2, 64);
        a.num_q_heads = a.num_kv_heads * u(0, 1u << 16) + u(1, a.num_kv_heads - 1);
        return BrokenRule{"num_q_heads not a multiple of num_kv_heads",
                          Errc::invalid_argument,
                          {kn, fmt::format("num_q_heads {} is not a multiple of num_kv_heads {}", a.num_q_heads,
                                           a.num_kv_heads)}};
      },
      [kn](A& a) {
        a.q_head_dim = u(a.kv_cache_dim + 1, kU32Max);
        return BrokenRule{"q_head_dim > kv_cache_dim",
                          Errc::invalid_argument,
                          {kn, fmt::format("q_head_dim {} > kv_cache_dim {}", a.q_head_dim, a.kv_cache_dim)}};
      },
      [kn](A& a) {
        a.kv_cache_dim = u(kMaxKvCacheDim + 1, kU32Max);
        return BrokenRule{"kv_cache_dim past the kernel's limit",
                          Errc::unsupported,
                          {kn, fmt::format("kv_cache_dim {} exceeds the kernel's limit 1024", a.kv_cache_dim)}};
      },
      [kn](A& a) {
        a.inv_sqrt_d = non_finite_float();
        return BrokenRule{"inv_sqrt_d not finite",
                          Errc::invalid_argument,
                          {kn, fmt::format("inv_sqrt_d {} is not finite", a.inv_sqrt_d)}};
      },
      logit_scale_rule<A>(kn, "inv_sqrt_d", &A::inv_sqrt_d),
      [kn](A& a) {
        // Key indices are 32-bit: a table that could hold more keys than that.
        a.block_size = u(1u << 16, kU32Max);
        a.max_blocks_per_seq = u(static_cast<std::uint32_t>(0x8000'0000ull / a.block_size + 1), kU32Max);
        return BrokenRule{"table capacity past 2^31 - 1 keys",
                          Errc::invalid_argument,
                          {kn, fmt::format("max_blocks_per_seq {} x block_size {} keys exceed", a.max_blocks_per_seq,
                                           a.block_size)}};
      }};
}

Def<PagedDecodeNvfp4Args> decode_nvfp4() {
  const char* kn = "mla_paged_decode_nvfp4";
  Def<PagedDecodeNvfp4Args> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    PagedDecodeNvfp4Args a;
    arb_common(a, 16);
    const std::uint64_t width = std::uint64_t{a.num_kv_heads} * a.kv_cache_dim;
    a.data_section_bytes = a.block_size * width / 2 + (coin() ? 0 : u(1, 4096));
    a.block_stride_bytes = a.data_section_bytes + a.block_size * width / 16 + (coin() ? 0 : u(1, 4096));
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const PagedDecodeNvfp4Args& a) { mla_paged_decode_nvfp4(g, k, a); };
  d.expect = [kn](const PagedDecodeNvfp4Args& a) {
    auto e = launch_of(kAbs, kn, {a.num_q_heads, a.num_seqs, 1}, k256);
    e.args = common_args(a);
    e.args.emplace_back("block_stride_bytes", Q(a.block_stride_bytes));
    e.args.emplace_back("data_section_bytes", Q(a.data_section_bytes));
    return e;
  };
  using A = PagedDecodeNvfp4Args;
  d.rules = common_rules<A>(kn);
  d.rules.push_back([kn](A& a) {
    // One KV head of a width that is no multiple of 16 (still ≥ q_head_dim, ≤ 1024).
    a.num_q_heads /= a.num_kv_heads;
    a.num_kv_heads = 1;
    a.kv_cache_dim = std::min(1008u, a.kv_cache_dim / 16 * 16) + u(1, 15);
    a.q_head_dim = std::min(a.q_head_dim, a.kv_cache_dim);
    return BrokenRule{"row width not a multiple of 16",
                      Errc::invalid_argument,
                      {kn, fmt::format("row width {} is not a multiple of 16", a.kv_cache_dim)}};
  });
  d.rules.push_back([kn](A& a) {
    const std::uint64_t need = std::uint64_t{a.block_size} * a.num_kv_heads * a.kv_cache_dim / 2;
    a.data_section_bytes = u64(0, need - 1);
    return BrokenRule{"data section too small",
                      Errc::invalid_argument,
                      {kn, fmt::format("data_section_bytes {} < block_size {}", a.data_section_bytes, a.block_size)}};
  });
  d.rules.push_back([kn](A& a) {
    const std::uint64_t need =
        a.data_section_bytes + std::uint64_t{a.block_size} * a.num_kv_heads * a.kv_cache_dim / 16;
    a.block_stride_bytes = u64(0, need - 1);
    return BrokenRule{"block stride too small",
                      Errc::invalid_argument,
                      {kn, fmt::format("block_stride_bytes {} < data_section_bytes {}", a.block_stride_bytes,
                                       a.data_section_bytes)}};
  });
  d.rules.push_back([kn](A& a) {
    a.block_stride_bytes = u64(1ull << 32, ~0ull);
    return BrokenRule{"block stride past 2^32",
                      Errc::invalid_argument,
                      {kn, fmt::format("block_stride_bytes {} reaches 2^32", a.block_stride_bytes)}};
  });
  return d;
}

Def<PagedDecodeFp8Args> decode_fp8() {
  const char* kn = "mla_paged_decode_fp8";
  Def<PagedDecodeFp8Args> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    PagedDecodeFp8Args a;
    arb_common(a, 1);
    Sentinels s(0x80);  // after arb_common's
    a.k_scale = positive_float();
    a.v_scale = positive_float();
    const std::uint64_t width = std::uint64_t{a.num_kv_heads} * a.kv_cache_dim;
    a.cache_stride = width + (coin() ? 0 : u(1, 4096));  // block_size ≤ 2^12: offsets stay far below 2^32
    a.sliding_window = u(0, kU32Max);
    a.sinks = coin() ? s.next() : DevicePtr{};
    a.comp_pool = coin() ? s.next() : DevicePtr{};
    a.comp_block_count = u(0, 1u << 16);
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const PagedDecodeFp8Args& a) { mla_paged_decode_fp8(g, k, a); };
  d.expect = [kn](const PagedDecodeFp8Args& a) {
    auto e = launch_of(kAbs, kn, {a.num_q_heads, a.num_seqs, 1}, k256);
    e.args = common_args(a);
    e.args.insert(e.args.end(), {{"k_scale", F(a.k_scale)},
                                 {"v_scale", F(a.v_scale)},
                                 {"cache_stride", Q(a.cache_stride)},
                                 {"sliding_window", U(a.sliding_window)},
                                 {"sinks", P(a.sinks)},
                                 {"comp_pool", P(a.comp_pool)},
                                 {"comp_block_count", U(a.comp_block_count)}});
    return e;
  };
  using A = PagedDecodeFp8Args;
  d.rules = common_rules<A>(kn);
  d.rules.push_back(scale_rule<A>(kn, "k_scale", &A::k_scale));
  d.rules.push_back(scale_rule<A>(kn, "v_scale", &A::v_scale));
  d.rules.push_back(e4m3_scale_rule<A>(kn, "k_scale", &A::k_scale));
  d.rules.push_back(e4m3_scale_rule<A>(kn, "v_scale", &A::v_scale));
  d.rules.push_back([kn](A& a) {
    a.k_scale = arb_scale(1e20f, 1e30f);
    // From 0.7 of FP32's largest, the product times log2(e) (the wgmma kernels' base-2 logits) is past it.
    a.inv_sqrt_d = (coin() ? 1.0f : -1.0f) * std::numeric_limits<float>::max() / a.k_scale * arb_scale(0.7f, 1000.0f);
    return BrokenRule{"inv_sqrt_d x k_scale x log2(e) past FP32",
                      Errc::invalid_argument,
                      {kn, fmt::format("inv_sqrt_d {} times k_scale {} (the logit scale) times log2(e) is past "
                                       "FP32's range",
                                       a.inv_sqrt_d, a.k_scale)}};
  });
  d.rules.push_back([kn](A& a) {
    const std::uint64_t width = std::uint64_t{a.num_kv_heads} * a.kv_cache_dim;
    a.cache_stride = u64(0, width - 1);
    return BrokenRule{"cache_stride < row width",
                      Errc::invalid_argument,
                      {kn, fmt::format("cache_stride {} < row width {}", a.cache_stride, width)}};
  });
  d.rules.push_back([kn](A& a) {
    a.cache_stride = u64((1ull << 32) / a.block_size + 1, ~0ull);
    return BrokenRule{"block_size x cache_stride past 2^32",
                      Errc::invalid_argument,
                      {kn, fmt::format("block_size {} x cache_stride {} reaches 2^32", a.block_size, a.cache_stride)}};
  });
  d.rules.push_back([kn](A& a) {
    Sentinels s;
    a.comp_pool = s.next();
    a.comp_block_count = u(static_cast<std::uint32_t>(
                               std::max<std::int64_t>(0, 0x7FFF'FFFFll - std::int64_t{a.max_blocks_per_seq} * a.block_size + 1)),
                           kU32Max);
    return BrokenRule{"compressed entries past 2^31 - 1 keys",
                      Errc::invalid_argument,
                      {kn, fmt::format("comp_block_count {} with max_blocks_per_seq {}", a.comp_block_count,
                                       a.max_blocks_per_seq)}};
  });
  d.rules.push_back([kn](A& a) {
    // Entry offsets (s·C + c)·2·cache_stride past 2^62, every other rule kept: one-token blocks
    // allow a pitch near 2^32, and enough sequences and entries multiply it past 2^62.
    Sentinels s;
    a.comp_pool = s.next();
    a.block_size = 1;
    a.max_blocks_per_seq = u(1, 1u << 12);
    a.cache_stride = u64(1ull << 31, (1ull << 32) - 1);
    a.num_seqs = u(1u << 15, 65535);
    a.comp_block_count =
        static_cast<std::uint32_t>((1ull << 62) / (2 * std::uint64_t{a.num_seqs} * a.cache_stride) + u(1, 1000));
    return BrokenRule{"compressed entry offsets past 2^62",
                      Errc::invalid_argument,
                      {kn, fmt::format("num_seqs {} x comp_block_count {} x 2 x cache_stride {} reaches 2^62",
                                       a.num_seqs, a.comp_block_count, a.cache_stride)}};
  });
  return d;
}

// ---- paged cache stores ----------------------------------------------------------------------

template <class A>
void arb_store(A& a, std::uint32_t width_step) {
  Sentinels s;
  a.k_src = s.next(), a.v_src = s.next(), a.k_cache = s.next(), a.v_cache = s.next(), a.slot_mapping = s.next();
  a.num_tokens = coin() ? kI32Max : u(1, kI32Max);
  a.row_width = width_step * u(1, (1u << 16) / width_step);
  a.block_size = u(1, 1u << 12);
}

template <class A>
std::vector<std::pair<std::string, KernelArg>> store_args(const A& a) {
  return {{"k_src", P(a.k_src)},     {"v_src", P(a.v_src)},           {"k_cache", P(a.k_cache)},
          {"v_cache", P(a.v_cache)}, {"slot_mapping", P(a.slot_mapping)}, {"num_tokens", U(a.num_tokens)},
          {"row_width", U(a.row_width)}, {"block_size", U(a.block_size)}};
}

template <class A>
std::vector<std::function<BrokenRule(A&)>> store_rules(const char* kn) {
  return {null_rule<A>(kn, "k_src", &A::k_src),
          null_rule<A>(kn, "v_src", &A::v_src),
          null_rule<A>(kn, "k_cache", &A::k_cache),
          null_rule<A>(kn, "v_cache", &A::v_cache),
          null_rule<A>(kn, "slot_mapping", &A::slot_mapping),
          zero_rule<A>(kn, "num_tokens", &A::num_tokens),
          zero_rule<A>(kn, "row_width", &A::row_width),
          zero_rule<A>(kn, "block_size", &A::block_size),
          over_rule<A>(kn, "num_tokens", &A::num_tokens, kI32Max)};
}

Def<CacheStoreFp8Args> store_fp8() {
  const char* kn = "mla_paged_cache_store_fp8";
  Def<CacheStoreFp8Args> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    CacheStoreFp8Args a;
    arb_store(a, 1);
    a.cache_stride = a.row_width + (coin() ? 0 : u(1, 4096));
    a.k_scale = positive_float();
    a.v_scale = positive_float();
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const CacheStoreFp8Args& a) { mla_paged_cache_store_fp8(g, k, a); };
  d.expect = [kn](const CacheStoreFp8Args& a) {
    auto e = launch_of(kAbs, kn, {a.num_tokens, 1, 1}, k256);
    e.args = store_args(a);
    e.args.insert(e.args.end(),
                  {{"cache_stride", Q(a.cache_stride)}, {"k_scale", F(a.k_scale)}, {"v_scale", F(a.v_scale)}});
    return e;
  };
  using A = CacheStoreFp8Args;
  d.rules = store_rules<A>(kn);
  d.rules.push_back([kn](A& a) {
    a.cache_stride = u64(0, a.row_width - 1);
    return BrokenRule{"cache_stride < row_width",
                      Errc::invalid_argument,
                      {kn, fmt::format("cache_stride {} < row_width {}", a.cache_stride, a.row_width)}};
  });
  d.rules.push_back([kn](A& a) {
    a.cache_stride = u64((1ull << 32) / a.block_size + 1, ~0ull);
    return BrokenRule{"block_size x cache_stride past 2^32",
                      Errc::invalid_argument,
                      {kn, fmt::format("block_size {} x cache_stride {} reaches 2^32", a.block_size, a.cache_stride)}};
  });
  d.rules.push_back(scale_rule<A>(kn, "k_scale", &A::k_scale));
  d.rules.push_back(scale_rule<A>(kn, "v_scale", &A::v_scale));
  return d;
}

Def<CacheStoreNvfp4Args> store_nvfp4() {
  const char* kn = "mla_paged_cache_store_nvfp4";
  Def<CacheStoreNvfp4Args> d{kAbs, kn, {}, {}, {}, {}};
  d.arb = [] {
    CacheStoreNvfp4Args a;
    arb_store(a, 16);
    a.data_section_bytes = std::uint64_t{a.block_size} * a.row_width / 2 + (coin() ? 0 : u(1, 4096));
    a.block_stride_bytes = a.data_section_bytes + std::uint64_t{a.block_size} * a.row_width / 16 +
                           (coin() ? 0 : u(1, 4096));
    return a;
  };
  d.launch = [](GpuBackend& g, KernelHandle k, const CacheStoreNvfp4Args& a) {
    mla_paged_cache_store_nvfp4(g, k, a);
  };
  d.expect = [kn](const CacheStoreNvfp4Args& a) {
    auto e = launch_of(kAbs, kn, {a.num_tokens, 1, 1}, k256);
    e.args = store_args(a);
    e.args.insert(e.args.end(), {{"block_stride_bytes", Q(a.block_stride_bytes)},
                                 {"data_section_bytes", Q(a.data_section_bytes)}});
    return e;
  };
  using A = CacheStoreNvfp4Args;
  d.rules = store_rules<A>(kn);
  d.rules.push_back([kn](A& a) {
    a.row_width = 16 * u(0, 4096) + u(1, 15);
    return BrokenRule{"row width not a multiple of 16",
                      Errc::invalid_argument,
                      {kn, fmt::format("row width {} is not a multiple of 16", a.row_width)}};
  });
  d.rules.push_back([kn](A& a) {
    a.data_section_bytes = u64(0, std::uint64_t{a.block_size} * a.row_width / 2 - 1);
    return BrokenRule{"data section too small",
                      Errc::invalid_argument,
                      {kn, fmt::format("data_section_bytes {} < block_size {}", a.data_section_bytes, a.block_size)}};
  });
  d.rules.push_back([kn](A& a) {
    a.block_stride_bytes = u64(0, a.data_section_bytes + std::uint64_t{a.block_size} * a.row_width / 16 - 1);
    return BrokenRule{"block stride too small",
                      Errc::invalid_argument,
                      {kn, fmt::format("block_stride_bytes {} < data_section_bytes {}", a.block_stride_bytes,
                                       a.data_section_bytes)}};
  });
  d.rules.push_back([kn](A& a) {
    a.block_stride_bytes = u64(1ull << 32, ~0ull);
    return BrokenRule{"block stride past 2^32",
                      Errc::invalid_argument,
                      {kn, fmt::format("block_stride_bytes {} reaches 2^32", a.block_stride_bytes)}};
  });
  return d;
}

}  // namespace

std::vector<Launcher> absorbed_launchers() {
  return {erase(gemv()),         erase(scatter()),      erase(writeback()), erase(assemble()), erase(rope()),
          erase(decode_nvfp4()), erase(decode_fp8()),   erase(store_fp8()), erase(store_nvfp4())};
}

}  // namespace metrale::props::defs
