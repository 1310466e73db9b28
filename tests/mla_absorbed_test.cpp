// Each kernel of module mla_absorbed against the float64 reference, on the
// emulator and, when a device answers, on CUDA (also against the emulator), at
// odd sizes and the model's, outputs poisoned first: the expectations keep NaN
// (or the poison bytes) wherever nothing may be written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>

#include "metrale/case_gen.hpp"
#include "support.hpp"

using namespace metrale;

TEST_CASE("mla_batched_gemv matches the float64 reference", "[mla_absorbed][gemv]") {
  struct Shape {
    std::uint32_t n_out, k, heads, in_pad, out_pad;
  };
  const Shape s = GENERATE(Shape{1, 1, 1, 0, 0}, Shape{3, 7, 1, 2, 1}, Shape{7, 19, 3, 0, 5}, Shape{19, 733, 7, 3, 0},
                           Shape{733, 3, 1, 0, 2}, Shape{9, 33, 19, 1, 1},
                           Shape{512, 128, 16, 64, 64},  // absorb: q_full → q_absorbed
                           Shape{128, 512, 8, 64, 0});   // W_UV: o → attn_out
  test::check_case(gen::gemv_case(s.n_out, s.k, s.heads, s.in_pad, s.out_pad, 7));
}

TEST_CASE("mla_q_rope_scatter and _writeback copy exactly the rope columns", "[mla_absorbed][rope]") {
  test::check_case(gen::q_rope_scatter_case(1, 1, 1, 1, 0, 0, 1));
  test::check_case(gen::q_rope_scatter_case(3, 7, 2, 19, 1, 3, 2));
  test::check_case(gen::q_rope_scatter_case(733, 2, 3, 5, 1, 1, 3));
  test::check_case(gen::q_rope_scatter_case(16, 128, 64, 512, 0, 0, 4));
  test::check_case(gen::q_rope_writeback_case(1, 1, 1, 0, 5));
  test::check_case(gen::q_rope_writeback_case(19, 7, 3, 2, 6));
  test::check_case(gen::q_rope_writeback_case(128, 64, 512, 0, 7));
}

TEST_CASE("mla_cache_assemble builds [latent | rope | 0] and [latent | 0]", "[mla_absorbed][assemble]") {
  test::check_case(gen::cache_assemble_case(1, 0, 1, 1));
  test::check_case(gen::cache_assemble_case(3, 1, 7, 2));
  test::check_case(gen::cache_assemble_case(19, 3, 733, 3));
  test::check_case(gen::cache_assemble_case(512, 64, 576, 4));
  test::check_case(gen::cache_assemble_case(733, 19, 1024, 5));
}

TEST_CASE("rope_pairs_bf16 matches the float64 rotation", "[mla_absorbed][rope]") {
  test::check_case(gen::rope_case(1, 2, 0, 10000, 1));
  test::check_case(gen::rope_case(3, 64, 1, 10000, 2));
  test::check_case(gen::rope_case(7, 6, 19, 50000, 3));
  test::check_case(gen::rope_case(733, 2, 7, 10000, 4));
  test::check_case(gen::rope_case(16, 64, 4095, 10000, 5));
  test::check_case(gen::rope_case(1, 64, 65535, 1e6f, 6));
}

TEST_CASE("mla_paged_cache_store_fp8 and _nvfp4 write the encoded rows at their slots", "[mla_absorbed][store]") {
  test::check_case(gen::cache_store_case(KvFormat::fp8, 1, 1, 1, 2, 1, 1));
  test::check_case(gen::cache_store_case(KvFormat::fp8, 3, 7, 3, 3, 9, 2));
  test::check_case(gen::cache_store_case(KvFormat::fp8, 19, 733, 7, 5, 736, 3));
  test::check_case(gen::cache_store_case(KvFormat::fp8, 7, 576, 16, 2, 576, 4));
  test::check_case(gen::cache_store_case(KvFormat::nvfp4, 1, 16, 1, 2, 0, 5));
  test::check_case(gen::cache_store_case(KvFormat::nvfp4, 7, 48, 3, 5, 0, 6));
  test::check_case(gen::cache_store_case(KvFormat::nvfp4, 19, 576, 16, 3, 0, 7));
  test::check_case(gen::cache_store_case(KvFormat::nvfp4, 3, 1024, 1, 4, 0, 8));
}

