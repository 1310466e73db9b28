// Module mla_fast: the split path and the wide GEMV against the float64 reference and against
// their ports on every available backend, the plan, the dispatchers' choice, and the edges
// where the two decode paths must agree with the seed kernel (NaN sinks, empty sequences).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include "metrale/case_gen.hpp"
#include "metrale/formats.hpp"
#include "metrale/launch.hpp"
#include "metrale/mla_fast.hpp"
#include "support.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

using namespace metrale;

TEST_CASE("the split path matches the float64 reference", "[mla_fast][split]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);  // Catch2 2: generators before sections
  p.q_head_dim = 64, p.kv_cache_dim = 128, p.block_size = 4, p.max_blocks_per_seq = 20, p.num_blocks = 80;
  SECTION("model rows, 16 heads, 300 keys over permuted blocks") {
    p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 16, p.block_size = 16, p.num_seqs = 2;
    p.seq_lens = {300, 17}, p.inv_sqrt_d = 1.0f / std::sqrt(192.0f), p.k_scale = 0.013f, p.v_scale = 0.021f;
  }
  SECTION("odd head count, empty and block-edge sequences, garbage columns") {
    p.num_q_heads = 19, p.num_seqs = 5, p.seq_lens = {0, 1, 4, 5, 33},
    p.fill = std::numeric_limits<std::int32_t>::max();
  }
  SECTION("128 heads: two groups of 64") { p.num_q_heads = 128, p.seq_lens = {70}; }
  // The kernel's MMA takes Q as FP16 (range ±65504, normals from 2^-14), each row scaled by a
  // power of two: unscaled, the first would overflow to inf and the second flush to zeros (a
  // uniform softmax), both far outside the tolerance. The logits are the usual ones.
  SECTION("Q beyond FP16's range") { p.num_q_heads = 20, p.seq_lens = {70}, p.q_range = 0x1p40f, p.inv_sqrt_d = 0x1p-43f; }
  SECTION("Q below FP16's normals") {
    p.num_q_heads = 20, p.seq_lens = {70}, p.q_range = 0x1p-40f, p.inv_sqrt_d = 0x1p37f;
  }
  // Q near FP32's top under a small logit scale, whose logits are finite (the seed kernel's): the
  // row's unscale factor (2^105 here) times the scale first, then the dot product, which alone
  // times 2^105 overflowed to inf and made o NaN (the adversarial trial, forty-sixth session).
  SECTION("Q near FP32's range, a small logit scale") {
    p.num_q_heads = 20, p.seq_lens = {70}, p.q_range = 1e36f, p.inv_sqrt_d = 1e-36f, p.k_scale = 1e-3f;
  }
  // Q near FP32's top under a large logit scale, K all zeros: every logit is 0 (the seed's, and
  // the reference's uniform softmax), but the row's unscale factor (2^112) times the scale passes
  // FP32, and inf × 0 had made o NaN; the factor is now held at FP32's largest value.
  SECTION("Q near FP32's range, a logit scale past it, K zero") {
    p.num_q_heads = 20, p.seq_lens = {70}, p.q_range = 1e38f, p.inv_sqrt_d = 1e6f, p.k_scale = 1.0f, p.zero_k = true;
  }
  SECTION("window, sinks and compressed entries") {
    p.num_q_heads = 4, p.num_seqs = 3, p.seq_lens = {60, 5, 0}, p.sliding_window = 9, p.sinks = true;
    p.comp_pool = true, p.comp_block_count = 3;
  }
  if (p.format == KvFormat::nvfp4) p.sliding_window = 0, p.sinks = false, p.comp_pool = false;
  test::check_case(gen::split_path_case(p));
}

// The raw kernels against their own references: the partials of each chunk (both split entries)
// and the combine of random partials, empty chunks included.
TEST_CASE("the raw split kernels' partials match the float64 reference", "[mla_fast][split]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  const bool sixteen = GENERATE(false, true);
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 16, p.block_size = 16, p.num_seqs = 3;
  p.max_blocks_per_seq = 10, p.num_blocks = 40, p.seq_lens = {150, 0, 33}, p.k_scale = 0.013f;
  SECTION("model rows") {}
  SECTION("small rows, odd heads, window and compressed entries") {
    p.q_head_dim = 32, p.kv_cache_dim = 64, p.num_q_heads = sixteen ? 16 : 37, p.block_size = 5;
    p.max_blocks_per_seq = 20, p.seq_lens = {99, 1, 64};
    if (p.format == KvFormat::fp8) p.sliding_window = 40, p.comp_pool = true, p.comp_block_count = 2;
  }
  const gen::SplitEntry entry = sixteen ? gen::SplitEntry::split16 : gen::SplitEntry::split;
  test::check_case(gen::split_kernel_case(p, GENERATE(1u, 3u), entry));
}

// The wgmma entries (module mla_wgmma: the emulator's port everywhere, the sm_90a kernels on an
// H100/H200): DeepSeek's rows; 64-head blocks with a second head group mostly empty, and the
// warp-specialised 16-head blocks (transposed products) and the staged one-warpgroup 16-head
// blocks (register operands, permuted contraction), a group full or short; chunks that end
// inside a tile. The staged blocks' pages hold 7 keys, so that their bulk copies of runs of
// rows break inside a warp's keys, not only at its ends.
TEST_CASE("the wgmma entries' partials match the float64 reference", "[mla_fast][wgmma]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  const auto [entry, heads] = GENERATE(table<gen::SplitEntry, std::uint32_t>({{gen::SplitEntry::wgmma, 40},
                                                                             {gen::SplitEntry::wgmma, 128},
                                                                             {gen::SplitEntry::wgmma16, 16},
                                                                             {gen::SplitEntry::wgmma16, 5},
                                                                             {gen::SplitEntry::wgmma16_rs, 16},
                                                                             {gen::SplitEntry::wgmma16_rs, 5}}));
  const bool staged = entry == gen::SplitEntry::wgmma16_rs;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = staged ? 7 : 16, p.num_seqs = 3;
  p.max_blocks_per_seq = staged ? 23 : 10, p.num_blocks = staged ? 80 : 40, p.seq_lens = {150, 0, 65};
  p.k_scale = 0.013f, p.fill = -1;
  if (p.format == KvFormat::fp8) p.sliding_window = 100, p.comp_pool = true, p.comp_block_count = 3;
  test::check_case(gen::split_kernel_case(p, GENERATE(1u, 3u), entry));
}

// Every raw split entry with K all zeros (a compressed pool's too) under a Q row near FP32's top
// and a logit scale, of either sign, whose product with the row's unscale factor (2^112) passes
// FP32: the logits stay 0 (a uniform softmax, as in the seed kernel and the reference) where
// ±inf × 0 had made them NaN.
TEST_CASE("every split entry keeps a zero K's logits 0 under a scale past FP32", "[mla_fast][wgmma]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  const auto [entry, heads] = GENERATE(table<gen::SplitEntry, std::uint32_t>({{gen::SplitEntry::split, 20},
                                                                              {gen::SplitEntry::split16, 16},
                                                                              {gen::SplitEntry::wgmma, 128},
                                                                              {gen::SplitEntry::wgmma16, 16},
                                                                              {gen::SplitEntry::wgmma16_rs, 16},
                                                                              {gen::SplitEntry::wgmma_latent, 70}}));
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 16, p.num_seqs = 2;
  p.max_blocks_per_seq = 10, p.num_blocks = 20, p.seq_lens = {150, 65}, p.q_range = 1e38f;
  p.inv_sqrt_d = GENERATE(1e6f, -1e6f);  // the launchers take a negative scale: −inf × 0 was NaN too
  p.k_scale = 1.0f, p.zero_k = true, p.latent = entry == gen::SplitEntry::wgmma_latent;
  // a compressed pool's K rows zeroed too (FP8 only; none over one latent pool)
  if (p.format == KvFormat::fp8 && !p.latent) p.comp_pool = true, p.comp_block_count = 2;
  const KernelCase c = gen::split_kernel_case(p, 2, entry);
  test::check_case(c);
}

// The FP8 entries' online softmax over logits that rise along the keys (PagedSpec::key_ramp): up
// to about 6 natural-log units a tile for heads with q[0] near 1, falling for q[0] < 0, so the
// 64-head block's lazy rescale moves some heads' maxima after the first tile while others stay;
// chunks of one and three tiles, some ending inside a tile, and one without keys.
TEST_CASE("the wgmma entries' partials follow logits that rise along the keys", "[mla_fast][wgmma]") {
  gen::PagedSpec p;
  const auto [entry, heads] = GENERATE(table<gen::SplitEntry, std::uint32_t>(
      {{gen::SplitEntry::wgmma, 40}, {gen::SplitEntry::wgmma, 128}, {gen::SplitEntry::wgmma16_rs, 16}}));
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 16, p.num_seqs = 3;
  p.max_blocks_per_seq = 21, p.num_blocks = 64, p.seq_lens = {330, 0, 201}, p.fill = -1;
  p.k_scale = 0.5f, p.v_scale = 0.021f, p.key_ramp = 2.0f;
  const KernelCase c = gen::split_kernel_case(p, GENERATE(1u, 3u), entry);
  // The ramp is in the inputs: dim 0 of position 300 of sequence 0 saturates at 448.
  const auto k = c.inputs.at("k_cache").values<std::uint8_t>();
  const auto tables = c.inputs.at("block_tables").values<std::int32_t>();
  CHECK(e4m3_decode(k[static_cast<std::size_t>(tables[300 / 16] * 16 + 300 % 16) * 576]) == 448.0f);
  CHECK(e4m3_decode(k[static_cast<std::size_t>(tables[10 / 16] * 16 + 10 % 16) * 576]) == 20.0f);
  test::check_case(c);
}

// The FP8 wgmma entries that combine inside their clusters (16-head staged, 64-head): o against
// the float64 reference (and the device's against the emulator's), the heads of one group or of
// two (the second short), chunks without keys and one to eight chunks per cluster.
gen::PagedSpec fused_spec(std::uint32_t heads, std::uint32_t max_blocks) {
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 16, p.num_seqs = 3;
  p.max_blocks_per_seq = max_blocks, p.num_blocks = 3 * max_blocks, p.seq_lens = {150, 0, 65}, p.fill = -1;
  p.k_scale = 0.013f, p.v_scale = 0.021f, p.sliding_window = 100, p.comp_pool = true, p.comp_block_count = 3;
  p.sinks = true;
  return p;
}

// Case `c`'s inputs on `gpu`, one buffer each, by parameter name.
std::map<std::string, DeviceBuffer> upload_inputs(GpuBackend& gpu, const KernelCase& c) {
  std::map<std::string, DeviceBuffer> in;
  for (const auto& [param, t] : c.inputs) in.emplace(param, DeviceBuffer::from_host<std::byte>(gpu, t.data));
  return in;
}

// A cluster entry's o (`fused` launches it into in["o"]) against its unfused entry's partials
// (`split` launches it into the partials given) through mla_paged_decode_combine with `sinks` and
// `v_scale`: the same bits, and no NaN. 3 sequences of `heads` heads in `splits` chunks; `in`
// holds case `c`'s inputs, whose o (NaN) is uploaded again between the two.
void check_fused_bits(GpuBackend& gpu, const MlaFastKernels& fast, const KernelCase& c,
                      const std::map<std::string, DeviceBuffer>& in, std::uint32_t heads, std::uint32_t splits,
                      DevicePtr sinks, float v_scale, const std::function<void()>& fused,
                      const std::function<void(DevicePtr, DevicePtr)>& split) {
  const DevicePtr o = in.at("o").ptr();
  fused();
  gpu.synchronize(0);
  const auto one = in.at("o").to_host<Bf16>();
  DeviceBuffer partials(gpu, std::size_t{3} * heads * splits * 576 * 4), ml(gpu, std::size_t{3} * heads * splits * 8);
  upload<std::byte>(gpu, c.inputs.at("o").data, o);  // NaN again
  split(partials.ptr(), ml.ptr());
  mla_paged_decode_combine(gpu, fast.combine, {partials.ptr(), ml.ptr(), sinks, o, heads, 576, splits, v_scale, 3});
  gpu.synchronize(0);
  const auto two = in.at("o").to_host<Bf16>();
  REQUIRE(one.size() == two.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < one.size(); ++i) differ += one[i].bits != two[i].bits;
  CHECK(differ == 0);
  CHECK(std::none_of(one.begin(), one.end(), [](Bf16 x) { return std::isnan(x.to_float()); }));
}

