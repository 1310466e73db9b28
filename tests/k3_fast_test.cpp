// Module k3_fast: the K3 SDPA's split path against the float64 reference on every available
// backend (through the dispatcher and through the raw kernels with arbitrary chunkings), its
// plan, the dispatcher's choice, NaN and empty histories as on the seed kernel, a recorded step
// replayed kernel by kernel, and every launcher rule.
#include <rapidcheck.h>
#include <rapidcheck/catch.h>
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <set>

#include "metrale/buffer.hpp"
#include "metrale/case_gen.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/reference.hpp"
#include "support.hpp"

using namespace metrale;

namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// gen::k3_sdpa_problem with gate logits in ±4, well into both tails of the sigmoid.
ref::K3SdpaProblem random_problem(std::uint32_t heads, std::uint32_t dq, std::uint32_t dv, std::uint32_t seq_len,
                                  bool use_gate, std::uint64_t seed) {
  ref::K3SdpaProblem p = gen::k3_sdpa_problem(heads, dq, dv, seq_len, use_gate, seed);
  for (auto& x : p.g) x *= 4.0f;
  return p;
}

// The problem's buffers on `gpu`, out poisoned with NaN.
struct Buffers {
  DeviceBuffer q, k, v, g, out;
  Buffers(GpuBackend& gpu, const ref::K3SdpaProblem& p)
      : q(DeviceBuffer::from_host<float>(gpu, p.q)),
        k(DeviceBuffer::from_host<float>(gpu, p.k)),
        v(DeviceBuffer::from_host<float>(gpu, p.v)),
        g(DeviceBuffer::from_host<float>(gpu, p.g)),
        out(DeviceBuffer::from_host<float>(gpu, std::vector<float>(std::size_t{p.heads} * p.dv, kNan))) {}
  K3SdpaArgs args(const ref::K3SdpaProblem& p) const {
    return {q.ptr(), k.ptr(), v.ptr(), g.ptr(), out.ptr(), p.seq_len, p.heads, p.dq, p.dv, p.use_gate};
  }
};

// out of the seed kernel or (split) the dispatcher's split path, on `gpu`.
std::vector<float> run_sdpa(GpuBackend& gpu, const ref::K3SdpaProblem& p, bool split) {
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  const Buffers b(gpu, p);
  DecodeWorkspace ws;
  if (split) {
    REQUIRE(k3_sdpa(gpu, kernels, b.args(p), ws) == DecodePath::split);
  } else {
    k3_mla_sdpa_gate_f32(gpu, kernels.sdpa, b.args(p));
  }
  gpu.synchronize(0);
  return b.out.to_host<float>();
}

// Every output within k3_sdpa_bound of the float64 reference, finite, and exactly 0 without keys.
template <class Assert>
void check_against_reference(const ref::K3SdpaProblem& p, const std::vector<float>& got, Assert&& require) {
  const auto want = ref::k3_sdpa_gate(p);
  for (std::size_t h = 0; h < p.heads; ++h) {
    const double bound = gen::k3_sdpa_bound(p, h);
    for (std::size_t d = 0; d < p.dv; ++d) {
      const float o = got[h * p.dv + d];
      require(std::isfinite(o));
      if (p.seq_len == 0) require(o == 0.0f);
      require(std::fabs(o - want[h * p.dv + d]) <= bound);
    }
  }
}

}  // namespace