TEST_CASE("mla_paged_decode_fp8 matches the float64 reference", "[mla_absorbed][paged][fp8]") {
  gen::PagedSpec c;
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
  SECTION("sliding windows covering some, most and all keys, with sinks") {
    c.sinks = true, c.block_size = 4, c.num_seqs = 4, c.max_blocks_per_seq = 8, c.num_blocks = 32;
    c.seq_lens = {30, 5, 7, 0};
    c.sliding_window = GENERATE(1u, 6u, 7u, 31u);
  }
  SECTION("compressed pool of C entries, with and without a window") {
    c.comp_pool = true, c.comp_block_count = GENERATE(0u, 1u, 3u), c.sliding_window = GENERATE(0u, 2u);
    c.num_seqs = 3, c.block_size = 2, c.max_blocks_per_seq = 6, c.num_blocks = 18, c.seq_lens = {0, 3, 11};
    c.sinks = true;
  }
  test::check_case(gen::paged_decode_case(c));
}

TEST_CASE("mla_paged_decode_nvfp4 matches the float64 reference", "[mla_absorbed][paged][nvfp4]") {
  gen::PagedSpec c;
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
  test::check_case(gen::paged_decode_case(c));
}

TEST_CASE("the conformance sweep passes on every test backend", "[mla_absorbed][conform]") {
  for (const auto& c : gen::conformance_sweep(1)) test::check_case(c);
}

TEST_CASE("a kernel case survives the safetensors round trip and runs the same", "[kernel_case]") {
  gen::PagedSpec p;
  p.sinks = true, p.comp_pool = true, p.comp_block_count = 2, p.seq_lens = {9}, p.sliding_window = 3;
  const KernelCase c = gen::paged_decode_case(p);
  const KernelCase back = kernel_case_from(SafeTensors::parse(to_safetensors(c).serialize(), "mem"), "mem");
  CHECK(back.module == c.module);
  CHECK(back.entry == c.entry);
  CHECK(back.scalars == c.scalars);
  REQUIRE(back.inputs.size() == c.inputs.size());
  for (const auto& [name, t] : c.inputs) {
    INFO(name);
    const bool same = back.inputs.at(name).data == t.data;  // (not the bytes: -s would print them)
    CHECK(same);
  }
  CHECK(back.tolerance.at("o").abs == c.tolerance.at("o").abs);
  test::check_case(back);
}

TEST_CASE("the recorded kernel cases in cases/kernels replay and agree", "[kernel_case][recorded]") {
  const auto dir = std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels";
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    ++n;
    test::check_case(read_kernel_case(e.path()));
  }
  CHECK(n >= 10);
}

namespace {
// A 1-D FP32 tensor of `v`, for check_output's tests.
Tensor f32(const std::vector<float>& v) {
  Tensor t{Dtype::f32, {static_cast<std::int64_t>(v.size())}, std::vector<std::byte>(v.size() * 4)};
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}
}  // namespace

// A recorded split kernel's running maxima are −∞ for a chunk with no keys: equal infinities
// must compare equal (∞ − ∞ is NaN), and nothing else may meet an infinite expectation (a
// relative tolerance of ∞ once accepted 0 for +∞, and +∞ for −∞).
TEST_CASE("check_output passes equal infinities and NaN pairs, nothing else non-finite", "[kernel_case]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tolerance tol{1e-6, 1e-6, 0};
  CHECK(check_output("x", f32({-inf, inf, nan, 1.0f}), f32({-inf, inf, nan, 1.0f}), tol).pass);
  for (const auto& [got, want] : std::vector<std::pair<float, float>>{
           {inf, -inf}, {-inf, 0.0f}, {0.0f, inf}, {nan, inf}, {inf, nan}, {nan, 1.0f}}) {
    INFO("got " << got << " want " << want);
    CHECK(check_output("x", f32({got}), f32({want}), tol).bad == 1);
  }
}