TEST_CASE("the wgmma entries that combine in their clusters match the float64 reference", "[mla_fast][wgmma]") {
  const auto [heads, max_blocks, tiles] = GENERATE(
      table<std::uint32_t, std::uint32_t, std::uint32_t>({{16, 10, 1},
                                                          {5, 10, 3},
                                                          {20, 10, 1},
                                                          {16, 27, 1},  // 4, 2, 4 and 8 chunks of a cluster
                                                          {64, 10, 3},
                                                          {70, 10, 1},
                                                          {40, 27, 1},
                                                          {128, 4, 2}}));  // 64-head blocks: 2, 4, 8 and 2 chunks
  gen::PagedSpec p = fused_spec(heads, max_blocks);
  p.sinks = heads != 5;
  test::check_case(gen::fused_decode_case(p, tiles));
}

#ifdef METRALE_WITH_CUDA
// On a GPU, under each of METRALE_CUDA_CLUSTER_POLICY's placements (CudaBackend::cluster_policy):
// the backend takes the placement, the occupancy count the plans read is a real one (at least
// one cluster, no more than two blocks an SM), and the 16-head entry in clusters of 4, 2, 4 and
// 8 chunks still matches the float64 reference.
TEST_CASE("each cluster placement runs the clustered entries and counts their clusters", "[mla_fast][wgmma]") {
  if (!CudaBackend::available()) {
    WARN("no GPU here: " << CudaBackend::unavailable_reason());
    return;
  }
  gen::PagedSpec p = fused_spec(16, 27);
  p.sinks = true;
  const KernelCase c = gen::fused_decode_case(p, 1);
  // The variable as this test found it, whatever the test does (the backend reads it when made).
  struct KeepVariable {
    const char* name = "METRALE_CUDA_CLUSTER_POLICY";
    std::optional<std::string> value = std::getenv(name) ? std::optional<std::string>(std::getenv(name)) : std::nullopt;
    ~KeepVariable() { value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name); }
  } keep;
  for (const char* policy : {"balance", "spread", "default"}) {
    INFO("placement " << policy);
    ::setenv(keep.name, policy, 1);
    CudaBackend gpu;
    CHECK(gpu.cluster_policy() == policy);
    const auto fast = MlaFastKernels::resolve(gpu);
    if (fast.wgmma16_rs_combine_fp8.id == 0) continue;  // not sm_90
    for (std::uint32_t n = 1; n <= 8; ++n) {
      INFO(n << " blocks a cluster: " << fast.fused_clusters[n] << " at once");
      CHECK(fast.fused_clusters[n] >= 1);
      CHECK(fast.fused_clusters[n] * n <= 2 * gpu.multiprocessor_count());
    }
    test::check_expected(gpu, c);
  }
}
#endif

// Their o must be the bits of the unfused entry's partials through the combine, on every backend:
// the 16-head and 64-head blocks over two pools and compressed entries, the heads-in-M block over
// one latent pool.
TEST_CASE("the wgmma entries that combine in their clusters give the combine's bits", "[mla_fast][wgmma]") {
  const auto [heads, in_m] = GENERATE(table<std::uint32_t, bool>({{20, false}, {70, false}, {70, true}}));
  const std::uint32_t rows = heads > 32 ? 64 : 16;
  gen::PagedSpec spec = fused_spec(heads, 27);
  if (in_m) spec.latent = true, spec.comp_pool = false, spec.comp_block_count = 0;
  const KernelCase c = gen::fused_decode_case(spec, 1, in_m);
  for (const auto& name : test::backends()) {
    INFO("backend " << name << ", " << heads << " heads" << (in_m ? ", heads in M" : ""));
    auto gpu = test::make_backend(name);
    const auto fast = MlaFastKernels::resolve(*gpu);
    if (fast.wgmma16_rs_combine_fp8.id == 0) continue;  // not sm_90
    const std::map<std::string, DeviceBuffer> in = upload_inputs(*gpu, c);
    const auto u32 = [&](const char* n) { return c.scalars.at(n).as_u32(); };
    const DevicePtr k_cache = in.at("k_cache").ptr();
    SplitDecodeFp8Args s{{in.at("q").ptr(),
                          k_cache,
                          in_m ? k_cache : in.at("v_cache").ptr(),
                          {},
                          {},
                          in.at("block_tables").ptr(),
                          in.at("seq_lens").ptr(),
                          u32("max_blocks_per_seq"),
                          heads,
                          576,
                          576,
                          16,
                          c.scalars.at("logit_scale").as_f32(),
                          u32("keys_per_split"),
                          3,
                          u32("num_splits"),
                          rows,
                          true},
                         c.scalars.at("cache_stride").as_u64(),
                         u32("sliding_window"),
                         in.count("comp_pool") != 0 ? in.at("comp_pool").ptr() : DevicePtr{},
                         u32("comp_block_count")};
    REQUIRE(s.num_splits == 8);
    const float v_scale = c.scalars.at("v_scale").as_f32();
    const FusedDecodeFp8Args f{s, in.at("sinks").ptr(), in.at("o").ptr(), v_scale};
    check_fused_bits(
        *gpu, fast, c, in, heads, 8, f.sinks, v_scale,
        [&] {
          if (in_m) {
            mla_paged_decode_wgmma_latent_combine_fp8(*gpu, fast.wgmma_latent_combine_fp8, f);
          } else if (rows == 64) {
            mla_paged_decode_wgmma_combine_fp8(*gpu, fast.wgmma_combine_fp8, f);
          } else {
            mla_paged_decode_wgmma16_rs_combine_fp8(*gpu, fast.wgmma16_rs_combine_fp8, f);
          }
        },
        [&](DevicePtr o_partial, DevicePtr ml_partial) {
          s.o_partial = o_partial, s.ml_partial = ml_partial;
          mla_paged_decode_wgmma_fp8(*gpu,
                                     in_m         ? fast.wgmma_latent_fp8
                                     : rows == 64 ? fast.wgmma_fp8
                                                  : fast.wgmma16_rs_fp8,
                                     s);
        });
  }
}

// One latent pool passed as both caches (v_cache = k_cache: FlashMLA's layout, V = K row for row).
// The FP8 staged 16-head blocks then copy each key's row once and read it for both products from
// a ring of two slots, the 64-head blocks from their K slots; with compressed entries (their V
// rows follow their K rows) they walk as with two pools. Against the float64 reference on every
// backend, and bit for bit against the same case with V a copy of the pool (a 64-head block of
// five tiles wraps its two slots twice). Pages of 7 keys break the copies' runs inside a warp;
// the logits rise along the keys, so the maxima move from tile to tile. The heads-in-M entries
// (mla_paged_decode_wgmma_latent_fp8, and mla_paged_decode_wgmma_latent_combine_fp8 with the
// combine in its clusters) read V from the K rows: the same case with a copied V pool is refused.
TEST_CASE("one latent pool as both caches matches the reference and a copied V pool's bits",
          "[mla_fast][wgmma][latent]") {
  enum Kind { staged, wide, heads_in_m, fused, fused_in_m, path };
  const auto [kind, heads, tiles, comp] =
      GENERATE(table<Kind, std::uint32_t, std::uint32_t, bool>({{staged, 16, 1, false},
                                                                {staged, 5, 3, false},
                                                                {staged, 16, 1, true},
                                                                {wide, 40, 1, false},
                                                                {wide, 128, 3, false},
                                                                {wide, 64, 5, false},
                                                                {wide, 70, 1, true},
                                                                {heads_in_m, 40, 1, false},
                                                                {heads_in_m, 128, 3, false},
                                                                {heads_in_m, 64, 5, false},
                                                                {heads_in_m, 70, 2, false},
                                                                {fused, 16, 1, false},
                                                                {fused, 20, 3, false},
                                                                {fused, 40, 1, false},
                                                                {fused_in_m, 40, 1, false},
                                                                {fused_in_m, 128, 2, false},
                                                                {fused_in_m, 70, 1, false},
                                                                {path, 16, 1, false},
                                                                {path, 70, 1, false}}));
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 7, p.num_seqs = 3;
  p.max_blocks_per_seq = 47, p.num_blocks = 150, p.seq_lens = {320, 0, 130}, p.fill = -1;
  p.k_scale = 0.5f, p.v_scale = 0.021f, p.key_ramp = 2.0f, p.sliding_window = 300, p.sinks = kind != staged;
  p.comp_pool = comp, p.comp_block_count = comp ? 3 : 0, p.latent = true;
  // The split path of 64-head blocks over a table of 4200 keys: the dispatcher's heads-in-M entry.
  const bool path_in_m = kind == path && heads > 32;
  if (path_in_m) p.max_blocks_per_seq = 600;
  const KernelCase c = kind == staged       ? gen::split_kernel_case(p, tiles, gen::SplitEntry::wgmma16_rs)
                       : kind == wide       ? gen::split_kernel_case(p, tiles, gen::SplitEntry::wgmma)
                       : kind == heads_in_m ? gen::split_kernel_case(p, tiles, gen::SplitEntry::wgmma_latent)
                       : kind == fused      ? gen::fused_decode_case(p, tiles)
                       : kind == fused_in_m ? gen::fused_decode_case(p, tiles, true)
                                            : gen::split_path_case(p);
  REQUIRE(c.aliases.at("v_cache") == "k_cache");
  REQUIRE(c.inputs.count("v_cache") == 0);
  test::check_case(c);
  KernelCase copied = c;
  copied.aliases.clear();
  copied.inputs["v_cache"] = c.inputs.at("k_cache");
  for (const auto& name : test::backends()) {
    INFO("backend " << name << ", case " << c.name);
    auto gpu = test::make_backend(name);
    if (entry_unavailable(*gpu, c.module, c.entry)) continue;
    if (path_in_m) continue;   // with a copied V pool the dispatcher takes another entry: other bits
    if (kind == heads_in_m || kind == fused_in_m) {  // reads V from the K rows: another V pool is refused
      test::require_error([&] { run_kernel_case(*gpu, copied); }, Errc::invalid_argument, {c.entry, "is not k_cache"});
      continue;
    }
    const auto one = run_kernel_case(*gpu, c), two = run_kernel_case(*gpu, copied);
    for (const auto& [param, want] : c.expected) {
      INFO(param);
      CHECK(one.at(param).data == two.at(param).data);
    }
  }
}

// NVFP4 over one latent pool (v_cache = k_cache): mla_paged_decode_wgmma_latent_nvfp4, the
// heads-in-M block, against the float64 reference on every backend — head groups full and short,
// chunks of one to five tiles, one ending inside a tile, pages of 7 keys, logits rising along the
// keys — and refusing a copied V pool; and the dispatcher's path over a table of 4200 keys, which
// runs it (then the combine) where the pools are one and the register-operand block where they are
// two.
TEST_CASE("NVFP4 over one latent pool runs on the heads-in-M block", "[mla_fast][wgmma][latent][nvfp4]") {
  const auto [heads, tiles] = GENERATE(table<std::uint32_t, std::uint32_t>({{40, 1}, {128, 3}, {64, 5}, {70, 2}}));
  gen::PagedSpec p;
  p.format = KvFormat::nvfp4, p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 7;
  p.num_seqs = 3, p.max_blocks_per_seq = 47, p.num_blocks = 150, p.seq_lens = {320, 0, 130}, p.fill = -1;
  p.key_ramp = 2.0f, p.latent = true;
  const KernelCase c = gen::split_kernel_case(p, tiles, gen::SplitEntry::wgmma_latent);
  REQUIRE(c.entry == "mla_paged_decode_wgmma_latent_nvfp4");
  REQUIRE(c.aliases.at("v_cache") == "k_cache");
  test::check_case(c);
  KernelCase copied = c;
  copied.aliases.clear();
  copied.inputs["v_cache"] = c.inputs.at("k_cache");
  for (const auto& name : test::backends()) {
    INFO("backend " << name);
    auto gpu = test::make_backend(name);
    if (entry_unavailable(*gpu, c.module, c.entry)) continue;
    test::require_error([&] { run_kernel_case(*gpu, copied); }, Errc::invalid_argument, {c.entry, "is not k_cache"});
  }
}