TEST_CASE("the K3 split path matches the float64 reference", "[k3_fast]") {
  for (const auto& name : test::backends()) {
    INFO("backend " << name);
    rc::prop("random heads, dims up to 256, seq_len, gate; dispatcher's plan or any chunking", [&] {
      const auto heads = *rc::gen::inRange<std::uint32_t>(1, 41);
      const auto dq = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 80), rc::gen::inRange<std::uint32_t>(1, 257));
      const auto dv = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 80), rc::gen::inRange<std::uint32_t>(1, 257));
      const auto seq_len =
          *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(0, 6), rc::gen::inRange<std::uint32_t>(0, 700));
      const bool use_gate = *rc::gen::arbitrary<bool>();
      const bool planned = *rc::gen::arbitrary<bool>();
      const auto p = random_problem(heads, dq, dv, seq_len, use_gate, *rc::gen::arbitrary<std::uint64_t>());
      auto gpu = test::make_backend(name);
      const auto kernels = K3MlaDecodeKernels::resolve(*gpu);
      const Buffers b(*gpu, p);
      if (planned) {
        DecodeWorkspace ws;
        RC_ASSERT(k3_sdpa(*gpu, kernels, b.args(p), ws) == DecodePath::split);
        gpu->synchronize(0);
      } else {
        // Chunks of any length (odd ones end mid-step), and up to two blocks of chunks past the keys.
        const auto kpc = *rc::gen::inRange<std::uint32_t>(1, 98);
        const std::uint32_t needed = (std::max<std::uint32_t>(seq_len, 1) + kpc - 1) / kpc;
        const std::uint32_t chunks = ((needed + 3) / 4 + *rc::gen::inRange<std::uint32_t>(0, 3)) * 4;
        RC_PRE(chunks <= kK3MaxChunks);
        const DeviceBuffer o_partial(*gpu, std::size_t{chunks} * heads * dv * 4);
        const DeviceBuffer ml_partial(*gpu, std::size_t{chunks} * heads * 8);
        k3_mla_sdpa_split_f32(
            *gpu, kernels.sdpa_split,
            {b.q.ptr(), b.k.ptr(), b.v.ptr(), o_partial.ptr(), ml_partial.ptr(), seq_len, heads, dq, dv, kpc, chunks});
        k3_mla_sdpa_combine_f32(
            *gpu, kernels.sdpa_combine,
            {o_partial.ptr(), ml_partial.ptr(), b.g.ptr(), b.out.ptr(), heads, dv, chunks, use_gate});
        gpu->synchronize(0);
      }
      check_against_reference(p, b.out.to_host<float>(), [](bool ok) { RC_ASSERT(ok); });
    });
  }
}

TEST_CASE("K3 split-path conformance cases pass on every backend", "[k3_fast]") {
  const std::uint32_t seq = GENERATE(0u, 1u, 130u, 4099u);
  const bool gate = GENERATE(false, true);
  test::check_case(gen::k3_sdpa_case(16, 192, 128, seq, gate, 7 + seq, true));
}

TEST_CASE("the K3 split and combine kernels match their float64 references", "[k3_fast]") {
  SECTION("split: chunks ending mid-step, empty chunks past the keys, the widest rows") {
    const auto [dq, dv, seq, kpc, chunks] =
        GENERATE(std::array<std::uint32_t, 5>{192, 128, 733, 13, 64},
                 std::array<std::uint32_t, 5>{256, 256, 100, 32, 8}, std::array<std::uint32_t, 5>{7, 3, 0, 4, 4});
    test::check_case(gen::k3_split_case(5, dq, dv, seq, kpc, chunks, seq + 1));
  }
  SECTION("combine: a quarter of the chunks empty, gate on and off") {
    const bool gate = GENERATE(false, true);
    test::check_case(gen::k3_combine_case(7, 200, 4 * GENERATE(1u, 3u, 40u), gate, 5));
  }
}