// BF16 ULPs count between finite values only: on the bit line +∞ is one ULP past the largest finite
// value and NaN payloads lie just past +∞, so a recorded case's 1-ULP fallback once passed them.
TEST_CASE("check_output's ULP fallback never meets or passes an infinity or a NaN", "[kernel_case]") {
  auto bf16 = [](std::vector<std::uint16_t> bits) {
    Tensor t{Dtype::bf16, {static_cast<std::int64_t>(bits.size())}, std::vector<std::byte>(bits.size() * 2)};
    std::memcpy(t.data.data(), bits.data(), t.data.size());
    return t;
  };
  const Tolerance tol{0, 0, 64};
  constexpr std::uint16_t kMax = 0x7F7F, kInf = 0x7F80, kNan = 0x7F81, kNanCanonical = 0x7FC0;
  CHECK(check_output("o", bf16({0x7F7E}), bf16({kMax}), tol).pass);  // finite: one ULP apart
  for (const auto& [got, want] : std::vector<std::pair<std::uint16_t, std::uint16_t>>{
           {kInf, kMax}, {kMax, kInf}, {kNan, kInf}, {kNanCanonical, kInf}, {kNan, kMax}}) {
    INFO("got " << got << " want " << want);
    CHECK(check_output("o", bf16({got}), bf16({want}), tol).bad == 1);
  }
}