// mla_paged_decode_wgmma_latent_combine_nvfp4, the same block with the combine in its clusters:
// against the float64 reference (with and without sinks, 2 to 8 chunks a cluster, the last
// without keys), and bit for bit against mla_paged_decode_wgmma_latent_nvfp4's partials through
// the combine on every backend.
TEST_CASE("the NVFP4 heads-in-M entry in clusters matches the reference and the combine's bits",
          "[mla_fast][wgmma][latent][nvfp4]") {
  const auto [heads, max_blocks, sinks] =
      GENERATE(table<std::uint32_t, std::uint32_t, bool>({{40, 10, true}, {70, 27, false}, {128, 27, true}}));
  gen::PagedSpec p;
  p.format = KvFormat::nvfp4, p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 16;
  p.num_seqs = 3, p.max_blocks_per_seq = max_blocks, p.num_blocks = 3 * max_blocks, p.seq_lens = {150, 0, 65};
  p.fill = -1, p.key_ramp = 2.0f, p.latent = true, p.sinks = sinks;
  const KernelCase c = gen::fused_decode_case(p, 1, true);
  REQUIRE(c.entry == "mla_paged_decode_wgmma_latent_combine_nvfp4");
  test::check_case(c);
  for (const auto& name : test::backends()) {
    INFO("backend " << name << ", " << heads << " heads");
    auto gpu = test::make_backend(name);
    const auto fast = MlaFastKernels::resolve(*gpu);
    if (fast.wgmma_latent_combine_nvfp4.id == 0) continue;  // not sm_90
    const std::map<std::string, DeviceBuffer> in = upload_inputs(*gpu, c);
    const auto u32 = [&](const char* n) { return c.scalars.at(n).as_u32(); };
    const std::uint32_t splits = u32("num_splits");
    const DevicePtr pool = in.at("k_cache").ptr(), sink = sinks ? in.at("sinks").ptr() : DevicePtr{};
    SplitDecodeNvfp4Args s{{in.at("q").ptr(),
                            pool,
                            pool,
                            {},
                            {},
                            in.at("block_tables").ptr(),
                            in.at("seq_lens").ptr(),
                            max_blocks,
                            heads,
                            576,
                            576,
                            16,
                            c.scalars.at("logit_scale").as_f32(),
                            u32("keys_per_split"),
                            3,
                            splits,
                            64,
                            true},
                           c.scalars.at("block_stride_bytes").as_u64(),
                           c.scalars.at("data_section_bytes").as_u64()};
    check_fused_bits(
        *gpu, fast, c, in, heads, splits, sink, 1.0f,
        [&] {
          mla_paged_decode_wgmma_latent_combine_nvfp4(*gpu, fast.wgmma_latent_combine_nvfp4,
                                                      {s, sink, in.at("o").ptr()});
        },
        [&](DevicePtr o_partial, DevicePtr ml_partial) {
          s.o_partial = o_partial, s.ml_partial = ml_partial;
          mla_paged_decode_wgmma_nvfp4(*gpu, fast.wgmma_latent_nvfp4, s);
        });
  }
}

// The dispatcher over a table of 4200 keys: one latent pool runs on the heads-in-M block — on a
// device of many SMs as many chunks and the combine, on one of 2 or 4 SMs in clusters of 1 or 2
// chunks (one launch) — and two pools on the register-operand block; all against the reference.
TEST_CASE("the NVFP4 dispatcher takes the heads-in-M block for one latent pool",
          "[mla_fast][dispatch][latent][nvfp4]") {
  emu::EmulatorOptions o;
  o.multiprocessor_count = GENERATE(2u, 4u, 132u);
  emu::EmulatorBackend gpu(o);
  gpu.record_launches(true);
  const bool latent = GENERATE(true, false);
  const std::uint32_t heads = GENERATE(64u, 128u);
  INFO((latent ? "one latent pool, " : "two pools, ") << heads << " heads, " << o.multiprocessor_count << " SMs");
  gen::PagedSpec p;
  p.format = KvFormat::nvfp4, p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = heads, p.block_size = 7;
  p.num_seqs = 3, p.max_blocks_per_seq = 600, p.num_blocks = 150, p.seq_lens = {320, 0, 130}, p.fill = -1;
  p.key_ramp = 2.0f, p.latent = latent;
  const KernelCase c = gen::split_path_case(p);
  test::check_expected(gpu, c);
  std::vector<std::string> entries;
  for (const auto& l : gpu.launch_log()) entries.push_back(l.entry);
  INFO(fmt::format("{}", fmt::join(entries, ", ")));
  if (!latent) {
    CHECK(entries == std::vector<std::string>{"mla_paged_decode_wgmma_nvfp4", "mla_paged_decode_combine"});
  } else if (o.multiprocessor_count == 132) {
    CHECK(entries == std::vector<std::string>{"mla_paged_decode_wgmma_latent_nvfp4", "mla_paged_decode_combine"});
  } else {
    CHECK(entries == std::vector<std::string>{"mla_paged_decode_wgmma_latent_combine_nvfp4"});
  }
  if (o.multiprocessor_count == 132) test::check_case(c);  // and on the CUDA backend where it runs
}

// The recorder writes a launch whose two caches are one pool as an alias (the replay's buffers
// shared as the launch's were, so a device replay takes the same walk), and the alias survives
// the file.
TEST_CASE("a recorded launch over one latent pool replays with v_cache aliasing k_cache",
          "[mla_fast][latent][recorded]") {
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 16, p.block_size = 16, p.num_seqs = 2;
  p.max_blocks_per_seq = 12, p.num_blocks = 30, p.seq_lens = {150, 41}, p.sinks = true, p.latent = true;
  const auto dir = test::scratch_dir("metrale_latent_recorder_test");
  std::filesystem::remove_all(dir);
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    emu::EmulatorBackend gpu(o);
    run_kernel_case(gpu, gen::split_path_case(p));
  }
  std::size_t decodes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const KernelCase rec = read_kernel_case(e.path());
    if (rec.entry == "mla_paged_decode_combine") continue;
    ++decodes;
    CHECK(rec.aliases == std::map<std::string, std::string>{{"v_cache", "k_cache"}});
    CHECK(rec.inputs.count("v_cache") == 0);
    test::check_case(rec);
  }
  CHECK(decodes == 1);
  std::filesystem::remove_all(dir);
}

// Where clusters of the staged 16-head FP8 blocks' chunks cost no more than the unfused plan and
// its combine launch, the dispatcher takes the entry (no workspace, no combine launch): an
// emulator of one SM makes a small step one. The plan sizes its clusters by how many the device
// runs at once: the H200's occupancy (measured: 30 clusters of 8, 32 of 7) takes B = 32 × 4K to
// 7 chunks of 10 tiles; as many as fill the SMs (the emulator's), to 8 of 8.
TEST_CASE("the dispatcher combines in clusters where the plan's clusters cost no more", "[mla_fast][dispatch][wgmma]") {
  gen::PagedSpec p = fused_spec(16, 30);
  p.num_seqs = 2, p.num_blocks = 60, p.seq_lens = {420, 300};
  emu::EmulatorOptions one_sm;
  one_sm.multiprocessor_count = 1;
  emu::EmulatorBackend gpu(one_sm);
  gpu.record_launches(true);
  const KernelCase c = gen::split_path_case(p);
  const auto out = run_kernel_case(gpu, c);
  CHECK(check_output("o", out.at("o"), c.expected.at("o"), c.tolerance.at("o")).pass);
  std::vector<std::string> entries;
  for (const auto& r : gpu.launch_log()) entries.push_back(r.entry);
  CHECK(entries == std::vector<std::string>{"mla_paged_decode_wgmma16_rs_combine_fp8"});
  const auto fast = MlaFastKernels::resolve(gpu);
  CHECK(fast.fused_clusters == std::array<std::uint32_t, 9>{0, 2, 1, 0, 0, 0, 0, 0, 0});  // 2 blocks an SM
  PagedDecodeCommon a;
  a.num_seqs = 32, a.max_blocks_per_seq = 64, a.block_size = 64, a.q_head_dim = a.kv_cache_dim = 576;
  a.num_q_heads = 16;
  const std::array<std::uint32_t, 9> h200{0, 264, 132, 79, 62, 47, 39, 32, 30},
      full{0, 264, 132, 88, 66, 52, 44, 37, 33};
  const auto plan = [&](KvFormat f, std::span<const std::uint32_t> clusters) {
    return plan_split_decode(a, f, 0, 132, 227 * 1024, true, clusters);
  };
  CHECK(plan(KvFormat::fp8, {}).num_splits == 8);  // unfused: 256 blocks of 8 tiles, one round
  CHECK_FALSE(plan(KvFormat::fp8, {}).fused);
  CHECK(plan(KvFormat::fp8, h200).fused);
  CHECK(plan(KvFormat::fp8, h200).num_splits == 7);
  CHECK(plan(KvFormat::fp8, full).num_splits == 8);
  // The 64-head blocks, one an SM, with clusters sized as the SMs allow: B = 32 × 4K keys in 4
  // chunks at 64 heads (one round of 128 blocks, as unfused), 2 at 128 (the same). The plan
  // fuses whatever format's clusters its caller passes (the NVFP4 dispatcher passes its
  // heads-in-M entry's alone): NVFP4's plan is FP8's.
  const std::array<std::uint32_t, 9> one_per_sm{0, 132, 66, 44, 33, 26, 22, 18, 16};
  a.num_q_heads = 64;
  CHECK(plan(KvFormat::fp8, one_per_sm).fused);
  CHECK(plan(KvFormat::fp8, one_per_sm).num_splits == 4);
  a.num_q_heads = 128;
  CHECK(plan(KvFormat::fp8, one_per_sm).fused);
  CHECK(plan(KvFormat::fp8, one_per_sm).num_splits == 2);
  CHECK(plan(KvFormat::nvfp4, one_per_sm).fused);
  CHECK(plan(KvFormat::nvfp4, one_per_sm).num_splits == 2);
  // B = 128 × 64K × 128: 256 blocks of one chunk in two rounds, not 18 chunks of 57 tiles in 35
  // (2030 tiles against 2050 without the 64-head block's partial; measured 1.18× slower).
  a.num_seqs = 128, a.max_blocks_per_seq = 1024;
  CHECK(plan(KvFormat::fp8, one_per_sm).fused);
  CHECK(plan(KvFormat::fp8, one_per_sm).num_splits == 1);
  CHECK(plan(KvFormat::nvfp4, one_per_sm).fused);
  CHECK(plan(KvFormat::nvfp4, one_per_sm).num_splits == 1);
  CHECK_FALSE(plan(KvFormat::nvfp4, {}).fused);
  a.num_seqs = 32, a.max_blocks_per_seq = 64;
  a.num_q_heads = 16, a.num_seqs = 4;  // 33 chunks of 2 tiles beat 8 chunks of 8
  CHECK_FALSE(plan(KvFormat::fp8, h200).fused);
  a.num_seqs = 128;  // 2 chunks of 32 tiles, in clusters of 2, and no workspace
  CHECK(plan(KvFormat::fp8, h200).fused);
  CHECK(plan(KvFormat::fp8, h200).num_splits == 2);
  CHECK(plan(KvFormat::fp8, h200).workspace_bytes == 0);
  test::require_error([&] { plan(KvFormat::fp8, std::span(h200).first(8)); }, Errc::invalid_argument,
                      {"fused_clusters has 8 entries, not 9"});
}