TEST_CASE("the K3 split plan covers every key with few empty chunks", "[k3_fast][plan]") {
  rc::prop("any seq_len, heads, dv and device size", [] {
    const auto seq_len = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(0, 5000),
                                         rc::gen::inRange<std::uint32_t>(0, 0x8000'0000u),  // to 2^31 - 1
                                         rc::gen::just<std::uint32_t>(0x7FFF'FFFFu));
    const auto heads = *rc::gen::inRange<std::uint32_t>(1, 65536);
    const auto dv = *rc::gen::inRange<std::uint32_t>(1, 257);
    const auto sms = *rc::gen::element<std::uint32_t>(1, 48, 132, 1000);
    const K3SplitPlan p = plan_k3_sdpa_split(seq_len, heads, dv, sms);
    RC_ASSERT(p.num_chunks % kK3ChunkWarps == 0);
    RC_ASSERT(p.num_chunks >= kK3ChunkWarps && p.num_chunks <= kK3MaxChunks);
    RC_ASSERT(p.keys_per_chunk % 4 == 0 && p.keys_per_chunk > 0);
    RC_ASSERT(std::uint64_t{p.num_chunks} * p.keys_per_chunk >= seq_len);
    // No block of four chunks is wholly past the keys.
    RC_ASSERT(std::uint64_t{p.num_chunks - kK3ChunkWarps} * p.keys_per_chunk < std::max<std::uint32_t>(seq_len, 1));
    // Chunks are never cut below 32 keys unless the history is shorter, and there are never more
    // blocks than two rounds of the device's (4 per SM) unless a head alone needs one.
    RC_ASSERT(p.keys_per_chunk >= std::min<std::uint32_t>(32, (std::max<std::uint32_t>(seq_len, 1) + 3) / 4 * 4));
    RC_ASSERT(std::uint64_t{p.num_chunks / kK3ChunkWarps} * heads <= std::max<std::uint64_t>(8ull * sms, heads));
    const std::uint64_t rows = std::uint64_t{p.num_chunks} * heads;
    RC_ASSERT(p.ml_offset == rows * dv * 4);
    RC_ASSERT(p.workspace_bytes == p.ml_offset + rows * 8);
  });
  // The H200's K3 shapes: 64 heads over 16K keys, 64 chunks of 256 keys: 1024 blocks, two
  // rounds of 528; 16 heads over 4K keys, 128 chunks of 32 (one round: no chunk under 32 keys).
  const K3SplitPlan h64 = plan_k3_sdpa_split(16384, 64, 128, 132);
  CHECK(h64.num_chunks == 64);
  CHECK(h64.keys_per_chunk == 256);
  const K3SplitPlan h16 = plan_k3_sdpa_split(4096, 16, 128, 132);
  CHECK(h16.num_chunks == 128);
  CHECK(h16.keys_per_chunk == 32);
}

TEST_CASE("k3_sdpa takes the split path up to 256 dims and the seed kernel beyond", "[k3_fast][dispatch]") {
  const auto [dq, dv] = GENERATE(std::pair{256u, 256u}, std::pair{257u, 64u}, std::pair{64u, 300u});
  INFO("dq " << dq << " dv " << dv);
  const auto p = random_problem(3, dq, dv, 50, true, dq + dv);
  emu::EmulatorBackend gpu;
  gpu.record_launches(true);
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  const Buffers b(gpu, p);
  DecodeWorkspace ws;
  const bool split = dq <= kK3SplitMaxDim && dv <= kK3SplitMaxDim;
  CHECK(k3_split_unsupported(b.args(p)).has_value() == !split);
  CHECK(k3_sdpa(gpu, kernels, b.args(p), ws) == (split ? DecodePath::split : DecodePath::seed));
  REQUIRE(!gpu.launch_log().empty());
  CHECK(gpu.launch_log().back().entry == (split ? "k3_mla_sdpa_combine_f32" : "k3_mla_sdpa_gate_f32"));
  check_against_reference(p, b.out.to_host<float>(), [](bool ok) { REQUIRE(ok); });
}

TEST_CASE("NaN in q reaches the head's output on the K3 split path as on the seed kernel", "[k3_fast][nan]") {
  auto p = random_problem(4, 64, 32, 300, GENERATE(false, true), 11);
  p.q[2 * 64 + 5] = kNan;  // head 2
  for (const auto& name : test::backends()) {
    INFO("backend " << name);
    auto gpu = test::make_backend(name);
    for (bool split : {false, true}) {
      INFO((split ? "split path" : "seed kernel"));
      const auto out = run_sdpa(*gpu, p, split);
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t d = 0; d < 32; ++d) CHECK(std::isnan(out[h * 32 + d]) == (h == 2));
    }
  }
}

TEST_CASE("NaN or inf in V reaches the output on the K3 split path even where its weight underflows",
          "[k3_fast][nan]") {
  // One head of one dim over 64 keys: the first 32 (the split's first chunk) have logits of -200,
  // whose weights against the others' 0 underflow to zero in FP32; key 0's value is not finite.
  for (const float bad : {kNan, std::numeric_limits<float>::infinity()}) {
    ref::K3SdpaProblem p{1,     1, 1, 64, false, {1.0f}, std::vector<float>(64, 0.0f), std::vector<float>(64, 1.0f),
                         {0.0f}};
    std::fill_n(p.k.begin(), 32, -200.0f);
    p.v[0] = bad;
    for (const auto& name : test::backends()) {
      INFO("backend " << name << ", v[0] " << bad);
      auto gpu = test::make_backend(name);
      for (bool split : {false, true}) {
        INFO((split ? "split path" : "seed kernel"));
        CHECK(std::isnan(run_sdpa(*gpu, p, split)[0]));  // 0·NaN and 0·inf are NaN, as in the reference
      }
    }
  }
}

TEST_CASE("the K3 split path leaves histories past 2^31 - 1 keys to the seed kernel", "[k3_fast][dispatch]") {
  const std::uint32_t seq_len = GENERATE(0x8000'0000u, 0xFFFF'FFFFu);
  const auto at = [](std::uint64_t i) { return DevicePtr{i << 48}; };  // apart: k spans 2^45 bytes
  K3SdpaArgs a{at(1), at(2), at(3), {}, at(4), seq_len, 2000, 1, 1, false};
  REQUIRE(k3_split_unsupported(a).has_value());
  CHECK_THAT(*k3_split_unsupported(a), Catch::Matchers::Contains(fmt::format("seq_len {}", seq_len)));
  test::require_error([&] { plan_k3_sdpa_split(seq_len, 2000, 1, 132); }, Errc::invalid_argument,
                      {fmt::format("seq_len {} exceeds 2147483647", seq_len)});
  test::require_error([&] { plan_k3_sdpa_split(5, 0, 1, 132); }, Errc::invalid_argument, {"k3 split plan: heads is 0"});
  emu::EmulatorBackend gpu;
  gpu.set_dry_run(true);
  gpu.record_launches(true);
  DecodeWorkspace ws;
  CHECK(k3_sdpa(gpu, K3MlaDecodeKernels::resolve(gpu), a, ws) == DecodePath::seed);
  test::require_error(
      [&] {
        k3_mla_sdpa_split_f32(gpu, K3MlaDecodeKernels::resolve(gpu).sdpa_split,
                              {a.q, a.k, a.v, at(5), at(6), seq_len, 1, 1, 1, 1u << 20, 4096});
      },
      Errc::invalid_argument, {fmt::format("seq_len {} exceeds 2147483647", seq_len)});
}

TEST_CASE("a recorded K3 split-path step replays kernel by kernel", "[k3_fast][recorded]") {
  const auto dir = test::scratch_dir("metrale_k3_recorder_test");
  std::filesystem::remove_all(dir);
  {
    emu::EmulatorOptions o;
    o.record_dir = dir;
    emu::EmulatorBackend gpu(o);
    run_kernel_case(gpu, gen::k3_sdpa_case(6, 192, 128, 333, true, 3, true));
  }
  std::set<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const KernelCase rec = read_kernel_case(e.path());
    entries.insert(rec.entry);
    if (rec.entry == "k3_mla_sdpa_split_f32") {
      CHECK(rec.scalars.at("num_chunks").as_u32() == rec.grid.x * 4);
      CHECK(rec.scalars.at("num_chunks").as_u32() * rec.scalars.at("keys_per_chunk").as_u32() >= 333);
    }
    test::check_case(rec);
  }
  CHECK(entries == std::set<std::string>{"k3_mla_sdpa_split_f32", "k3_mla_sdpa_combine_f32"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("the K3 split launchers pass their arguments under the ports' parameter names", "[k3_fast][launch]") {
  emu::EmulatorBackend gpu;
  gpu.set_dry_run(true);
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  const DevicePtr a{1ull << 32}, b{2ull << 32}, c{3ull << 32}, d{4ull << 32}, e{5ull << 32};
  k3_mla_sdpa_split_f32(gpu, kernels.sdpa_split, {a, b, c, d, e, 300, 7, 192, 128, 19, 16});
  k3_mla_sdpa_combine_f32(gpu, kernels.sdpa_combine, {a, b, c, d, 9, 100, 12, true});
  const auto& log = gpu.launch_log();
  REQUIRE(log.size() == 2);
  const auto& split = log[0];
  CHECK(split.grid == Dim3{4, 7, 1});
  CHECK(split.block == Dim3{128, 1, 1});
  const std::pair<const char*, DevicePtr> sp[] = {{"q", a}, {"k", b}, {"v", c}, {"o_partial", d}, {"ml_partial", e}};
  for (const auto& [n, ptr] : sp) CHECK(split.arg(n).as_ptr() == ptr);
  CHECK(split.arg("seq_len").as_u32() == 300);
  CHECK(split.arg("heads").as_u32() == 7);
  CHECK(split.arg("dq").as_u32() == 192);
  CHECK(split.arg("dv").as_u32() == 128);
  CHECK(split.arg("keys_per_chunk").as_u32() == 19);
  const auto& combine = log[1];
  CHECK(combine.grid == Dim3{9, 4, 1});  // 100 dims: four blocks of 32
  CHECK(combine.block == Dim3{256, 1, 1});
  const std::pair<const char*, DevicePtr> cp[] = {{"o_partial", a}, {"ml_partial", b}, {"g", c}, {"out", d}};
  for (const auto& [n, ptr] : cp) CHECK(combine.arg(n).as_ptr() == ptr);
  CHECK(combine.arg("heads").as_u32() == 9);
  CHECK(combine.arg("dv").as_u32() == 100);
  CHECK(combine.arg("num_chunks").as_u32() == 12);
  CHECK(combine.arg("use_gate").as_u32() == 1);
}

TEST_CASE("the K3 split launchers refuse every bad argument and launch nothing", "[k3_fast][validation]") {
  emu::EmulatorBackend gpu;
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  // Apart: the largest buffer, ok's k, spans 64 x 2 x 192 x 4 bytes.
  const auto p = [](std::uint64_t i) { return DevicePtr{i << 20}; };
  const std::uint64_t before = gpu.calls(emu::Op::launch);
  const K3SdpaSplitArgs ok{p(1), p(2), p(3), p(4), p(5), 64, 2, 192, 128, 16, 4};
  auto split = [&](auto edit, KernelHandle k = {}) {
    K3SdpaSplitArgs a = ok;
    edit(a);
    k3_mla_sdpa_split_f32(gpu, k.id != 0 ? k : kernels.sdpa_split, a);
  };
  using test::require_error;
  const auto bad = Errc::invalid_argument;
  require_error([&] { split([](auto& a) { a.q = {}; }); }, bad, {"k3_mla_sdpa_split_f32: q is null"});
  require_error([&] { split([](auto& a) { a.k = {}; }); }, bad, {"k is null"});
  require_error([&] { split([](auto& a) { a.v = {}; }); }, bad, {"v is null"});
  require_error([&] { split([](auto& a) { a.o_partial = {}; }); }, bad, {"o_partial is null"});
  require_error([&] { split([](auto& a) { a.ml_partial = {}; }); }, bad, {"ml_partial is null"});
  require_error([&] { split([](auto& a) { a.heads = 0; }); }, bad, {"heads is 0"});
  require_error([&] { split([](auto& a) { a.dq = 0; }); }, bad, {"dq is 0"});
  require_error([&] { split([](auto& a) { a.keys_per_chunk = 0; }); }, bad, {"keys_per_chunk is 0"});
  require_error([&] { split([](auto& a) { a.dq = 257; }); }, bad, {"dq 257 exceeds 256"});
  require_error([&] { split([](auto& a) { a.dv = 300; }); }, bad, {"dv 300 exceeds 256"});
  require_error([&] { split([](auto& a) { a.heads = 65536; }); }, bad, {"heads 65536 exceeds 65535"});
  require_error([&] { split([](auto& a) { a.num_chunks = 6; }); }, bad,
                {"num_chunks 6 is not a positive multiple of 4"});
  require_error([&] { split([](auto& a) { a.num_chunks = 4100; }); }, bad, {"num_chunks 4100"});
  require_error([&] { split([](auto& a) { a.seq_len = 65; }); }, bad,
                {"num_chunks 4 x keys_per_chunk 16 covers fewer keys than seq_len 65"});
  // Outputs apart from what the blocks read: o_partial [4, 2, 128] f32 = 4096 bytes, ml_partial
  // [4, 2, 2] f32 = 64 bytes, q [2, 192] f32, v [64, 2, 128] f32.
  require_error([&] { split([&](auto& a) { a.o_partial = a.q + 1532; }); }, bad,
                {"o_partial spans [0x1005fc, 0x1015fc), which overlaps q's [0x100000, 0x100600)"});
  require_error([&] { split([&](auto& a) { a.ml_partial = a.o_partial + 4032; }); }, bad,
                {"o_partial spans [0x400000, 0x401000), which overlaps ml_partial's [0x400fc0, 0x401000)"});
  require_error([&] { split([&](auto& a) { a.ml_partial = a.v + 65532; }); }, bad,
                {"ml_partial spans [0x30fffc, 0x31003c), which overlaps v's [0x300000, 0x310000)"});
  require_error([&] { split([](auto&) {}, kernels.sdpa); }, bad,
                {"kernel mla_decode.k3_mla_sdpa_gate_f32 is not k3_mla_sdpa_split_f32"});

  const K3SdpaCombineArgs cok{p(1), p(2), p(3), p(4), 2, 128, 8, true};
  auto combine = [&](auto edit, KernelHandle k = {}) {
    K3SdpaCombineArgs a = cok;
    edit(a);
    k3_mla_sdpa_combine_f32(gpu, k.id != 0 ? k : kernels.sdpa_combine, a);
  };
  require_error([&] { combine([](auto& a) { a.o_partial = {}; }); }, bad,
                {"k3_mla_sdpa_combine_f32: o_partial is null"});
  require_error([&] { combine([](auto& a) { a.ml_partial = {}; }); }, bad, {"ml_partial is null"});
  require_error([&] { combine([](auto& a) { a.out = {}; }); }, bad, {"out is null"});
  require_error([&] { combine([](auto& a) { a.g = {}; }); }, bad, {"g is null"});
  require_error([&] { combine([](auto& a) { a.heads = 0; }); }, bad, {"heads is 0"});
  require_error([&] { combine([](auto& a) { a.dv = 0; }); }, bad, {"dv is 0"});
  require_error([&] { combine([](auto& a) { a.dv = 65535 * 32 + 1; }); }, bad, {"dv 2097121 exceeds 2097120"});
  require_error([&] { combine([](auto& a) { a.num_chunks = 0; }); }, bad, {"num_chunks 0"});
  require_error([&] { combine([](auto& a) { a.out = a.g; }); }, bad,
                {"out spans [0x300000, 0x300400), which overlaps g's [0x300000, 0x300400)"});
  require_error([&] { combine([](auto& a) { a.out = a.o_partial + (8 * 2 * 128 * 4 - 4); }); }, bad,
                {"out spans [0x101ffc, 0x1023fc), which overlaps o_partial's"});
  require_error([&] { combine([](auto& a) { a.out = a.ml_partial; }); }, bad,
                {"out spans [0x200000, 0x200400), which overlaps ml_partial's"});
  require_error([&] { combine([](auto&) {}, kernels.sdpa_split); }, bad,
                {"kernel k3_fast.k3_mla_sdpa_split_f32 is not k3_mla_sdpa_combine_f32"});
  // The seed launcher refuses the split entry, which shares its signature.
  require_error(
      [&] {
        k3_mla_sdpa_gate_f32(gpu, kernels.sdpa_split, {p(1), p(2), p(3), p(4), p(5), 1, 1, 1, 1, true});
      },
      bad, {"kernel k3_fast.k3_mla_sdpa_split_f32 is not k3_mla_sdpa_gate_f32"});
  CHECK(gpu.calls(emu::Op::launch) == before);

  SECTION("what the rules allow: no keys without k and v, no gate without g") {
    gpu.set_dry_run(true);
    split([](auto& a) { a.seq_len = 0, a.k = {}, a.v = {}; });
    combine([](auto& a) { a.use_gate = false, a.g = {}; });
    CHECK(gpu.calls(emu::Op::launch) == before + 2);
  }
}