// check_output and same_arithmetic_tolerance take a large tensor a slice of 2^20 values at a time
// (a KV cache's doubles had taken 8 bytes a byte of memory): indices, the worst value, the counts,
// the BF16 ULP fallback and the peak must hold across the slices' edges as over one whole tensor.
TEST_CASE("check_output and same_arithmetic_tolerance hold across 2^20-value slices", "[kernel_case]") {
  constexpr std::size_t kSlice = std::size_t{1} << 20, n = 3 * kSlice + 7;
  std::vector<float> want(n), got(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = got[i] = static_cast<float>(i % 1000) * 0.001f;
  want[2 * kSlice + 3] = 250.0f;  // the peak, in the third slice
  got[2 * kSlice + 3] = 250.0f;
  got[kSlice - 1] += 0.5f;  // bad, the last of the first slice
  got[kSlice] += 2.0f;      // bad, the first of the second: the worst
  got[n - 1] += 0.25f;      // bad, the last value
  const OutputCheck r = check_output("x", f32(got), f32(want), {1e-3, 0, 0});
  CHECK(r.count == n);
  CHECK(r.bad == 3);
  CHECK(r.worst.starts_with(fmt::format("[{}] got", kSlice)));
  CHECK(r.max_abs == Approx(2.0).epsilon(1e-6));
  const Tolerance peak = same_arithmetic_tolerance(f32(want), 1e-3);
  CHECK(peak.abs == Approx(0.25).epsilon(1e-9));  // 1e-3 × 250
  // BF16: 1.0 (0x3F80) against values 2 ULPs off in the second slice and 3 in the last
  std::vector<std::uint16_t> wb(n, 0x3F80), gb(n, 0x3F80);
  gb[kSlice + 1] = 0x3F82, gb[n - 1] = 0x3F83;
  auto bf16 = [](const std::vector<std::uint16_t>& bits) {
    Tensor t{Dtype::bf16, {static_cast<std::int64_t>(bits.size())}, std::vector<std::byte>(bits.size() * 2)};
    std::memcpy(t.data.data(), bits.data(), t.data.size());
    return t;
  };
  CHECK(check_output("o", bf16(gb), bf16(wb), {0, 0, 2}).bad == 1);
  CHECK(check_output("o", bf16(gb), bf16(wb), {0, 0, 2}).worst.starts_with(fmt::format("[{}] got", n - 1)));
  CHECK(check_output("o", bf16(gb), bf16(wb), {0, 0, 3}).pass);
}

// A report's worst element where nothing fails: the element nearest its tolerance (the fresh-user
// trial, forty-eighth session: every passing check's "worst" was empty, where the docs promise it).
TEST_CASE("check_output names the element nearest its tolerance when every element passes", "[kernel_case]") {
  const std::vector<float> want{1.0f, 2.0f, 4.0f, 8.0f};
  std::vector<float> got = want;
  got[1] += 0.5f;  // 0.5 of the 1 + 0.25·2 = 1.5 allowed: a third
  got[3] -= 2.0f;  // 2 of 1 + 0.25·8 = 3 allowed: two thirds, the nearest
  const OutputCheck r = check_output("x", f32(got), f32(want), {1.0, 0.25, 0});
  CHECK(r.pass);
  CHECK(r.worst == "[3] got 6 expected 8 (within its tolerance)");
  CHECK(r.tolerance_used == Approx(2.0 / 3.0));
  // an exact output has none; a failing one names the failing element, not the nearest passing one
  CHECK(check_output("x", f32(want), f32(want), {1.0, 0.25, 0}).worst.empty());
  got[0] += 10.0f;
  const OutputCheck bad = check_output("x", f32(got), f32(want), {1.0, 0.25, 0});
  CHECK(bad.bad == 1);
  CHECK(bad.worst == "[0] got 11 expected 1");
}

// A relative tolerance of ∞ (which parse_tolerance accepts) once failed exact zeros: ∞·0 is NaN.
TEST_CASE("check_output with an infinite relative tolerance passes exact zeros, fails off zero", "[kernel_case]") {
  const Tolerance tol{0, std::numeric_limits<double>::infinity(), 0};
  CHECK(check_output("x", f32({0.0f, 1.0f, -3.0f}), f32({0.0f, 5.0f, 2.0f}), tol).pass);
  CHECK(check_output("x", f32({1e-30f, 0.0f}), f32({0.0f, 0.0f}), tol).bad == 1);  // off an expected 0
  // A finite expectation is never met by an infinity (numpy's isclose), and the report's fraction
  // of the tolerance used, ∞ there, agrees with the failure.
  const float inf = std::numeric_limits<float>::infinity();
  for (const float got : {inf, -inf}) {
    INFO("got " << got);
    const auto r = check_output("x", f32({got}), f32({5.0f}), tol);
    CHECK(r.bad == 1);
    CHECK(std::isinf(r.tolerance_used));
  }
}

// conform's report puts each error beside the fraction of its tolerance it used: the largest
// |got − want| / (abs + rel·|want|) over the elements, or the ULPs over those allowed where that is
// less; infinite for a non-finite mismatch; at most 1 exactly when the check passes.
TEST_CASE("check_output reports the largest fraction of the tolerance used", "[kernel_case]") {
  const Tolerance tol{0.5, 0.25, 0};
  // Allowed: 0.5 + 0.25·|want| = 0.5, 1, 3; errors 0.25, 0.5, 1.5: fractions 0.5, 0.5, 0.5 — and 2 / 3.
  auto r = check_output("x", f32({0.25f, 2.5f, 11.5f, 12.0f}), f32({0.0f, 2.0f, 10.0f, 10.0f}), tol);
  CHECK(r.tolerance_used == Approx(2.0 / 3.0));
  CHECK(r.pass);
  r = check_output("x", f32({0.0f, 13.0f}), f32({0.0f, 10.0f}), tol);  // 3 of 3 allowed: the edge still passes
  CHECK(r.tolerance_used == Approx(1.0));
  CHECK(r.pass);
  r = check_output("x", f32({0.0f, 13.5f}), f32({0.0f, 10.0f}), tol);
  CHECK(r.tolerance_used == Approx(3.5 / 3.0));
  CHECK_FALSE(r.pass);
  CHECK(check_output("x", f32({1.0f}), f32({1.0f}), Tolerance{}).tolerance_used == 0.0);  // exact, nothing allowed
  CHECK(std::isinf(check_output("x", f32({1.5f}), f32({1.0f}), Tolerance{}).tolerance_used));
  CHECK(std::isinf(check_output("x", f32({std::numeric_limits<float>::quiet_NaN()}), f32({1.0f}), tol).tolerance_used));
  // BF16 with 2 ULPs allowed and no absolute part: 1.0 against 1.0078125 (one ULP) uses half.
  Tensor a{Dtype::bf16, {1}, std::vector<std::byte>(2)}, b = a;
  const std::uint16_t one = 0x3F80, next = 0x3F81;
  std::memcpy(a.data.data(), &one, 2), std::memcpy(b.data.data(), &next, 2);
  CHECK(check_output("o", a, b, Tolerance{0, 0, 2}).tolerance_used == Approx(0.5));
}

TEST_CASE("the recorder writes a launch that replays to the same bytes", "[kernel_case][recorded]") {
  const auto dir = test::scratch_dir("metrale_recorder_test");
  std::filesystem::remove_all(dir);
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    emu::EmulatorBackend gpu(o);
    const KernelCase c = gen::gemv_case(19, 33, 3, 1, 2, 5);
    run_kernel_case(gpu, c);
  }
  const KernelCase rec = read_kernel_case(dir / "0000_mla_batched_gemv.safetensors");
  CHECK(rec.scalars.at("num_heads").as_u32() == 3);  // from the recorded grid
  CHECK(rec.scalars.at("n_out").as_u32() == 19);
  REQUIRE(rec.expected.count("output") == 1);
  CHECK(rec.expected.count("input") == 0);  // unchanged buffers are inputs only
  // The recorded expectation is itself within the reference tolerance of the generated case.
  const KernelCase gen_case = gen::gemv_case(19, 33, 3, 1, 2, 5);
  CHECK(
      check_output("output", rec.expected.at("output"), gen_case.expected.at("output"), gen_case.tolerance.at("output"))
          .pass);
  test::check_case(rec);
  // A second run in the same folder numbers after the highest case there, so it overwrites none,
  // even where earlier numbers are missing.
  std::filesystem::rename(dir / "0000_mla_batched_gemv.safetensors", dir / "0007_mla_batched_gemv.safetensors");
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    emu::EmulatorBackend gpu(o);
    run_kernel_case(gpu, gen::gemv_case(5, 9, 2, 1, 2, 6));
  }
  CHECK(read_kernel_case(dir / "0007_mla_batched_gemv.safetensors").scalars.at("n_out").as_u32() == 19);
  CHECK(read_kernel_case(dir / "0008_mla_batched_gemv.safetensors").scalars.at("n_out").as_u32() == 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the recorder stops at its size limit before the launch that would pass it", "[kernel_case][recorded]") {
  // Before: no limit; a recording grows with every launch (a long replay's fills a disk).
  const auto dir = test::scratch_dir("metrale_recorder_limit_test");
  std::filesystem::remove_all(dir);
  const auto files = [&] {
    return std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{});
  };
  emu::EmulatorOptions o;
  o.record_dir = dir;
  o.record_limit_bytes = 1'000'000;
  emu::EmulatorBackend gpu(o);
  run_kernel_case(gpu, gen::gemv_case(19, 33, 3, 1, 2, 5));  // a few kB
  REQUIRE(files() == 1);
  CHECK_FALSE(gpu.recording_stopped());
  const std::uint64_t launches = gpu.calls(emu::Op::launch);
  // 4 heads x 256 x 512 bf16 weights: 1.05 MB of input alone.
  test::require_error([&] { run_kernel_case(gpu, gen::gemv_case(256, 512, 4, 0, 0, 6)); }, Errc::capacity_exceeded,
                      {"recorder: mla_batched_gemv (up to", "past its limit of 1.0 MB", "in 1 case)",
                       "the launch did not run", "--record-limit, METRALE_RECORD_LIMIT"});
  CHECK(gpu.calls(emu::Op::launch) == launches + 1);  // asked for, refused before it ran
  CHECK(files() == 1);                                // the first case stays, no second one begun
  CHECK(read_kernel_case(dir / "0000_mla_batched_gemv.safetensors").scalars.at("n_out").as_u32() == 19);
  // From then on the recording has stopped: a launch that would fit is refused too (before, it
  // was recorded after the gap; the fresh-user trial, forty-sixth session).
  CHECK(gpu.recording_stopped());
  test::require_error([&] { run_kernel_case(gpu, gen::gemv_case(19, 33, 3, 1, 2, 5)); }, Errc::capacity_exceeded,
                      {"recorder: the recording in", "stopped at its limit of 1.0 MB",
                       "in 1 case); the launch of "
                       "mla_batched_gemv did not run"});
  CHECK(files() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the recorder sizes a launch before it copies its buffers", "[kernel_case][recorded]") {
  // Before: each pointer argument's bytes, up to the end of its allocation, were copied before the
  // limit was checked, so refusing a GEMV over a 64 GiB allocation (mapped lazily, untouched) first
  // asked the host for 64 GiB.
  const auto dir = test::scratch_dir("metrale_recorder_sized_test");
  std::filesystem::remove_all(dir);
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    o.record_limit_bytes = 1'000'000;
    emu::EmulatorBackend gpu(o);
    const auto k = MlaAbsorbedKernels::resolve(gpu);
    const DeviceBuffer input(gpu, 64), output(gpu, 64), weights(gpu, std::size_t{64} << 30);
    test::require_error(
        [&] {
          mla_batched_gemv(gpu, k.batched_gemv, {input.ptr(), weights.ptr(), output.ptr(), 8, 4, 1, 4, 8});
        },
        Errc::capacity_exceeded, {"recorder: mla_batched_gemv (up to 68.7 GB)", "past its limit of 1.0 MB"});
  }
  std::filesystem::remove_all(dir);
}