TEST_CASE("the plan takes the wgmma entries for DeepSeek's rows above 32 heads and up to 16",
          "[mla_fast][plan][wgmma]") {
  PagedDecodeCommon a;
  a.num_seqs = 32, a.max_blocks_per_seq = 64, a.block_size = 64, a.q_head_dim = a.kv_cache_dim = 576;
  const KvFormat format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  INFO("format " << to_string(format));
  a.num_q_heads = 128;
  const SplitPlan p = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
  CHECK(p.wgmma);
  CHECK(p.rows_per_block == 64);
  CHECK(p.threads == 256);
  CHECK(p.head_groups == 2);
  CHECK(p.keys_per_split % 64 == 0);
  CHECK(std::uint64_t{p.num_splits} * p.keys_per_split >= 64 * 64);
  CHECK(p.shared_bytes == wgmma_shared_bytes(format));
  // 1 KiB of alignment, Q (72 KiB) and Pᵀ (8 KiB) in FP16, two slots of the raw K and V tiles (64
  // rows of 576 codes; NVFP4 288 data bytes and 36 scales), 64 unscale factors, 2 × 4 × 32 maxima,
  // 8 votes, 6 mbarriers.
  CHECK(wgmma_shared_bytes(format) ==
        1024u + 73728 + 8192 + 4 * 64 * (format == KvFormat::fp8 ? 576 : 288 + 36) + 256 + 1024 + 32 + 48);
  CHECK(wgmma_shared_bytes(KvFormat::fp8) == 231760u);
  // Not without the entries, not at 17 to 32 heads, not for other rows, not in 99 KiB.
  CHECK_FALSE(plan_split_decode(a, format, 0, 132, 227 * 1024, false).wgmma);
  a.num_q_heads = 32;
  CHECK_FALSE(plan_split_decode(a, format, 0, 132, 227 * 1024, true).wgmma);
  a.num_q_heads = 17;
  CHECK_FALSE(plan_split_decode(a, format, 0, 132, 227 * 1024, true).wgmma);
  a.num_q_heads = 33;
  CHECK(plan_split_decode(a, format, 0, 132, 227 * 1024, true).wgmma);
  // 16 heads or fewer: the wgmma16 entries, one 16-head group (16 × 4K keys: 1024 tiles, too few
  // per block slot for the staged entry).
  a.num_seqs = 16;
  for (std::uint32_t heads : {16u, 1u}) {
    a.num_q_heads = heads;
    const SplitPlan p16 = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
    CHECK(p16.wgmma);
    CHECK(p16.rows_per_block == 16);
    CHECK(p16.threads == 384);
    CHECK(p16.head_groups == 1);
    CHECK(p16.keys_per_split % 64 == 0);
    CHECK(p16.shared_bytes == wgmma_shared_bytes(format, 16));
    CHECK_FALSE(p16.staged);  // the producers hold the next tile in registers
  }
  CHECK(wgmma_shared_bytes(format, 16) == 169280u);
  // At least 6 tiles per block slot at two blocks per SM (128 × 16K keys: 124 on 132 SMs): the
  // staged one-warpgroup entries, two blocks per SM.
  a.num_q_heads = 16, a.num_seqs = 128, a.max_blocks_per_seq = 256;
  const SplitPlan big = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
  CHECK(big.wgmma);
  CHECK(big.rows_per_block == 16);
  CHECK(big.staged);
  CHECK(big.threads == 128u);
  CHECK(big.shared_bytes == wgmma_shared_bytes(format, 16, true));
  // 1 KiB of alignment, Q (18 KiB) and P (2 KiB) in FP16, the raw K and V half-tiles (64 rows of
  // 576 bytes each; NVFP4 288 data bytes and 36 scales), 16 unscale factors, 4 × 16 maxima, two
  // mbarriers.
  CHECK(wgmma_shared_bytes(KvFormat::fp8, 16, true) == 95568u);
  CHECK(wgmma_shared_bytes(KvFormat::nvfp4, 16, true) == 1024u + 18432 + 2048 + 2 * 64 * (288 + 36) + 64 + 256 + 16);
  // The splits: two chunks of 128 tiles per sequence fill 256 of the 264 block slots in one round.
  CHECK(big.num_splits == 2u);
  // The threshold: 32 × 4K keys (7.8 tiles a slot) staged, 16 × 4K (3.9, tested above) not.
  a.num_seqs = 32, a.max_blocks_per_seq = 64;
  CHECK(plan_split_decode(a, format, 0, 132, 227 * 1024, true).staged);
  // Over one latent pool (v_cache is k_cache) NVFP4 takes the specialised entry, which converts
  // each tile once, at any size; FP8 the staged entry from the threshold, as over two pools.
  a.k_cache = a.v_cache = DevicePtr{0x10000};
  for (std::uint32_t seqs : {32u, 128u}) {
    a.num_seqs = seqs;
    const SplitPlan lat = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
    CHECK(lat.rows_per_block == 16);
    CHECK(lat.staged == (format == KvFormat::fp8));
    CHECK(lat.threads == (format == KvFormat::fp8 ? 128u : 384u));
  }
  a.v_cache = DevicePtr{0x20000};
  CHECK(plan_split_decode(a, format, 0, 132, 227 * 1024, true).staged);
  a.k_cache = a.v_cache = DevicePtr{}, a.num_seqs = 32;
  a.num_q_heads = 33;
  a.kv_cache_dim = 512, a.q_head_dim = 512;
  CHECK_FALSE(plan_split_decode(a, format, 0, 132, 227 * 1024, true).wgmma);
  a.kv_cache_dim = 576, a.q_head_dim = 576;
  // A small step above 32 heads takes 16-head blocks: up to 4 · 132 = 528 tiles of theirs in all.
  // One sequence of 128 heads (8 groups of 16) with 66 tiles of keys is 528; a 67th (one key of the
  // compressed pool) makes it 64-head blocks.
  a.num_q_heads = 128, a.num_seqs = 1, a.max_blocks_per_seq = 66;
  const SplitPlan small = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
  CHECK(small.wgmma);
  CHECK(small.rows_per_block == 16);
  CHECK(small.head_groups == 8);
  CHECK_FALSE(small.staged);
  CHECK(small.threads == 384);
  CHECK(plan_split_decode(a, format, 1, 132, 227 * 1024, true).rows_per_block == 64);
  CHECK(plan_split_decode(a, format, 0, 131, 227 * 1024, true).rows_per_block == 64);  // 524 < 528
  // Its splits go down to one 64-key tile: 8 groups × 16 splits of 1K keys fill 128 of 132 SMs
  // in one round (at four tiles a split at least, as before, it was 4 splits).
  a.max_blocks_per_seq = 16;
  const SplitPlan one_tile = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
  CHECK(one_tile.rows_per_block == 16);
  CHECK(one_tile.num_splits == 16);
  CHECK(one_tile.keys_per_split == 64);
  // The 64-head blocks keep four tiles a split at least: one sequence of 16K keys at 64 heads
  // (1024 tiles of 16-head blocks) in 64 splits of 256 keys (one-tile splits would give 128 of 128).
  a.num_q_heads = 64, a.max_blocks_per_seq = 256;
  const SplitPlan wide = plan_split_decode(a, format, 0, 132, 227 * 1024, true);
  CHECK(wide.rows_per_block == 64);
  CHECK(wide.num_splits == 64u);
  CHECK(wide.keys_per_split == 256u);
  a.num_seqs = 32, a.max_blocks_per_seq = 64;
  CHECK_FALSE(plan_split_decode(a, format, 0, 132, 99 * 1024, true).wgmma);
}

// The split launchers' partials are written by every block while others read q, the tables and
// the pools: a partial over any of them (here the latent entry's o_partial over the pool it reads,
// and the split entry's ml_partial over q) is refused before anything runs, and the pool keeps
// its bytes. Before, one block of the latent entry overwrote its own pool without an error.
TEST_CASE("the split launchers refuse partials over what their blocks read", "[mla_fast][wgmma][validation]") {
  emu::EmulatorBackend gpu;
  const auto fast = MlaFastKernels::resolve(gpu);
  REQUIRE(fast.wgmma_latent_fp8.id != 0);
  const std::size_t pool_bytes = 64 * 576;
  DeviceBuffer q(gpu, 64 * 576 * 2), pool(gpu, pool_bytes), partials(gpu, 64 * 576 * 4), ml(gpu, 64 * 2 * 4);
  DeviceBuffer tables(gpu, 16), lens(gpu, 16);
  std::vector<std::uint8_t> codes(pool_bytes, 0x38);  // 1.0 in E4M3
  upload<std::uint8_t>(gpu, codes, pool.ptr());
  SplitDecodeFp8Args a;
  a.q = q.ptr(), a.k_cache = a.v_cache = pool.ptr(), a.o_partial = partials.ptr(), a.ml_partial = ml.ptr();
  a.block_tables = tables.ptr(), a.seq_lens = lens.ptr();
  a.max_blocks_per_seq = 1, a.num_q_heads = 64, a.q_head_dim = a.kv_cache_dim = 576, a.block_size = 64;
  a.logit_scale = 0.1f, a.keys_per_split = 64, a.num_seqs = 1, a.num_splits = 1, a.rows_per_block = 64;
  a.cache_stride = 576;
  SECTION("o_partial over the latent pool") {
    a.o_partial = pool.ptr();
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_latent_fp8, a); }, Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_latent_fp8", "o_partial spans", "k_cache's"});
  }
  SECTION("a misaligned seq_lens or ml_partial") {  // (the emulator had found them only as it ran)
    a.seq_lens = lens.ptr() + 2;
    test::require_error([&] { mla_paged_decode_split_fp8(gpu, fast.split_fp8, a); }, Errc::invalid_argument,
                        {"mla_paged_decode_split_fp8", "seq_lens", "is not 4-byte aligned"});
    a.seq_lens = lens.ptr(), a.ml_partial = ml.ptr() + 2;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_latent_fp8, a); }, Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_latent_fp8", "ml_partial", "is not 4-byte aligned"});
  }
  SECTION("ml_partial over q") {
    a.ml_partial = q.ptr() + 64;
    test::require_error([&] { mla_paged_decode_split_fp8(gpu, fast.split_fp8, a); }, Errc::invalid_argument,
                        {"mla_paged_decode_split_fp8", "ml_partial spans", "overlaps q's"});
  }
  gpu.synchronize(0);
  CHECK(pool.to_host<std::uint8_t>() == codes);
}