// An output the launch left as it was is still an expectation: a GEMV over zero weights writes
// zeros into a zeroed output, which a replay on hardware must reproduce (before: no expectation,
// so any bytes there passed).
TEST_CASE("the recorder expects an output the launch left unchanged", "[kernel_case][recorded]") {
  const auto dir = test::scratch_dir("metrale_recorder_unchanged_test");
  std::filesystem::remove_all(dir);
  KernelCase c = gen::gemv_case(7, 16, 2, 0, 0, 3);
  std::fill(c.inputs.at("weight").data.begin(), c.inputs.at("weight").data.end(), std::byte{0});
  std::fill(c.inputs.at("output").data.begin(), c.inputs.at("output").data.end(), std::byte{0});
  auto& want = c.expected.at("output").data;  // Σ 0·x = 0 (an all-zero f64 is 0.0)
  std::fill(want.begin(), want.end(), std::byte{0});
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    emu::EmulatorBackend gpu(o);
    run_kernel_case(gpu, c);
  }
  const KernelCase rec = read_kernel_case(dir / "0000_mla_batched_gemv.safetensors");
  REQUIRE(rec.expected.count("output") == 1);
  CHECK(rec.expected.count("input") == 0);  // read-only: an input only
  const Tensor& out = rec.expected.at("output");
  CHECK(out.data.size() == 14 * sizeof(Bf16));
  CHECK(std::all_of(out.data.begin(), out.data.end(), [](std::byte b) { return b == std::byte{0}; }));
  std::filesystem::remove_all(dir);
}