TEST_CASE("the wgmma launchers refuse other block shapes, rows, handles and layouts", "[mla_fast][wgmma][validation]") {
  emu::EmulatorBackend gpu;
  const auto fast = MlaFastKernels::resolve(gpu);
  REQUIRE(fast.wgmma_fp8.id != 0);
  DeviceBuffer buf(gpu, 1 << 20);
  SplitDecodeFp8Args a;
  a.q = a.k_cache = a.v_cache = a.o_partial = a.ml_partial = a.block_tables = a.seq_lens = buf.ptr();
  a.max_blocks_per_seq = 1, a.num_q_heads = 64, a.q_head_dim = a.kv_cache_dim = 576, a.block_size = 16;
  a.logit_scale = 0.1f, a.keys_per_split = 64, a.num_seqs = 1, a.num_splits = 1, a.rows_per_block = 64;
  a.cache_stride = 576;
  SECTION("rows_per_block") {
    a.rows_per_block = 32;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_fp8", "rows_per_block 32 is not 64 or 16"});
  }
  SECTION("num_splits past the grid's x") {  // the launcher's error, not the backend's launch failure
    a.num_splits = 0x8000'0000u;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_fp8", "num_splits 2147483648 exceeds 2147483647"});
    const SplitDecodeNvfp4Args n{a, 8192, 4608};
    test::require_error([&] { mla_paged_decode_wgmma_nvfp4(gpu, fast.wgmma_latent_nvfp4, n); }, Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_latent_nvfp4", "num_splits 2147483648"});
  }
  SECTION("logit_scale not finite, or not times log2(e) in FP32") {
    for (const auto& [x, text] : std::vector<std::pair<float, std::string>>{
             {std::numeric_limits<float>::infinity(), "logit_scale inf is not finite"},
             {std::nanf(""), "logit_scale nan is not finite"},
             {-3e38f, "logit_scale -3e+38 times log2(e) (the wgmma kernels' base-2 logits) is past FP32's range"}}) {
      INFO(text);
      a.logit_scale = x;
      test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                          {"mla_paged_decode_wgmma_fp8", text});
      test::require_error([&] { mla_paged_decode_split_fp8(gpu, fast.split_fp8, a); }, Errc::invalid_argument,
                          {"mla_paged_decode_split_fp8", text});
    }
  }
  SECTION("keys_per_split") {
    a.keys_per_split = 96;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"keys_per_split 96 is not a multiple of 64"});
  }
  SECTION("rows of another width") {
    a.q_head_dim = a.kv_cache_dim = 512, a.cache_stride = 512;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"q_head_dim 512 and kv_cache_dim 512 are not both 576"});
  }
  SECTION("another entry's handle (same parameters, another block and shared memory)") {
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.split_fp8, a); }, Errc::invalid_argument,
                        {"kernel mla_fast.mla_paged_decode_split_fp8 is not mla_paged_decode_wgmma_fp8"});
    a.rows_per_block = 16;  // each wgmma entry serves one block size
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"rows_per_block 16 does not fit kernel mla_wgmma.mla_paged_decode_wgmma_fp8, whose blocks "
                         "serve 64 heads"});
    a.rows_per_block = 64;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma16_fp8, a); }, Errc::invalid_argument,
                        {"rows_per_block 64 does not fit kernel mla_wgmma.mla_paged_decode_wgmma16_fp8, whose "
                         "blocks serve 16 heads"});
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma16_rs_fp8, a); }, Errc::invalid_argument,
                        {"rows_per_block 64 does not fit kernel mla_wgmma.mla_paged_decode_wgmma16_rs_fp8"});
    const SplitDecodeNvfp4Args n64{a, 8192, 4608};
    test::require_error([&] { mla_paged_decode_wgmma_nvfp4(gpu, fast.wgmma16_nvfp4, n64); }, Errc::invalid_argument,
                        {"rows_per_block 64 does not fit kernel mla_wgmma.mla_paged_decode_wgmma16_nvfp4"});
    test::require_error([&] { mla_paged_decode_wgmma_nvfp4(gpu, fast.wgmma16_rs_nvfp4, n64); }, Errc::invalid_argument,
                        {"rows_per_block 64 does not fit kernel mla_wgmma.mla_paged_decode_wgmma16_rs_nvfp4"});
    a.rows_per_block = 16;  // 16 heads: either 16-head entry of the format; the NVFP4 launcher takes no FP8 one
    const SplitDecodeNvfp4Args n{a, 8192, 4608};
    test::require_error([&] { mla_paged_decode_wgmma_nvfp4(gpu, fast.wgmma16_rs_fp8, n); }, Errc::invalid_argument,
                        {"kernel mla_wgmma.mla_paged_decode_wgmma16_rs_fp8 is not mla_paged_decode_wgmma16_nvfp4 or "
                         "mla_paged_decode_wgmma16_rs_nvfp4"});
    a.rows_per_block = 32;
    test::require_error([&] { mla_paged_decode_split_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"kernel mla_wgmma.mla_paged_decode_wgmma_fp8 is not mla_paged_decode_split_fp8 or "
                         "mla_paged_decode_split16_fp8"});
  }
  SECTION("the entry that combines in clusters: its chunks, o, handle and cluster") {
    a.rows_per_block = 16, a.num_splits = 9, a.o_partial = a.ml_partial = {};
    const FusedDecodeFp8Args f{a, {}, buf.ptr() + (1 << 19), 1.0f};  // o apart from q
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, f); },
                        Errc::invalid_argument, {"mla_paged_decode_wgmma16_rs_combine_fp8", "num_splits 9"});
    FusedDecodeFp8Args g = f;
    g.split.num_splits = 1, g.o = buf.ptr() + 2;
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, g); },
                        Errc::invalid_argument, {"o 0x", "is not 8-byte aligned"});
    g.o = {};
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, g); },
                        Errc::invalid_argument, {"o is null"});
    // A v_scale the seed kernel refuses (448 times it past FP32), refused here too: it had written
    // ±inf (the adversarial trial, forty-fifth session).
    FusedDecodeFp8Args h = f;
    h.split.num_splits = 1, h.v_scale = 3.4e38f;
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, h); },
                        Errc::invalid_argument,
                        {"mla_paged_decode_wgmma16_rs_combine_fp8: v_scale 3.4e+38 times the largest E4M3 code (448)"});
    g.o = g.split.q + 64 * 576;  // q's second row
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, g); },
                        Errc::invalid_argument, {"which overlaps q's", "num_q_heads"});
    g.o = g.split.q + 64 * 576 * 2, g.split.o_partial = buf.ptr() + 4;  // o just past q; o_partial not used
    try {  // (the launch then reads the buffer's unwritten seq_lens: the emulator's fault)
      mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, g);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::device_fault);
    }
    g.split.o_partial = {};
    g.o = f.o, g.v_scale = 0.0f;
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, g); },
                        Errc::invalid_argument, {"v_scale"});
    g.v_scale = 1.0f, g.split.rows_per_block = 64;
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_combine_fp8, g); },
                        Errc::invalid_argument, {"rows_per_block 64 is not 16"});
    g.split.rows_per_block = 16;
    test::require_error([&] { mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fast.wgmma16_rs_fp8, g); },
                        Errc::invalid_argument,
                        {"kernel mla_wgmma.mla_paged_decode_wgmma16_rs_fp8 is not "
                         "mla_paged_decode_wgmma16_rs_combine_fp8"});
    // A raw launch without the cluster: the entry's cluster rule refuses it, as the kernel would misread.
    g.split.num_splits = 2, g.split.max_blocks_per_seq = 8;
    std::vector<KernelArg> args;
    for (DevicePtr p : {buf.ptr(), buf.ptr(), buf.ptr(), DevicePtr{}, buf.ptr(), buf.ptr(), buf.ptr()})
      args.push_back(KernelArg::ptr(p));
    for (std::uint32_t v : {8u, 64u, 576u, 576u, 16u}) args.push_back(KernelArg::u32(v));
    args.push_back(KernelArg::f32(0.1f));
    args.push_back(KernelArg::u64(576));
    args.push_back(KernelArg::u32(0));
    args.push_back(KernelArg::ptr({}));
    args.push_back(KernelArg::u32(0));
    args.push_back(KernelArg::u32(64));
    args.push_back(KernelArg::f32(1.0f));
    upload<std::int32_t>(gpu, std::vector<std::int32_t>(16, 0), buf.ptr());
    test::require_error(
        [&] {
          gpu.launch(fast.wgmma16_rs_combine_fp8, {2, 4, 1}, {128, 1, 1}, args, 0, 95568);
        },
        Errc::launch_failed, {"cluster (1,1,1) but the kernel needs (2,1,1)"});
    gpu.set_dry_run(true);  // before: the port checked the cluster, and a dry run runs no port
    test::require_error(
        [&] {
          gpu.launch(fast.wgmma16_rs_combine_fp8, {2, 4, 1}, {128, 1, 1}, args, 0, 95568);
        },
        Errc::launch_failed, {"cluster (1,1,1) but the kernel needs (2,1,1)"});
    gpu.launch(fast.wgmma16_rs_combine_fp8, {2, 4, 1}, {128, 1, 1}, args, 0, 95568, false, {2, 1, 1});  // the right one
    gpu.set_dry_run(false);
    test::require_error(
        [&] {
          gpu.launch(fast.wgmma16_rs_combine_fp8, {2, 4, 1}, {128, 1, 1}, args, 0, 95568, false, {3, 1, 1});
        },
        Errc::launch_failed, {"cluster (3,1,1) does not divide grid (2,4,1)"});
    test::require_error(
        [&] {
          gpu.launch(fast.wgmma16_rs_combine_fp8, {16, 4, 1}, {128, 1, 1}, args, 0, 95568, false, {16, 1, 1});
        },
        Errc::launch_failed, {"cluster (16,1,1) is not 1 to 8 blocks"});
    test::require_error(  // 2^31 · 2^31 · 4 blocks wrap to 0 in 64 bits
        [&] {
          gpu.launch(fast.wgmma16_rs_combine_fp8, {16, 4, 1}, {128, 1, 1}, args, 0, 95568, false,
                     {1u << 31, 1u << 31, 4});
        },
        Errc::launch_failed, {"is not 1 to 8 blocks"});
    // The occupancy the plan reads: none for a block that cannot fit, saturated for absurd SMs.
    CHECK(gpu.max_active_clusters(fast.wgmma16_rs_combine_fp8, {128, 1, 1}, 0xFFFF'FC00u, 2) == 0);
    emu::EmulatorOptions huge;
    huge.multiprocessor_count = 0xFFFF'FFFFu;
    CHECK(emu::EmulatorBackend(huge).max_active_clusters(fast.wgmma16_rs_combine_fp8, {128, 1, 1}, 95568, 1) ==
          0xFFFF'FFFFu);
    emu::EmulatorOptions gb10_smem;  // the entry's 95,568 bytes fit an sm_121's 99 KiB
    gb10_smem.max_shared_bytes_per_block = 101376;
    CHECK_FALSE(
        entry_unavailable(emu::EmulatorBackend(gb10_smem), "mla_wgmma", "mla_paged_decode_wgmma16_rs_combine_fp8"));
  }
  SECTION("q and o_partial misaligned, chunks too few for the table") {
    a.q = buf.ptr() + 2;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"q 0x", "is not 16-byte aligned"});
    a.q = buf.ptr(), a.o_partial = buf.ptr() + 4;
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"is not 8-byte aligned"});
    a.o_partial = buf.ptr(), a.max_blocks_per_seq = 10;  // 160 keys, one chunk of 64
    test::require_error([&] { mla_paged_decode_wgmma_fp8(gpu, fast.wgmma_fp8, a); }, Errc::invalid_argument,
                        {"num_splits 1 x keys_per_split 64 covers fewer keys than the table holds (160)"});
  }
  SECTION("the heads-in-M entry that combines in clusters: one latent pool, its handle, o apart from q") {
    a.o_partial = a.ml_partial = {}, a.num_splits = 2;
    FusedDecodeFp8Args f{a, {}, buf.ptr() + (1 << 19), 1.0f};
    f.split.v_cache = buf.ptr() + 4096;  // a V pool of its own
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_fp8(gpu, fast.wgmma_latent_combine_fp8, f); },
                        Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_latent_combine_fp8", "v_cache 0x", "is not k_cache 0x"});
    f.split.v_cache = f.split.k_cache, f.split.comp_pool = buf.ptr() + 8192, f.split.comp_block_count = 3;
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_fp8(gpu, fast.wgmma_latent_combine_fp8, f); },
                        Errc::invalid_argument, {"comp_block_count 3 with a comp_pool"});
    f.split.comp_pool = {}, f.split.comp_block_count = 0;
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_fp8(gpu, fast.wgmma_combine_fp8, f); },
                        Errc::invalid_argument,
                        {"kernel mla_wgmma.mla_paged_decode_wgmma_combine_fp8 is not "
                         "mla_paged_decode_wgmma_latent_combine_fp8"});
    f.o = f.split.q + 576;  // q's second row: o's extent follows num_seqs × num_q_heads, which it names
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_fp8(gpu, fast.wgmma_latent_combine_fp8, f); },
                        Errc::invalid_argument,
                        {"o spans [0x", "which overlaps q's [0x", "num_seqs 1 x num_q_heads 64 rows of 576 and 576"});
  }
  SECTION("the NVFP4 heads-in-M entries: one latent pool, their handles, o apart from q") {
    SplitDecodeNvfp4Args n{a, 8192, 4608};
    n.v_cache = buf.ptr() + 4096;  // a V pool of its own
    test::require_error([&] { mla_paged_decode_wgmma_nvfp4(gpu, fast.wgmma_latent_nvfp4, n); }, Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_latent_nvfp4", "v_cache 0x", "is not k_cache 0x"});
    n.o_partial = n.ml_partial = {}, n.num_splits = 2;
    FusedDecodeNvfp4Args f{n, {}, buf.ptr() + (1 << 19)};
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_nvfp4(gpu, fast.wgmma_latent_combine_nvfp4, f); },
                        Errc::invalid_argument,
                        {"mla_paged_decode_wgmma_latent_combine_nvfp4", "v_cache 0x", "is not k_cache 0x"});
    f.split.v_cache = f.split.k_cache;
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_nvfp4(gpu, fast.wgmma_latent_combine_fp8, f); },
                        Errc::invalid_argument,
                        {"kernel mla_wgmma.mla_paged_decode_wgmma_latent_combine_fp8 is not "
                         "mla_paged_decode_wgmma_latent_combine_nvfp4"});
    f.split.num_splits = 9, f.split.keys_per_split = 64;
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_nvfp4(gpu, fast.wgmma_latent_combine_nvfp4, f); },
                        Errc::invalid_argument, {"mla_paged_decode_wgmma_latent_combine_nvfp4", "num_splits 9"});
    f.split.num_splits = 2, f.o = f.split.q + 576;  // q's second row
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_nvfp4(gpu, fast.wgmma_latent_combine_nvfp4, f); },
                        Errc::invalid_argument,
                        {"o spans [0x", "which overlaps q's [0x", "num_seqs 1 x num_q_heads 64 rows of 576 and 576"});
    f.o = buf.ptr() + (1 << 19) + 4;
    test::require_error([&] { mla_paged_decode_wgmma_latent_combine_nvfp4(gpu, fast.wgmma_latent_combine_nvfp4, f); },
                        Errc::invalid_argument, {"o 0x", "is not 8-byte aligned"});
  }
}

// The reference tolerance of a paged decode case must be able to fail: for NVFP4 it once took
// the largest value a code and a scale can make (6 · 448) for the largest |V| and |K|, 60 times
// the data's (scales below 8 here), and passed an all-zero output. The same pools with one key
// fewer, and zeros, must both be out of it; the case itself passes on every backend. (NVFP4's
// random values reach 45: Q in ±1/64 keeps the logits small enough that every key counts — at
// ±1 they reach hundreds, the softmax is one-hot and no key but the largest changes o.)
TEST_CASE("a paged decode case's tolerance catches one dropped key and a zero output", "[mla_fast][tolerance]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 16, p.block_size = 16, p.num_seqs = 2;
  p.max_blocks_per_seq = 12, p.num_blocks = 30, p.seq_lens = {150, 41}, p.k_scale = 0.013f, p.v_scale = 0.021f;
  if (p.format == KvFormat::nvfp4) p.q_range = 1.0f / 64;
  const KernelCase want = gen::split_path_case(p);
  test::check_case(want);
  p.seq_lens = {149, 41};  // the same pools and tables (ten blocks either way), one key fewer
  const KernelCase shorter = gen::split_path_case(p);
  REQUIRE(shorter.inputs.at("k_cache").data == want.inputs.at("k_cache").data);
  const Tolerance& tol = want.tolerance.at("o");
  CHECK_FALSE(check_output("o", shorter.expected.at("o"), want.expected.at("o"), tol).pass);
  Tensor zeros = want.expected.at("o");
  std::fill(zeros.data.begin(), zeros.data.end(), std::byte{0});
  CHECK_FALSE(check_output("o", zeros, want.expected.at("o"), tol).pass);
}

// A NaN in one head's q makes that head's output NaN, on every path (the split path's combine
// once took a chunk whose sum is NaN for a chunk without keys, and wrote zeros).
TEST_CASE("NaN in q reaches the head's output on the seed, split and wgmma paths", "[mla_fast][nan]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = GENERATE(16u, 40u), p.block_size = 16, p.num_seqs = 2;
  p.max_blocks_per_seq = 10, p.num_blocks = 30, p.seq_lens = {150, 33};
  const bool split = GENERATE(false, true);
  KernelCase c = split ? gen::split_path_case(p) : gen::paged_decode_case(p);
  auto q = c.inputs.at("q").values<Bf16>();
  const std::uint32_t bad = 5;  // head 5 of sequence 1
  q[(std::uint64_t{1} * p.num_q_heads + bad) * 576 + 100] = Bf16{0x7FC0};
  c.inputs.at("q") = Tensor::from<Bf16>(c.inputs.at("q").shape, q);
  for (const auto& name : test::backends()) {
    INFO("backend " << name << " " << to_string(p.format) << " heads " << p.num_q_heads << " split " << split);
    auto gpu = test::make_backend(name);
    const auto o = run_kernel_case(*gpu, c).at("o").values<Bf16>();
    for (std::uint32_t s = 0; s < 2; ++s)
      for (std::uint32_t h = 0; h < p.num_q_heads; ++h) {
        const auto row = std::span(o).subspan((std::uint64_t{s} * p.num_q_heads + h) * 576, 576);
        const bool poisoned = s == 1 && h == bad;
        const auto nans = std::count_if(row.begin(), row.end(), [](Bf16 x) { return std::isnan(x.to_float()); });
        INFO("sequence " << s << " head " << h);
        CHECK(nans == (poisoned ? 576 : 0));
      }
  }
}

TEST_CASE("the combine matches the float64 reference", "[mla_fast][combine]") {
  for (const bool sinks : {false, true})
    for (auto [seqs, heads, dim, splits] :
         {std::array<std::uint32_t, 4>{1, 1, 1, 1}, {1, 5, 200, 2}, {2, 3, 64, 3}, {2, 3, 64, 5}, {3, 16, 576, 12},
          {1, 2, 300, 257}, {1, 1, 130, 2100}})
      test::check_case(gen::combine_case(seqs, heads, dim, splits, sinks, 7 + splits));
}

TEST_CASE("the combine refuses an o over its partials or sinks", "[mla_fast][combine][validation]") {
  // Before: accepted; an o inside the second chunk's row (1 head, 2 chunks of 64 dims) changed 31
  // of the 64 outputs on the emulator, which did not report it (one block reads and writes).
  emu::EmulatorBackend gpu;
  gpu.set_dry_run(true);
  const auto fast = MlaFastKernels::resolve(gpu);
  const DevicePtr partials{1ull << 32}, ml{2ull << 32}, sinks{3ull << 32};
  // o_partial [1, 1, 2, 64] f32 = 512 bytes, ml_partial 16 bytes, sinks 4 bytes; o 128 bytes.
  auto combine = [&](DevicePtr o) {
    mla_paged_decode_combine(gpu, fast.combine, {partials, ml, sinks, o, 1, 64, 2, 1.0f, 1});
  };
  const auto bad = Errc::invalid_argument;
  test::require_error([&] { combine(partials + 384); }, bad,
                      {"mla_paged_decode_combine: o spans [0x100000180, 0x100000200), which overlaps o_partial's "
                       "[0x100000000, 0x100000200)"});
  test::require_error([&] { combine(ml + 8); }, bad, {"which overlaps ml_partial's [0x200000000, 0x200000010)"});
  test::require_error([&] { combine(DevicePtr{sinks.addr - 127}); }, bad,
                      {"which overlaps sinks' [0x300000000, 0x300000004)"});
  const std::uint64_t launches = gpu.calls(emu::Op::launch);
  for (const DevicePtr o : {partials + 512, DevicePtr{sinks.addr - 128}, sinks + 4}) combine(o);  // abutting: apart
  CHECK(gpu.calls(emu::Op::launch) == launches + 3);
}

// The combine deals a head's 64-dim tiles to dim_blocks blocks (combine_dim_blocks), whose
// threads split into 1, 2 or 4 lanes of chunks by the tiles they get; a dim's sum must depend on
// neither: the same bits with one block per head (9 tiles, one lane), one per tile (four lanes),
// runs of 2 (5 blocks: two lanes, the last block one tile) and of 3 (4 blocks: one idle).
TEST_CASE("the combine's result does not depend on its blocks per head", "[mla_fast][combine]") {
  const KernelCase c = gen::combine_case(3, 16, 576, 12, true, 5);
  CHECK(combine_dim_blocks({{}, {}, {}, {}, 16, 576, 12, 1.0f, 1}, 132) == 9);    // 16 heads: a block per tile
  CHECK(combine_dim_blocks({{}, {}, {}, {}, 16, 576, 12, 1.0f, 32}, 132) == 3);   // 512 heads: 1056 / 512 → 3
  CHECK(combine_dim_blocks({{}, {}, {}, {}, 128, 576, 12, 1.0f, 128}, 132) == 1);
  // A public helper: zero counts (which the launcher refuses) give one block, not a division by
  // zero (twentieth session's adversarial run: SIGFPE).
  CHECK(combine_dim_blocks(CombineArgs{}, 132) == 1);
  for (const auto& name : test::backends()) {
    INFO("backend " << name);
    auto gpu = test::make_backend(name);
    const KernelHandle k = gpu->kernel("mla_fast", "mla_paged_decode_combine");
    const std::map<std::string, DeviceBuffer> in = upload_inputs(*gpu, c);
    std::vector<std::vector<Bf16>> outs;
    for (std::uint32_t blocks : {1u, 9u, 5u, 4u}) {
      upload<std::byte>(*gpu, c.inputs.at("o").data, in.at("o").ptr());  // NaN again: each run writes every dim
      KernelLaunch(*gpu, k)
          .grid({16, 3, blocks})
          .block({256, 1, 1})
          .arg_ptr(in.at("o_partial").ptr())
          .arg_ptr(in.at("ml_partial").ptr())
          .arg_ptr(in.at("sinks").ptr())
          .arg_ptr(in.at("o").ptr())
          .arg_u32(16)
          .arg_u32(576)
          .arg_u32(12)
          .arg_f32(c.scalars.at("v_scale").as_f32())
          .launch();
      gpu->synchronize(0);
      outs.push_back(in.at("o").to_host<Bf16>());
    }
    CHECK(outs[1] == outs[0]);
    CHECK(outs[2] == outs[0]);
    CHECK(outs[3] == outs[0]);
    CHECK(std::none_of(outs[0].begin(), outs[0].end(), [](Bf16 x) { return std::isnan(x.to_float()); }));
  }
}

TEST_CASE("the wide GEMV matches the float64 reference", "[mla_fast][gemv]") {
  for (auto [n, k, h, ip, op] :
       {std::array<std::uint32_t, 5>{1, 8, 1, 0, 0}, {7, 24, 3, 8, 5}, {65, 736, 2, 8, 1}, {512, 128, 16, 64, 64}}) {
    KernelCase c = gen::gemv_case(n, k, h, ip, op, 3);
    c.module = "mla_fast", c.entry = "mla_batched_gemv_wide";
    test::check_case(c);
  }
}