TEST_CASE("two recorders of one folder take turns at numbers, replacing no case", "[kernel_case][recorded]") {
  // Before: both numbered from the same scan and one replaced the other's cases (and they shared
  // one .part name, so one run's write failed).
  const auto dir = test::scratch_dir("metrale_recorder_race_test");
  std::filesystem::remove_all(dir);
  emu::EmulatorOptions o;
  o.record_dir = dir;
  emu::EmulatorBackend first(o), second(o);  // both scan an empty folder: both start at 0000
  run_kernel_case(first, gen::gemv_case(19, 33, 3, 1, 2, 5));
  run_kernel_case(second, gen::gemv_case(5, 9, 2, 1, 2, 6));  // 0000 is taken: 0001
  run_kernel_case(first, gen::gemv_case(7, 9, 2, 1, 2, 7));   // 0001 is taken: 0002
  CHECK(read_kernel_case(dir / "0000_mla_batched_gemv.safetensors").scalars.at("n_out").as_u32() == 19);
  CHECK(read_kernel_case(dir / "0001_mla_batched_gemv.safetensors").scalars.at("n_out").as_u32() == 5);
  CHECK(read_kernel_case(dir / "0002_mla_batched_gemv.safetensors").scalars.at("n_out").as_u32() == 7);
  // No staged file left behind.
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{}) == 3);
  std::filesystem::remove_all(dir);
}