// Started early, the wide GEMV may read its input only once the kernel ahead of it has written
// it: a chain of GEMVs, each reading what the one before wrote (NaN until then), checked link by
// link against the float64 product of the input the device held. On the emulator each launch
// runs after the last has ended; on a GPU each GEMV's blocks start while the one ahead finishes.
TEST_CASE("a wide GEMV started early reads what the GEMV ahead of it wrote", "[mla_fast][gemv]") {
  constexpr std::uint32_t H = 128, d = 128, links = 12;  // [H, d] · [H, d, d] → [H, d]
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> uni(-0.15f, 0.15f);
  auto random = [&](std::size_t n) {
    std::vector<Bf16> v(n);
    for (auto& x : v) x = Bf16::from_float(uni(rng));
    return v;
  };
  std::vector<std::vector<Bf16>> w;
  for (std::uint32_t i = 0; i < links; ++i) w.push_back(random(std::size_t{H} * d * d));
  const std::vector<Bf16> x0 = random(std::size_t{H} * d), poison(std::size_t{H} * d, Bf16{0x7FC0});
  for (const auto& name : test::backends()) {
    INFO("backend " << name);
    auto gpu = test::make_backend(name);
    const auto fast = MlaFastKernels::resolve(*gpu);
    std::vector<DeviceBuffer> act, wd;
    act.push_back(DeviceBuffer::from_host<Bf16>(*gpu, x0));
    for (std::uint32_t i = 0; i < links; ++i) {
      act.push_back(DeviceBuffer::from_host<Bf16>(*gpu, poison));
      wd.push_back(DeviceBuffer::from_host<Bf16>(*gpu, w[i]));
    }
    for (std::uint32_t i = 0; i < links; ++i)
      mla_batched_gemv_wide(*gpu, fast.gemv_wide, {act[i].ptr(), wd[i].ptr(), act[i + 1].ptr(), d, d, H, d, d}, 0,
                            GemvStart::early);
    gpu->synchronize(0);
    for (std::uint32_t i = 0; i < links; ++i) {
      INFO("link " << i);
      std::vector<float> in, wf;
      for (Bf16 x : act[i].to_host<Bf16>()) in.push_back(x.to_float());
      for (Bf16 x : w[i]) wf.push_back(x.to_float());
      const std::vector<double> want = ref::batched_gemv(in, wf, d, d, H, d);
      const std::vector<Bf16> got = act[i + 1].to_host<Bf16>();
      double worst = 0;  // in units of the bound: the BF16 output, 1e-4 for the FP32 sum (about 5e-6 here)
      for (std::size_t j = 0; j < want.size(); ++j)
        worst = std::max(worst, std::fabs(got[j].to_float() - want[j]) / (0x1p-8 * std::fabs(want[j]) + 1e-4));
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("the split plan covers every key with whole tiles and fits the device's shared memory", "[mla_fast][plan]") {
  PagedDecodeCommon a;
  a.num_seqs = GENERATE(1u, 3u, 128u), a.num_q_heads = GENERATE(1u, 16u, 17u, 128u);
  a.max_blocks_per_seq = GENERATE(1u, 7u, 1024u), a.block_size = 16, a.kv_cache_dim = GENERATE(64u, 576u);
  const std::uint32_t comp = GENERATE(0u, 5u);
  const KvFormat format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  const std::uint32_t limit = GENERATE(227u * 1024, 99u * 1024);  // sm_90, sm_121
  const SplitPlan p = plan_split_decode(a, format, comp, 132, limit);
  INFO("num_seqs " << a.num_seqs << " heads " << a.num_q_heads << " blocks " << a.max_blocks_per_seq << " dim "
                   << a.kv_cache_dim << " limit " << limit);
  CHECK(p.keys_per_split % 32 == 0);
  CHECK(std::uint64_t{p.keys_per_split} * p.num_splits >= std::uint64_t{a.max_blocks_per_seq} * a.block_size + comp);
  CHECK(std::uint64_t{p.keys_per_split} * (p.num_splits - 1) <
        std::uint64_t{a.max_blocks_per_seq} * a.block_size + comp + 32);
  CHECK(p.rows_per_block * p.head_groups >= a.num_q_heads);
  CHECK(p.threads == 8 * p.rows_per_block);
  CHECK(p.shared_bytes <= limit);
  // Shared memory, from the kernel's carve-up: q, one tile buffer (K, then V), P (FP16, rows
  // padded by 8), the softmax exchange, two tiles' row pointers, and a raw tile when staged.
  const std::uint32_t pitch = a.kv_cache_dim + 8, raw = format == KvFormat::fp8 ? 2 * a.kv_cache_dim : 0;
  const std::uint32_t fixed =
      (p.rows_per_block * pitch + 32 * pitch + p.rows_per_block * 40) * 2 + p.rows_per_block * 32 + 2048;
  if (format == KvFormat::fp8) CHECK(p.shared_bytes == fixed + (p.staged ? 32 * raw : 0));
  // Of the model's rows, an sm_90 SM holds one block of 64 heads, staged (158 KB FP8) or not
  // (121 KB), so it is staged; two of 32 heads unstaged (80 KB), but only one staged FP8 block:
  // those are not; NVFP4's smaller raw tile (21 KB) keeps two staged 32-head blocks. 16-head
  // blocks are never staged (their entry holds the next half-tile in registers); larger blocks of
  // small rows always are. sm_121's 99 KiB hold one block of up to 48 heads (99 KB) unstaged,
  // staged only with 32 heads of NVFP4 (99 KB).
  const std::uint32_t groups = (a.num_q_heads + 15) / 16;
  const bool fp8 = format == KvFormat::fp8;
  if (limit == 227u * 1024) {
    CHECK(p.rows_per_block == 16 * std::min(groups, 4u));
    if (a.kv_cache_dim == 576) CHECK(p.staged == (p.rows_per_block >= (fp8 ? 64u : 32u)));
    if (a.kv_cache_dim == 64) CHECK(p.staged == (p.rows_per_block > 16));
  } else if (a.kv_cache_dim == 576) {
    CHECK(p.rows_per_block == 16 * std::min(groups, 3u));
    CHECK(p.staged == (!fp8 && p.rows_per_block == 32));
  }
  const std::uint64_t slots = std::uint64_t{a.num_seqs} * a.num_q_heads * p.num_splits;
  CHECK(p.workspace_bytes == slots * a.kv_cache_dim * 4 + slots * 8);
}

// The splits fill the device in whole rounds (cost: rounds × (tiles per split + 1)): 32 sequences
// of 4096 keys, 16 heads, on 132 SMs that hold three 16-head blocks each (396 slots): 12 splits
// of 11 tiles (384 blocks, one round: 12) beat 9 of 15 (288 blocks, two rounds: 32) and 13 of
// 10 (416 blocks, two rounds: 22). One sequence of 1024 keys takes the shortest splits, 4 tiles.
TEST_CASE("the split plan fills the device's block slots in whole rounds", "[mla_fast][plan]") {
  PagedDecodeCommon a;
  a.num_seqs = 32, a.num_q_heads = 16, a.max_blocks_per_seq = 64, a.block_size = 64, a.kv_cache_dim = 576;
  const SplitPlan p = plan_split_decode(a, KvFormat::fp8, 0, 132, 227 * 1024);
  CHECK(p.rows_per_block == 16);
  CHECK(!p.staged);
  CHECK(p.num_splits == 12);
  CHECK(p.keys_per_split == 11 * 32);
  // 128 heads in groups of 64, one block per SM: 2 splits of 64 tiles (128 blocks of 132: 65),
  // not 43 splits of 3 tiles (2752 blocks, 21 rounds: 84).
  a.num_q_heads = 128;
  const SplitPlan q = plan_split_decode(a, KvFormat::fp8, 0, 132, 227 * 1024);
  CHECK(q.rows_per_block == 64);
  CHECK(q.num_splits == 2);
  CHECK(q.keys_per_split == 2048);
  a.num_seqs = 1, a.max_blocks_per_seq = 16;
  const SplitPlan one = plan_split_decode(a, KvFormat::fp8, 0, 132, 227 * 1024);
  CHECK(one.num_splits == 8);
  CHECK(one.keys_per_split == 128);
  // Degenerate but callable: a table of no keys, a device reported with no SMs.
  a.max_blocks_per_seq = 0;
  const SplitPlan none = plan_split_decode(a, KvFormat::fp8, 0, 0, 227 * 1024);
  CHECK(none.num_splits == 1);
  CHECK(none.keys_per_split == 32);
}

TEST_CASE("a split plan that cannot fit the device's shared memory says so", "[mla_fast][plan]") {
  PagedDecodeCommon a;
  a.num_seqs = 1, a.num_q_heads = 16, a.max_blocks_per_seq = 4, a.block_size = 16, a.kv_cache_dim = 576;
  test::require_error([&] { plan_split_decode(a, KvFormat::fp8, 0, 132, 48 * 1024); }, Errc::unsupported,
                      {"59904 bytes", "49152"});
}

TEST_CASE("the split path runs with an sm_121's shared memory on the emulator", "[mla_fast][split]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 128, p.block_size = 16, p.num_seqs = 2;
  p.max_blocks_per_seq = 8, p.num_blocks = 16, p.seq_lens = {100, 33};
  const KernelCase c = gen::split_path_case(p);
  emu::EmulatorOptions small;
  small.max_shared_bytes_per_block = 99 * 1024;
  emu::EmulatorBackend gpu(small);
  const auto out = run_kernel_case(gpu, c);
  CHECK(check_output("o", out.at("o"), c.expected.at("o"), c.tolerance.at("o")).pass);
}

// A device whose shared memory holds the heads-in-M block but not the register-operand 64-head
// block (between their sizes) still runs a latent 64-head step of 4200 keys on the heads-in-M
// block, and a two-pool step on the mma.sync blocks; both match the float64 reference. (Until the
// plan counted the heads-in-M block, the latent step fell back to mma.sync there.) The latent step
// is one launch of the cluster entry: on two SMs one chunk of 4200 keys a sequence (a cluster of
// one), on four two chunks of 2112 keys combined in their clusters.
TEST_CASE("the heads-in-M block runs where it fits and the register-operand block does not",
          "[mla_fast][dispatch][latent]") {
  const std::uint32_t latent_bytes = wgmma_latent_shared_bytes(), wide_bytes = wgmma_shared_bytes(KvFormat::fp8, 64);
  REQUIRE(latent_bytes < wide_bytes);
  emu::EmulatorOptions o;
  o.max_shared_bytes_per_block = latent_bytes + (wide_bytes - latent_bytes) / 2;
  o.multiprocessor_count = GENERATE(2u, 4u);  // work enough for 64-head blocks (wgmma_rows)
  emu::EmulatorBackend gpu(o);
  gpu.record_launches(true);
  const bool latent = GENERATE(true, false);
  INFO((latent ? "one latent pool" : "two pools") << ", " << o.max_shared_bytes_per_block << " bytes a block, "
                                                  << o.multiprocessor_count << " SMs");
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 64, p.block_size = 7, p.num_seqs = 2;
  p.max_blocks_per_seq = 600, p.num_blocks = 150, p.seq_lens = {320, 130}, p.fill = -1, p.sinks = true;
  p.k_scale = 0.5f, p.v_scale = 0.021f, p.key_ramp = 2.0f, p.latent = latent;
  const KernelCase c = gen::split_path_case(p);
  test::check_expected(gpu, c);
  std::vector<std::string> entries;
  for (const auto& l : gpu.launch_log()) entries.push_back(l.entry);
  INFO(fmt::format("{}", fmt::join(entries, ", ")));
  const std::string decode = latent ? "mla_paged_decode_wgmma_latent_fp8" : "mla_paged_decode_split_fp8";
  if (latent) {
    CHECK(entries == std::vector<std::string>{"mla_paged_decode_wgmma_latent_combine_fp8"});
    CHECK(gpu.launch_log()[0].cluster.x == (o.multiprocessor_count == 4 ? 2u : 1u));  // chunks a sequence
  } else {
    CHECK(entries == std::vector<std::string>{decode, "mla_paged_decode_combine"});
  }
}

TEST_CASE("on a device with too little shared memory the dispatcher takes the seed kernel", "[mla_fast][dispatch]") {
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 16, p.block_size = 16, p.seq_lens = {40};
  emu::EmulatorOptions small;
  small.max_shared_bytes_per_block = 48 * 1024;
  emu::EmulatorBackend gpu(small);
  const KernelCase seed = gen::paged_decode_case(p);
  CHECK(check_output("o", run_kernel_case(gpu, seed).at("o"), seed.expected.at("o"), seed.tolerance.at("o")).pass);
  test::require_error([&] { run_kernel_case(gpu, gen::split_path_case(p)); }, Errc::unsupported,
                      {"49152 bytes of shared memory"});
}

// Staged (cp.async) and direct tiles must give the same bits: run the raw split kernel both
// ways on every backend (on the emulator both run the one port; on a GPU, two code paths).
TEST_CASE("the staged and direct split kernels give bit-identical partials", "[mla_fast][split]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = GENERATE(16u, 40u, 128u), p.block_size = 16;
  p.num_seqs = 3, p.max_blocks_per_seq = 24, p.num_blocks = 80, p.seq_lens = {300, 0, 97};
  p.fill = -1, p.k_scale = 0.013f, p.v_scale = 0.021f;
  const KernelCase c = gen::split_path_case(p);
  for (const auto& name : test::backends()) {
    INFO("backend " << name << " format " << to_string(p.format) << " heads " << p.num_q_heads);
    auto gpu = test::make_backend(name);
    const std::map<std::string, DeviceBuffer> in = upload_inputs(*gpu, c);
    PagedDecodeCommon a;
    a.max_blocks_per_seq = p.max_blocks_per_seq, a.num_q_heads = p.num_q_heads, a.num_kv_heads = 1;
    a.q_head_dim = a.kv_cache_dim = 576, a.block_size = p.block_size, a.num_seqs = p.num_seqs;
    const SplitPlan plan = plan_split_decode(a, p.format, 0, gpu->multiprocessor_count(), 227 * 1024);
    const auto fast = MlaFastKernels::resolve(*gpu);
    std::vector<std::vector<std::byte>> results;
    // Staged and direct on the split entry; for 16-head blocks also the 16-head entry (registers).
    const bool split16 = plan.rows_per_block == 16;
    for (const int run : {0, 1, 2}) {
      if (run == 2 && !split16) break;
      const bool staged = run == 0;
      const DeviceBuffer ws(*gpu, plan.workspace_bytes);
      SplitDecodeArgs s{in.at("q").ptr(),
                        in.at("k_cache").ptr(),
                        in.at("v_cache").ptr(),
                        ws.ptr(),
                        ws.ptr() + plan.ml_offset,
                        in.at("block_tables").ptr(),
                        in.at("seq_lens").ptr(),
                        a.max_blocks_per_seq,
                        a.num_q_heads,
                        576,
                        576,
                        a.block_size,
                        0.07f,
                        plan.keys_per_split,
                        a.num_seqs,
                        plan.num_splits,
                        plan.rows_per_block,
                        staged};
      const auto u64 = [&](const char* field) { return c.scalars.at(field).bits; };
      if (p.format == KvFormat::fp8) {
        mla_paged_decode_split_fp8(*gpu, run == 2 ? fast.split16_fp8 : fast.split_fp8,
                                   {s, u64("cache_stride"), 0, {}, 0});
      } else {
        mla_paged_decode_split_nvfp4(*gpu, run == 2 ? fast.split16_nvfp4 : fast.split_nvfp4,
                                     {s, u64("block_stride_bytes"), u64("data_section_bytes")});
      }
      gpu->synchronize(0);
      results.push_back(ws.to_host<std::byte>());
    }
    // (Compared into a bool: Catch2 would print both byte vectors for each passing check with -s.)
    const bool staged_same = results[0] == results[1];
    CHECK(staged_same);
    if (split16) {
      const bool split16_same = results[0] == results[2];
      CHECK(split16_same);
    }
  }
}

// What --record writes for a split-path step (the split kernel, then the combine) replays: each
// file names its launch shape only through grid and block (num_splits, num_seqs, rows per block).
TEST_CASE("a recorded split-path step replays kernel by kernel", "[mla_fast][recorded]") {
  gen::PagedSpec p;
  p.format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  p.q_head_dim = p.kv_cache_dim = 576, p.block_size = 16, p.num_seqs = 2, p.max_blocks_per_seq = 12;
  p.num_blocks = 30, p.seq_lens = {150, 41};
  p.num_q_heads = GENERATE(16u, 24u, 40u);  // the wgmma16 entry, the split entry, the wgmma entry
  if (p.format == KvFormat::fp8) p.sinks = true, p.k_scale = 0.013f, p.v_scale = 0.021f;
  // 40 heads recorded on one SM: a step too large for 16-head blocks (wgmma_rows), which the
  // emulator's 132 SMs take for 3 tiles a sequence. The combine's grid, sized to the SMs (one dim
  // block here), replays with check_case's backends' own.
  const bool wide = p.num_q_heads == 40;
  const auto dir = test::scratch_dir("metrale_split_recorder_test");
  std::filesystem::remove_all(dir);
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    if (wide) o.multiprocessor_count = 1;
    emu::EmulatorBackend gpu(o);
    run_kernel_case(gpu, gen::split_path_case(p));
  }
  const std::string f{to_string(p.format)};
  const std::uint32_t rows = wide ? 64 : p.num_q_heads == 24 ? 32 : 16;
  const std::string split = (rows == 16   ? "mla_paged_decode_wgmma16_"
                             : rows == 32 ? "mla_paged_decode_split_"
                                          : "mla_paged_decode_wgmma_") +
                            f;
  std::set<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const KernelCase rec = read_kernel_case(e.path());
    entries.insert(rec.entry);
    if (rec.entry == split) {
      CHECK(rec.scalars.at("num_seqs").as_u32() == 2);
      CHECK(rec.scalars.at("rows_per_block").as_u32() == rows);
      // A GPU's expf may round a P element to FP16 the other way than the port's std::exp: the
      // partial outputs get a floor of 2^-10 of their largest value, here and between backends.
      double peak = 0;
      for (float v : rec.expected.at("o_partial").values<float>()) peak = std::max(peak, std::fabs(double{v}));
      CHECK(rec.tolerance.at("o_partial").abs == 0x1p-10 * peak);
      CHECK(rec.backend_tolerance.at("o_partial").abs == 0x1p-10 * peak);
      CHECK(rec.tolerance.at("ml_partial").rel == 1e-6);
      CHECK(rec.backend_tolerance.count("ml_partial") == 0);
    }
    CHECK(rec.expected.size() >= 1);
    test::check_case(rec);
  }
  // FP8 at 40 heads on one SM: the 64-head blocks combine in their clusters (one kernel, no partials).
  if (wide && p.format == KvFormat::fp8) {
    CHECK(entries == std::set<std::string>{"mla_paged_decode_wgmma_combine_fp8"});
  } else {
    CHECK(entries == std::set<std::string>{split, "mla_paged_decode_combine"});
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the dispatcher takes the seed kernel where the split path does not apply", "[mla_fast][dispatch]") {
  emu::EmulatorBackend gpu;
  const auto seed = MlaAbsorbedKernels::resolve(gpu);
  const auto fast = MlaFastKernels::resolve(gpu);
  gen::PagedSpec p;
  p.kv_cache_dim = 40, p.q_head_dim = 32, p.seq_lens = {9};  // 40 is not a multiple of 64
  const KernelCase c = gen::paged_decode_case(p);
  const std::map<std::string, DeviceBuffer> bufs = upload_inputs(gpu, c);
  PagedDecodeFp8Args a;
  a.q = bufs.at("q").ptr(), a.k_cache = bufs.at("k_cache").ptr(), a.v_cache = bufs.at("v_cache").ptr();
  a.o = bufs.at("o").ptr(), a.block_tables = bufs.at("block_tables").ptr(), a.seq_lens = bufs.at("seq_lens").ptr();
  a.max_blocks_per_seq = p.max_blocks_per_seq, a.num_q_heads = 1, a.q_head_dim = 32, a.kv_cache_dim = 40;
  a.block_size = p.block_size, a.inv_sqrt_d = p.inv_sqrt_d, a.num_seqs = 1, a.k_scale = p.k_scale;
  a.v_scale = p.v_scale, a.cache_stride = 40;
  REQUIRE(split_unsupported(a).has_value());
  CHECK_THAT(*split_unsupported(a), Catch::Matchers::Contains("kv_cache_dim 40"));
  DecodeWorkspace ws;
  CHECK(paged_decode_fp8(gpu, seed, fast, a, ws) == DecodePath::seed);
  const auto o = download<Bf16>(gpu, a.o, 40);
  const auto& want = c.expected.at("o");
  CHECK(check_output("o",
                     Tensor{Dtype::bf16,
                            {1, 1, 40},
                            std::vector<std::byte>(reinterpret_cast<const std::byte*>(o.data()),
                                                   reinterpret_cast<const std::byte*>(o.data() + o.size()))},
                     want, c.tolerance.at("o"))
            .pass);
}

// A NaN sink poisons the heads of a sequence with keys; a sequence without keys writes zeros, sink
// or not (SPEC §3: "an empty key set writes zeros (never NaN), with or without a sink"). Seed
// kernel, split path (its combine, one chunk and over four) and the cluster entry, on every backend.
TEST_CASE("a NaN sink gives NaN where there are keys and zeros where there are none", "[mla_fast][nan][sinks]") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  gen::PagedSpec p;
  p.q_head_dim = 64, p.kv_cache_dim = 64, p.num_q_heads = 2, p.num_seqs = 2, p.seq_lens = {5, 0}, p.sinks = true;
  p.num_blocks = 4;
  gen::PagedSpec wide = fused_spec(20, 10);
  wide.comp_pool = false, wide.comp_block_count = 0;  // sequence 1 has no keys
  std::vector<KernelCase> cases{gen::paged_decode_case(p), gen::split_path_case(p), gen::fused_decode_case(wide, 1)};
  for (const auto& name : test::backends()) {
    auto gpu = test::make_backend(name);
    for (KernelCase c : cases) {
      INFO("backend " << name << ", entry " << c.entry);
      if (entry_unavailable(*gpu, c.module, c.entry)) continue;
      const auto heads = static_cast<std::size_t>(c.inputs.at("sinks").shape.at(0));
      c.inputs["sinks"] = Tensor::from<float>({static_cast<std::int64_t>(heads)},
                                              std::vector<float>(heads, std::numeric_limits<float>::quiet_NaN()));
      const auto out = run_kernel_case(*gpu, c).at("o").to_f32();
      const auto per_seq = out.size() / static_cast<std::size_t>(c.inputs.at("o").shape.at(0));
      CHECK(std::all_of(out.begin(), out.begin() + per_seq, [](float x) { return std::isnan(x); }));
      CHECK(std::all_of(out.begin() + per_seq, out.begin() + 2 * per_seq, [](float x) { return x == 0.0f; }));
    }
    // The combine alone over 8 chunks (its block-wide reductions; 4 or fewer take combine_few):
    // sequence 1's chunks all without keys.
    KernelCase c = gen::combine_case(2, 3, 64, 8, true, 5);
    auto ml = c.inputs.at("ml_partial").to_f32();
    for (std::size_t i = ml.size() / 2; i < ml.size(); i += 2) ml[i] = -kInf, ml[i + 1] = 0.0f;
    c.inputs["ml_partial"] = Tensor::from<float>(c.inputs.at("ml_partial").shape, ml);
    c.inputs["sinks"] = Tensor::from<float>({3}, std::vector<float>(3, std::numeric_limits<float>::quiet_NaN()));
    const auto out = run_kernel_case(*gpu, c).at("o").to_f32();
    REQUIRE(out.size() == 2 * 3 * 64);
    for (std::size_t row = 0; row < 2 * 3; ++row) {  // (sequence, head): NaN where a chunk has keys
      bool keys = false;
      for (std::size_t z = 0; z < 8; ++z) keys = keys || ml[2 * (row * 8 + z) + 1] != 0.0f;
      CHECK(keys == (row < 3));
      const auto head = std::span(out).subspan(row * 64, 64);
      CHECK(std::all_of(head.begin(), head.end(), [&](float x) { return keys ? std::isnan(x) : x == 0.0f; }));
    }
  }
}

// SPEC §3's sink term e^(sink − m), m = max(logits, sink), is inf − inf for a +inf sink; the
// kernels take its limit: the sink is the whole denominator and o = 0. A −inf sink adds nothing:
// o is the bits of the launch without sinks, and an empty sequence's zeros (the seed kernel's
// rescale had made them e^(−inf − (−inf)) = NaN). Seed kernel, split path (its combine) and the
// cluster entry (its combine in distributed shared memory), on every backend.
TEST_CASE("an infinite sink: +inf gives zeros, −inf the output without sinks", "[mla_fast][sinks]") {
  gen::PagedSpec p;
  p.q_head_dim = 64, p.kv_cache_dim = 64, p.num_q_heads = 3, p.num_seqs = 2, p.seq_lens = {5, 0}, p.sinks = true;
  p.num_blocks = 4;
  gen::PagedSpec wide = fused_spec(20, 10);
  std::vector<KernelCase> cases{gen::paged_decode_case(p), gen::split_path_case(p), gen::fused_decode_case(wide, 1)};
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const auto& name : test::backends()) {
    auto gpu = test::make_backend(name);
    for (const KernelCase& base : cases) {
      INFO("backend " << name << ", entry " << base.entry);
      if (entry_unavailable(*gpu, base.module, base.entry)) continue;
      const auto heads = static_cast<std::size_t>(base.inputs.at("sinks").shape.at(0));
      auto with_sinks = [&](float value) {
        KernelCase c = base;
        c.inputs["sinks"] = Tensor::from<float>({static_cast<std::int64_t>(heads)}, std::vector<float>(heads, value));
        return run_kernel_case(*gpu, c).at("o").to_f32();
      };
      const auto plus = with_sinks(kInf);
      REQUIRE(!plus.empty());
      CHECK(std::all_of(plus.begin(), plus.end(), [](float x) { return x == 0.0f; }));
      KernelCase none = base;
      none.inputs.erase("sinks");
      const auto want = run_kernel_case(*gpu, none).at("o").to_f32();
      const auto minus = with_sinks(-kInf);
      CHECK(std::equal(minus.begin(), minus.end(), want.begin(), want.end(), [](float a, float b) {
        return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
      }));
      CHECK(std::none_of(want.begin(), want.end(), [](float x) { return std::isnan(x); }));
    }
  }
}
