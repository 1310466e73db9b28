// Launcher validation (STYLE §4: "every rule has a test") for module
// `mla_absorbed` (SPEC §3). Each test case builds one valid argument set over
// real emulator buffers, launches it as a control, then breaks one rule per
// SECTION and checks the error code, that the message names the kernel and the
// bad value, and that the rejected launch reached the backend not at all (no
// launch, no allocation, no call of any kind). A last test case sends sentinel
// values through every launcher in dry-run mode and checks that each reached
// the declared parameter of the same name, in the SPEC's order.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "metrale/buffer.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_fast.hpp"
#include "support.hpp"

namespace Catch {
template <>
struct StringMaker<metrale::KernelArg> {
  static std::string convert(const metrale::KernelArg& a) {
    return fmt::format("{}({:#x})", metrale::to_string(a.kind), a.bits);
  }
};
template <>
struct StringMaker<metrale::Dim3> {
  static std::string convert(const metrale::Dim3& d) { return fmt::format("({},{},{})", d.x, d.y, d.z); }
};
}  // namespace Catch

namespace {

using namespace metrale;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

emu::EmulatorOptions checked_options() {
  emu::EmulatorOptions o;
  o.on_leak = [](const std::vector<emu::AllocationInfo>& leaks) {
    FAIL_CHECK("the emulator was destroyed with " << leaks.size() << " live allocations");
  };
  return o;
}

// `bytes` zero bytes on the device (written, so the ports may read them).
DeviceBuffer zeros(GpuBackend& gpu, std::size_t bytes) {
  const std::vector<std::byte> host(bytes);
  return DeviceBuffer::from_host<std::byte>(gpu, host);
}

DeviceBuffer int32s(GpuBackend& gpu, const std::vector<std::int32_t>& values) {
  return DeviceBuffer::from_host<std::int32_t>(gpu, values);
}

constexpr std::size_t kBf16 = 2;

// The backend and the module's kernels; each case below adds its buffers (declared after, so
// they are freed before the backend).
struct Emu {
  emu::EmulatorBackend gpu{checked_options()};
  MlaAbsorbedKernels kernels = MlaAbsorbedKernels::resolve(gpu);

  // The launch must fail with `code` and a message containing every needle, and must not
  // reach the backend: no launch, no allocation, no call of any other kind.
  template <class F>
  void require_rejected(F&& launch, Errc code, std::initializer_list<std::string> needles) {
    const auto calls = gpu.calls();
    const auto launches = gpu.calls(emu::Op::launch);
    const auto allocs = gpu.calls(emu::Op::alloc);
    const auto live = gpu.live_allocations().size();
    const auto live_bytes = gpu.live_bytes();
    test::require_error(std::forward<F>(launch), code, needles);
    CHECK(gpu.calls(emu::Op::launch) == launches);
    CHECK(gpu.calls(emu::Op::alloc) == allocs);
    CHECK(gpu.calls() == calls);
    CHECK(gpu.live_allocations().size() == live);
    CHECK(gpu.live_bytes() == live_bytes);
  }
  // Launch in dry-run mode: validation and the backend's argument and shape checks run, no
  // block does (for boundary values whose buffers would be too large to allocate).
  template <class F>
  void require_accepted_dry(F&& launch) {
    gpu.set_dry_run(true);
    const auto launches = gpu.calls(emu::Op::launch);
    REQUIRE_NOTHROW(launch());
    CHECK(gpu.calls(emu::Op::launch) == launches + 1);
    gpu.set_dry_run(false);
  }
};

// ---- mla_batched_gemv ---------------------------------------------------------

struct GemvCase : Emu {
  static constexpr std::uint32_t n_out = 12, k = 40, heads = 3, in_stride = 48, out_stride = 12;
  DeviceBuffer input = zeros(gpu, std::size_t{heads} * in_stride * kBf16);
  DeviceBuffer weight = zeros(gpu, std::size_t{heads} * n_out * k * kBf16);
  DeviceBuffer output{gpu, std::size_t{heads} * out_stride* kBf16};

  BatchedGemvArgs valid() const {
    // output_stride == n_out: the boundary of the overlap rule is in the control.
    return {.input = input.ptr(),
            .weight = weight.ptr(),
            .output = output.ptr(),
            .n_out = n_out,
            .k = k,
            .num_heads = heads,
            .input_stride = in_stride,
            .output_stride = out_stride};
  }
  void launch(const BatchedGemvArgs& a) { mla_batched_gemv(gpu, kernels.batched_gemv, a); }
};

TEST_CASE("mla_batched_gemv: an output over its input or weights is refused on every backend", "[validation]") {
  // Before: accepted; the emulator reported a read-write race, and the CUDA backend gave an
  // output that differed from run to run (blocks read input rows that others overwrote).
  GemvCase c;
  auto a = c.valid();
  a.output = a.input;  // output_stride 12 < in_stride 48: rows of head h at h·48 in both
  // The input spans 2 x 48 + 40 values, the weights 3 x 12 x 40, the output 2 x 12 + 12 (bf16).
  c.require_rejected(
      [&] { c.launch(a); }, Errc::invalid_argument,
      {fmt::format("mla_batched_gemv: output spans [{:#x}, {:#x}), which overlaps input's [{:#x}, {:#x})", a.input.addr,
                   a.input.addr + 72, a.input.addr, a.input.addr + 272)});
  a.output = a.weight + 2878;  // the last weight
  c.require_rejected([&] { c.launch(a); }, Errc::invalid_argument, {"output spans", "which overlaps weight's"});
  // Sentinels in a dry run: an output that starts where the input ends, or ends where the
  // weights start, touches neither.
  a.input = DevicePtr{1ull << 40};
  a.weight = DevicePtr{2ull << 40};
  for (const DevicePtr out : {a.input + 272, DevicePtr{a.weight.addr - 72}}) {
    a.output = out;
    c.require_accepted_dry([&] { c.launch(a); });
  }
  a.output = DevicePtr{a.weight.addr - 71};
  c.require_rejected([&] { c.launch(a); }, Errc::invalid_argument, {"which overlaps weight's"});
}

TEST_CASE("mla_batched_gemv: every validation rule", "[validation]") {
  GemvCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  REQUIRE(c.gpu.calls(emu::Op::launch) == 1);
  auto a = c.valid();
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;

  SECTION("input null") {
    a.input = {};
    reject(bad, {"mla_batched_gemv", "input is null"});
  }
  SECTION("weight null") {
    a.weight = {};
    reject(bad, {"mla_batched_gemv", "weight is null"});
  }
  SECTION("output null") {
    a.output = {};
    reject(bad, {"mla_batched_gemv", "output is null"});
  }
  SECTION("n_out 0") {
    a.n_out = 0;
    reject(bad, {"mla_batched_gemv", "n_out is 0"});
  }
  SECTION("k 0") {
    a.k = 0;
    reject(bad, {"mla_batched_gemv", "k is 0"});
  }
  SECTION("num_heads 0") {
    a.num_heads = 0;
    reject(bad, {"mla_batched_gemv", "num_heads is 0"});
  }
  SECTION("num_heads past the grid's y limit") {
    a.num_heads = 65536;
    reject(bad, {"mla_batched_gemv", "num_heads", "65536", "65535"});
    a.num_heads = 65535;  // (buffers of 65535 heads: sentinels far apart, in a dry run)
    a.input = DevicePtr{1ull << 40}, a.weight = DevicePtr{2ull << 40}, a.output = DevicePtr{3ull << 40};
    c.require_accepted_dry([&] { c.launch(a); });
  }
  SECTION("output_stride < n_out") {
    a.output_stride = 100;
    a.n_out = 512;
    reject(bad, {"mla_batched_gemv", "output_stride", "100", "512"});
  }
}

TEST_CASE("the two GEMV launchers refuse each other's kernel, the wide one a misaligned input or weight",
          "[validation]") {
  // Before (adversarial helper, thirty-sixth session): the wide launcher ran the seed kernel (the
  // same parameters) over a grid sized for its own rows per block, leaving half of the output
  // unwritten without an error; and it took input and weight 2 or 4 bytes past a 16-byte boundary,
  // where the CUDA kernel's 16-byte loads fault (the port reads elements, so the emulator ran them).
  Emu c;
  const auto fast = MlaFastKernels::resolve(c.gpu);
  const DeviceBuffer input = zeros(c.gpu, 80 * kBf16), weight = zeros(c.gpu, (64 * 64 + 8) * kBf16);
  const DeviceBuffer output(c.gpu, 64 * kBf16);
  BatchedGemvArgs a{input.ptr(), weight.ptr(), output.ptr(), 64, 64, 1, 64, 64};
  c.require_rejected([&] { mla_batched_gemv_wide(c.gpu, c.kernels.batched_gemv, a); }, Errc::invalid_argument,
                     {"mla_batched_gemv_wide: kernel mla_absorbed.mla_batched_gemv is not mla_batched_gemv_wide"});
  c.require_rejected([&] { mla_batched_gemv(c.gpu, fast.gemv_wide, a); }, Errc::invalid_argument,
                     {"mla_batched_gemv: kernel mla_fast.mla_batched_gemv_wide is not mla_batched_gemv"});
  a.input = input.ptr() + 2;
  c.require_rejected([&] { mla_batched_gemv_wide(c.gpu, fast.gemv_wide, a); }, Errc::invalid_argument,
                     {fmt::format("mla_batched_gemv_wide: input {:#x} is not 16-byte aligned", a.input.addr)});
  REQUIRE_NOTHROW(mla_batched_gemv(c.gpu, c.kernels.batched_gemv, a));  // the seed kernel reads elements
  a.input = input.ptr(), a.weight = weight.ptr() + 4;
  c.require_rejected([&] { mla_batched_gemv_wide(c.gpu, fast.gemv_wide, a); }, Errc::invalid_argument,
                     {fmt::format("mla_batched_gemv_wide: weight {:#x} is not 16-byte aligned", a.weight.addr)});
  a.weight = weight.ptr() + 16;
  REQUIRE_NOTHROW(mla_batched_gemv_wide(c.gpu, fast.gemv_wide, a));
}

// ---- mla_q_rope_scatter -------------------------------------------------------

struct ScatterCase : Emu {
  // nope + rope == hd and kv_lora + rope == mla_cache_dim: both boundaries are in the control.
  static constexpr std::uint32_t nq = 3, hd = 20, nope = 12, rope = 8, kv_lora = 16, cache_dim = 24;
  DeviceBuffer q_full = zeros(gpu, std::size_t{nq} * hd * kBf16);
  DeviceBuffer q_absorbed{gpu, std::size_t{nq} * cache_dim* kBf16};
  DeviceBuffer q_rope{gpu, std::size_t{nq} * rope* kBf16};

  QRopeScatterArgs valid() const {
    return {.q_full = q_full.ptr(),
            .q_absorbed_buf = q_absorbed.ptr(),
            .q_rope_contiguous = q_rope.ptr(),
            .nq = nq,
            .hd = hd,
            .nope = nope,
            .rope = rope,
            .kv_lora = kv_lora,
            .mla_cache_dim = cache_dim};
  }
  void launch(const QRopeScatterArgs& a) { mla_q_rope_scatter(gpu, kernels.q_rope_scatter, a); }
};

TEST_CASE("mla_q_rope_scatter: every validation rule", "[validation]") {
  ScatterCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  const char* kn = "mla_q_rope_scatter";

  SECTION("q_full null") {
    a.q_full = {};
    reject(bad, {kn, "q_full is null"});
  }
  SECTION("q_absorbed_buf null") {
    a.q_absorbed_buf = {};
    reject(bad, {kn, "q_absorbed_buf is null"});
  }
  SECTION("q_rope_contiguous null") {
    a.q_rope_contiguous = {};
    reject(bad, {kn, "q_rope_contiguous is null"});
  }
  SECTION("nq 0") {
    a.nq = 0;
    reject(bad, {kn, "nq is 0"});
  }
  SECTION("rope 0") {
    a.rope = 0;
    reject(bad, {kn, "rope is 0"});
  }
  SECTION("nope + rope > hd") {
    a.nope = 13;
    reject(bad, {kn, "nope 13", "rope 8", "hd 20"});
    // 0xFFFFFFF9 + 8 wraps to 1 in 32 bits; the rule must not.
    a.nope = 0xFFFF'FFF9u;
    reject(bad, {kn, "nope 4294967289", "hd 20"});
  }
  SECTION("kv_lora + rope > mla_cache_dim") {
    a.kv_lora = 17;
    reject(bad, {kn, "kv_lora 17", "rope 8", "mla_cache_dim 24"});
    a.kv_lora = 0xFFFF'FFF9u;
    reject(bad, {kn, "kv_lora 4294967289", "mla_cache_dim 24"});
  }
  // Before: accepted, and the one block's threads read q_full where others had written (an
  // output 6 bytes into q_full gave 3 3 7 8 for 3 4 7 8).
  SECTION("an output over q_full or over the other output") {
    a.q_rope_contiguous = a.q_full + 6;
    reject(bad, {kn, "q_rope_contiguous spans", "which overlaps q_full's"});
    a = c.valid();
    a.q_absorbed_buf = a.q_full + 2 * (ScatterCase::nq * ScatterCase::hd - 1);  // the last q_full value
    reject(bad, {kn, "q_absorbed_buf spans", "which overlaps q_full's"});
    a = c.valid();
    a.q_rope_contiguous = a.q_absorbed_buf;
    reject(bad, {kn, "q_rope_contiguous spans", "which overlaps q_absorbed_buf's"});
  }
}

// ---- mla_q_rope_writeback -----------------------------------------------------

struct WritebackCase : Emu {
  static constexpr std::uint32_t nq = 3, rope = 8, kv_lora = 16, cache_dim = 24;
  DeviceBuffer q_rope = zeros(gpu, std::size_t{nq} * rope * kBf16);
  DeviceBuffer q_absorbed{gpu, std::size_t{nq} * cache_dim* kBf16};

  QRopeWritebackArgs valid() const {
    return {.q_rope_direct = q_rope.ptr(),
            .q_absorbed_buf = q_absorbed.ptr(),
            .nq = nq,
            .rope = rope,
            .kv_lora = kv_lora,
            .mla_cache_dim = cache_dim};
  }
  void launch(const QRopeWritebackArgs& a) { mla_q_rope_writeback(gpu, kernels.q_rope_writeback, a); }
};

TEST_CASE("mla_q_rope_writeback: every validation rule", "[validation]") {
  WritebackCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  const char* kn = "mla_q_rope_writeback";

  SECTION("q_rope_direct null") {
    a.q_rope_direct = {};
    reject(bad, {kn, "q_rope_direct is null"});
  }
  SECTION("q_absorbed_buf null") {
    a.q_absorbed_buf = {};
    reject(bad, {kn, "q_absorbed_buf is null"});
  }
  SECTION("nq 0") {
    a.nq = 0;
    reject(bad, {kn, "nq is 0"});
  }
  SECTION("rope 0") {
    a.rope = 0;
    reject(bad, {kn, "rope is 0"});
  }
  SECTION("kv_lora + rope > mla_cache_dim") {
    a.kv_lora = 17;
    reject(bad, {kn, "kv_lora 17", "rope 8", "mla_cache_dim 24"});
    a.kv_lora = 0xFFFF'FFF9u;
    reject(bad, {kn, "kv_lora 4294967289", "mla_cache_dim 24"});
  }
  SECTION("q_absorbed_buf over q_rope_direct") {  // before: accepted, rows copied from rows already written
    a.q_rope_direct = a.q_absorbed_buf + 4;
    reject(bad, {kn, "q_absorbed_buf spans", "which overlaps q_rope_direct's"});
  }
}

// ---- mla_cache_assemble -------------------------------------------------------

struct AssembleCase : Emu {
  static constexpr std::uint32_t kv_lora = 16, rope = 8, cache_dim = 24;
  DeviceBuffer kv_latent = zeros(gpu, kv_lora* kBf16);
  DeviceBuffer k_rope = zeros(gpu, rope* kBf16);
  DeviceBuffer k_cache{gpu, cache_dim* kBf16};
  DeviceBuffer v_cache{gpu, cache_dim* kBf16};

  CacheAssembleArgs valid() const {
    return {.kv_latent = kv_latent.ptr(),
            .k_rope = k_rope.ptr(),
            .k_cache = k_cache.ptr(),
            .v_cache = v_cache.ptr(),
            .kv_lora = kv_lora,
            .rope = rope,
            .mla_cache_dim = cache_dim};
  }
  void launch(const CacheAssembleArgs& a) { mla_cache_assemble(gpu, kernels.cache_assemble, a); }
};

TEST_CASE("mla_cache_assemble: every validation rule", "[validation]") {
  AssembleCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  const char* kn = "mla_cache_assemble";

  SECTION("kv_latent null") {
    a.kv_latent = {};
    reject(bad, {kn, "kv_latent is null"});
  }
  SECTION("k_rope null") {
    a.k_rope = {};
    reject(bad, {kn, "k_rope is null"});
  }
  SECTION("k_cache null") {
    a.k_cache = {};
    reject(bad, {kn, "k_cache is null"});
  }
  SECTION("v_cache null") {
    a.v_cache = {};
    reject(bad, {kn, "v_cache is null"});
  }
  SECTION("kv_lora 0") {
    a.kv_lora = 0;
    reject(bad, {kn, "kv_lora is 0"});
  }
  SECTION("kv_lora + rope > mla_cache_dim") {
    a.kv_lora = 17;
    reject(bad, {kn, "kv_lora 17", "rope 8", "mla_cache_dim 24"});
    a.kv_lora = 16;
    a.rope = 0xFFFF'FFF9u;
    reject(bad, {kn, "rope 4294967289", "mla_cache_dim 24"});
  }
  SECTION("mla_cache_dim > 1024 (one thread per element)") {
    a.mla_cache_dim = 1025;
    reject(bad, {kn, "mla_cache_dim 1025", "1024"});
    a.mla_cache_dim = 1024;  // the largest block: accepted
    c.require_accepted_dry([&] { c.launch(a); });
  }
  // Before: accepted; a k_cache row 4 bytes into kv_latent gave a V row of 2 2 2 2 ... for 2 3 4 5 ...
  SECTION("a row written over an input or over the other row") {
    a.k_cache = a.kv_latent + 4;
    reject(bad, {kn, "k_cache spans", "which overlaps kv_latent's"});
    a = c.valid();
    a.v_cache = a.k_rope;
    reject(bad, {kn, "v_cache spans", "which overlaps k_rope's"});
    a = c.valid();
    a.v_cache = a.k_cache + 2;
    reject(bad, {kn, "v_cache spans", "which overlaps k_cache's"});
  }
}

// ---- rope_pairs_bf16 ----------------------------------------------------------

struct RopeCase : Emu {
  static constexpr std::uint32_t rows = 3, rope = 8;
  DeviceBuffer x = zeros(gpu, std::size_t{rows} * rope * kBf16);

  RopePairsArgs valid() const { return {.x = x.ptr(), .rows = rows, .rope = rope, .pos = 5, .theta = 10000.0f}; }
  void launch(const RopePairsArgs& a) { rope_pairs_bf16(gpu, kernels.rope_pairs_bf16, a); }
};

TEST_CASE("rope_pairs_bf16: every validation rule", "[validation]") {
  RopeCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  const char* kn = "rope_pairs_bf16";

  SECTION("x null") {
    a.x = {};
    reject(bad, {kn, "x is null"});
  }
  SECTION("rows 0") {
    a.rows = 0;
    reject(bad, {kn, "rows is 0"});
  }
  SECTION("rope 0") {
    a.rope = 0;
    reject(bad, {kn, "rope is 0"});
  }
  SECTION("odd rope") {
    a.rope = 7;
    reject(bad, {kn, "rope 7", "odd"});
  }
  SECTION("theta not finite or not positive") {
    for (const auto& [theta, text] : std::vector<std::pair<float, std::string>>{
             {0.0f, "theta 0"}, {-2.0f, "theta -2"}, {kInf, "theta inf"}, {-kInf, "theta -inf"}, {kNaN, "theta nan"}}) {
      INFO("theta " << text);
      a.theta = theta;
      reject(bad, {kn, text});
    }
  }
  SECTION("a position past 2^24") {
    // Before: accepted; from about 2^24 the FP32 angles are off by radians (adversarial helper,
    // thirty-sixth session: 1.99 off the float64 rotation at position 10^8).
    a.pos = 1u << 24;
    REQUIRE_NOTHROW(c.launch(a));
    a.pos = (1u << 24) + 1;
    reject(bad, {kn, "position 16777217 is past 2^24 = 16777216"});
  }
  SECTION("theta so small that the rotation angles overflow FP32") {
    // The last pair's frequency theta^(−6/8) is 4e33 for the smallest denormal: finite at
    // position 5, past FP32 times 2^32 − 1 (the kernel's angle would be inf, its sine NaN).
    a.theta = 1e-45f;
    REQUIRE_NOTHROW(c.launch(a));
    a.pos = 0xFFFF'FFFFu;
    reject(bad, {kn, "theta 1e-45 overflows FP32's rotation angles at position 4294967295"});
  }
  SECTION("rows x rope / 2 past the grid's x limit x 256") {
    // 0xFFFFFFFF rows of 1024 values: 4294967295 * 512 pairs; the grid allows 0x7FFFFFFF * 256.
    a.rows = 0xFFFF'FFFFu;
    a.rope = 1024;
    reject(bad, {kn, "rows x rope / 2", "2199023255040", "549755813632"});
    a.rows = 0x7FFF'FFFFu;  // exactly 0x7FFFFFFF blocks of 256 pairs: accepted
    a.rope = 512;
    c.require_accepted_dry([&] { c.launch(a); });
  }
}

// ---- paged decode (both formats) ----------------------------------------------

// Two sequences of 4 query heads over 2 KV heads of 32 values, blocks of 4 tokens, 3 table
// columns, 6 physical blocks; every buffer zero (a zero cache decodes to zeros in both formats).
struct DecodeShape {
  static constexpr std::uint32_t num_seqs = 2, q_heads = 4, kv_heads = 2, q_head_dim = 24, kv_dim = 32, block_size = 4,
                                 width = 3, phys_blocks = 6;
  static constexpr std::uint64_t row_width = std::uint64_t{kv_heads} * kv_dim;  // 64
};

template <class Args>
void fill_common(Args& a, DevicePtr q, DevicePtr k, DevicePtr v, DevicePtr o, DevicePtr tables, DevicePtr lens) {
  using S = DecodeShape;
  a.q = q;
  a.k_cache = k;
  a.v_cache = v;
  a.o = o;
  a.block_tables = tables;
  a.seq_lens = lens;
  a.max_blocks_per_seq = S::width;
  a.num_q_heads = S::q_heads;
  a.num_kv_heads = S::kv_heads;
  a.q_head_dim = S::q_head_dim;
  a.kv_cache_dim = S::kv_dim;
  a.block_size = S::block_size;
  a.inv_sqrt_d = 0.25f;
  a.num_seqs = S::num_seqs;
}

struct DecodeBuffers : Emu, DecodeShape {
  DeviceBuffer q = zeros(gpu, std::size_t{num_seqs} * q_heads * q_head_dim * kBf16);
  DeviceBuffer o{gpu, std::size_t{num_seqs} * q_heads* kv_dim* kBf16};
  DeviceBuffer tables = int32s(gpu, {0, 1, 2, 3, 4, 5});
  DeviceBuffer lens = int32s(gpu, {5, 12});
};

struct Nvfp4DecodeCase : DecodeBuffers {
  // Exactly the minimum sections: block_size * 64 / 2 = 128 data bytes, + 4 * 64 / 16 = 16 scales.
  static constexpr std::uint64_t data_bytes = 128, stride = 144;
  DeviceBuffer k_cache = zeros(gpu, phys_blocks* stride);
  DeviceBuffer v_cache = zeros(gpu, phys_blocks* stride);

  PagedDecodeNvfp4Args valid() const {
    PagedDecodeNvfp4Args a;
    fill_common(a, q.ptr(), k_cache.ptr(), v_cache.ptr(), o.ptr(), tables.ptr(), lens.ptr());
    a.block_stride_bytes = stride;
    a.data_section_bytes = data_bytes;
    return a;
  }
  void launch(const PagedDecodeNvfp4Args& a) { mla_paged_decode_nvfp4(gpu, kernels.paged_decode_nvfp4, a); }
};

struct Fp8DecodeCase : DecodeBuffers {
  static constexpr std::uint64_t stride = row_width;  // the minimum row pitch
  static constexpr std::uint32_t comp = 2;
  DeviceBuffer k_cache = zeros(gpu, std::size_t{phys_blocks} * block_size * stride);
  DeviceBuffer v_cache = zeros(gpu, std::size_t{phys_blocks} * block_size * stride);
  DeviceBuffer sinks = zeros(gpu, q_heads * sizeof(float));
  DeviceBuffer comp_pool = zeros(gpu, std::size_t{num_seqs} * comp * 2 * stride);

  PagedDecodeFp8Args valid() const {
    PagedDecodeFp8Args a;
    fill_common(a, q.ptr(), k_cache.ptr(), v_cache.ptr(), o.ptr(), tables.ptr(), lens.ptr());
    a.k_scale = 0.5f;
    a.v_scale = 2.0f;
    a.cache_stride = stride;
    a.sliding_window = 3;
    a.sinks = sinks.ptr();
    a.comp_pool = comp_pool.ptr();
    a.comp_block_count = comp;
    return a;
  }
  void launch(const PagedDecodeFp8Args& a) { mla_paged_decode_fp8(gpu, kernels.paged_decode_fp8, a); }
};

// The rules both decode launchers share (validate_paged_decode), one SECTION each.
template <class Case, class Args>
void common_decode_rules(Case& c, Args& a, const char* kn) {
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;

  SECTION("q null") {
    a.q = {};
    reject(bad, {kn, "q is null"});
  }
  SECTION("k_cache null") {
    a.k_cache = {};
    reject(bad, {kn, "k_cache is null"});
  }
  SECTION("v_cache null") {
    a.v_cache = {};
    reject(bad, {kn, "v_cache is null"});
  }
  SECTION("o null") {
    a.o = {};
    reject(bad, {kn, "o is null"});
  }
  SECTION("block_tables null") {
    a.block_tables = {};
    reject(bad, {kn, "block_tables is null"});
  }
  SECTION("seq_lens null") {
    a.seq_lens = {};
    reject(bad, {kn, "seq_lens is null"});
  }
  SECTION("num_seqs 0") {
    a.num_seqs = 0;
    reject(bad, {kn, "num_seqs is 0"});
  }
  SECTION("num_q_heads 0") {
    a.num_q_heads = 0;
    reject(bad, {kn, "num_q_heads is 0"});
  }
  SECTION("num_kv_heads 0") {
    a.num_kv_heads = 0;
    reject(bad, {kn, "num_kv_heads is 0"});
  }
  SECTION("q_head_dim 0") {
    a.q_head_dim = 0;
    reject(bad, {kn, "q_head_dim is 0"});
  }
  SECTION("block_size 0") {
    a.block_size = 0;
    reject(bad, {kn, "block_size is 0"});
  }
  SECTION("max_blocks_per_seq 0") {
    a.max_blocks_per_seq = 0;
    reject(bad, {kn, "max_blocks_per_seq is 0"});
  }
  SECTION("num_seqs past the grid's y limit") {
    a.num_seqs = 65536;
    reject(bad, {kn, "num_seqs 65536", "65535"});
    a.num_seqs = 65535;
    a.o = DevicePtr{1ull << 40};  // (o of 65535 sequences: a sentinel apart from q, in a dry run)
    c.require_accepted_dry([&] { c.launch(a); });
  }
  // Before: accepted; a seed block wrote its o row over the q rows of blocks still to read them.
  SECTION("o over q, other than q itself row for row") {
    a.o = a.q + 64;
    reject(bad, {kn, "o spans", "which overlaps q's"});
    if (a.q_head_dim == a.kv_cache_dim) {
      a.o = a.q;  // a step in place: each block reads its q row before it writes that row of o
      c.require_accepted_dry([&] { c.launch(a); });
    } else {
      a.o = a.q;  // rows of other widths: o's row h is not q's
      reject(bad, {kn, "o spans", "which overlaps q's"});
    }
  }
  // Before: accepted; the kernel wrote o over the tables (later launches read garbage entries) or
  // over a pool's stored rows.
  SECTION("o over the tables or a pool's first row") {
    for (const auto& [at, name] : std::vector<std::pair<DevicePtr, std::string>>{{a.block_tables + 4, "block_tables'"},
                                                                                 {a.seq_lens, "seq_lens'"},
                                                                                 {a.k_cache, "k_cache's"},
                                                                                 {a.v_cache + 2, "v_cache's"}}) {
      INFO(name);
      a.o = at;
      reject(bad, {kn, "o spans", "which overlaps " + name});
    }
  }
  SECTION("num_q_heads past the grid's x limit") {
    a.num_q_heads = 0x8000'0000u;  // a multiple of num_kv_heads 2
    reject(bad, {kn, "num_q_heads 2147483648", "2147483647"});
  }
  SECTION("num_q_heads not a multiple of num_kv_heads") {
    a.num_q_heads = 5;
    reject(bad, {kn, "num_q_heads 5", "num_kv_heads 2"});
  }
  SECTION("q_head_dim > kv_cache_dim") {
    a.q_head_dim = 33;
    reject(bad, {kn, "q_head_dim 33", "kv_cache_dim 32"});
    a.q_head_dim = 32;  // equal: accepted
    c.require_accepted_dry([&] { c.launch(a); });
  }
  SECTION("kv_cache_dim > kMaxKvCacheDim is unsupported") {
    a.kv_cache_dim = 1025;
    reject(Errc::unsupported, {kn, "kv_cache_dim 1025", "1024"});
    a.kv_cache_dim = 1024;  // the limit itself: accepted (sizes grown to match)
    if constexpr (requires { a.cache_stride; }) {
      a.cache_stride = 2 * 1024;
    } else {
      a.data_section_bytes = 4 * 2048 / 2;
      a.block_stride_bytes = a.data_section_bytes + 4 * 2048 / 16;
    }
    c.require_accepted_dry([&] { c.launch(a); });
  }
  SECTION("inv_sqrt_d not finite") {
    for (const auto& [x, text] : std::vector<std::pair<float, std::string>>{
             {kInf, "inv_sqrt_d inf"}, {-kInf, "inv_sqrt_d -inf"}, {kNaN, "inv_sqrt_d nan"}}) {
      INFO(text);
      a.inv_sqrt_d = x;
      reject(bad, {kn, text});
    }
    // Finite, but not times log2(e) in FP32, the wgmma kernels' base-2 logits: every logit inf, o NaN.
    a.inv_sqrt_d = 3e38f;
    reject(bad, {kn, "inv_sqrt_d 3e+38 times log2(e)", "past FP32's range"});
    a.inv_sqrt_d = 2e38f;  // times log2(e) 2.9e38: finite
    c.require_accepted_dry([&] { c.launch(a); });
  }
}

TEST_CASE("mla_paged_decode_nvfp4: every validation rule", "[validation]") {
  Nvfp4DecodeCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  const char* kn = "mla_paged_decode_nvfp4";
  common_decode_rules(c, a, kn);

  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  SECTION("row width not a multiple of 16") {
    a.kv_cache_dim = 28;  // 2 KV heads: row width 56
    reject(bad, {kn, "row width 56", "16"});
  }
  SECTION("data_section_bytes < block_size x row width / 2") {
    a.data_section_bytes = 127;
    reject(bad, {kn, "data_section_bytes 127"});
    // 2^30 KV heads x 1024 values x 2^24 tokens = 2^64 bytes x 2: block_size x row width wraps
    // to 0 in 64 bits, which must not make empty sections acceptable.
    a.num_q_heads = a.num_kv_heads = 1u << 30;
    a.kv_cache_dim = 1024;
    a.block_size = 1u << 24;
    a.data_section_bytes = 0;
    a.block_stride_bytes = 0;
    reject(bad, {kn, "data_section_bytes 0"});
  }
  SECTION("block_stride_bytes < data_section_bytes + block_size x row width / 16") {
    a.block_stride_bytes = 143;
    reject(bad, {kn, "block_stride_bytes 143"});
    // data + scales past 2^64 must not wrap around to a small bound.
    a.data_section_bytes = kU64Max;
    a.block_stride_bytes = kU64Max;
    reject(bad, {kn, "block_stride_bytes 18446744073709551615"});
  }
}

TEST_CASE("mla_paged_decode_fp8: every validation rule", "[validation]") {
  Fp8DecodeCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  const char* kn = "mla_paged_decode_fp8";
  common_decode_rules(c, a, kn);

  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  const std::vector<std::pair<float, std::string>> bad_scales{
      {0.0f, "0"}, {-0.5f, "-0.5"}, {kInf, "inf"}, {-kInf, "-inf"}, {kNaN, "nan"}};
  SECTION("k_scale not finite or not positive") {
    for (const auto& [x, text] : bad_scales) {
      a.k_scale = x;
      reject(bad, {kn, "k_scale " + text});
    }
  }
  SECTION("v_scale not finite or not positive") {
    for (const auto& [x, text] : bad_scales) {
      a.v_scale = x;
      reject(bad, {kn, "v_scale " + text});
    }
  }
  SECTION("inv_sqrt_d times k_scale past FP32's range") {  // each finite, the split path's logit scale not
    a.inv_sqrt_d = 1e30f, a.k_scale = 1e20f;
    reject(bad, {kn, "inv_sqrt_d 1e+30 times k_scale 1e+20 (the logit scale) times log2(e) is past FP32's range"});
    a.k_scale = 2e8f;  // 2e38 times log2(e): finite
    c.require_accepted_dry([&] { c.launch(a); });
  }
  SECTION("cache_stride < row width") {
    a.cache_stride = 63;  // row width 2 x 32
    reject(bad, {kn, "cache_stride 63", "64"});
  }
  SECTION("o over sinks or the compressed pool") {
    a.o = a.sinks;
    reject(bad, {kn, "o spans", "which overlaps sinks'"});
    a.o = a.comp_pool + 8;
    reject(bad, {kn, "o spans", "which overlaps comp_pool's"});
    a.comp_block_count = 0;  // no compressed entries: the pool is not read
    c.require_accepted_dry([&] { c.launch(a); });
  }
}

// ---- paged cache stores -------------------------------------------------------

struct StoreShape {
  static constexpr std::uint32_t tokens = 3, row_width = 32, block_size = 4, phys_blocks = 2;
};

template <class Args>
void fill_store(Args& a, DevicePtr k_src, DevicePtr v_src, DevicePtr k, DevicePtr v, DevicePtr slots) {
  a.k_src = k_src;
  a.v_src = v_src;
  a.k_cache = k;
  a.v_cache = v;
  a.slot_mapping = slots;
  a.num_tokens = StoreShape::tokens;
  a.row_width = StoreShape::row_width;
  a.block_size = StoreShape::block_size;
}

struct StoreBuffers : Emu, StoreShape {
  DeviceBuffer k_src = zeros(gpu, std::size_t{tokens} * row_width * kBf16);
  DeviceBuffer v_src = zeros(gpu, std::size_t{tokens} * row_width * kBf16);
  DeviceBuffer slots = int32s(gpu, {5, -1, 2});
};

struct Fp8StoreCase : StoreBuffers {
  static constexpr std::uint64_t stride = row_width;
  DeviceBuffer k_cache{gpu, std::size_t{phys_blocks} * block_size* stride};
  DeviceBuffer v_cache{gpu, std::size_t{phys_blocks} * block_size* stride};

  CacheStoreFp8Args valid() const {
    CacheStoreFp8Args a;
    fill_store(a, k_src.ptr(), v_src.ptr(), k_cache.ptr(), v_cache.ptr(), slots.ptr());
    a.cache_stride = stride;
    a.k_scale = 0.5f;
    a.v_scale = 2.0f;
    return a;
  }
  void launch(const CacheStoreFp8Args& a) { mla_paged_cache_store_fp8(gpu, kernels.paged_cache_store_fp8, a); }
};

struct Nvfp4StoreCase : StoreBuffers {
  static constexpr std::uint64_t data_bytes = 64, stride = 72;  // 4 * 32 / 2, + 4 * 32 / 16
  DeviceBuffer k_cache{gpu, phys_blocks* stride};
  DeviceBuffer v_cache{gpu, phys_blocks* stride};

  CacheStoreNvfp4Args valid() const {
    CacheStoreNvfp4Args a;
    fill_store(a, k_src.ptr(), v_src.ptr(), k_cache.ptr(), v_cache.ptr(), slots.ptr());
    a.block_stride_bytes = stride;
    a.data_section_bytes = data_bytes;
    return a;
  }
  void launch(const CacheStoreNvfp4Args& a) { mla_paged_cache_store_nvfp4(gpu, kernels.paged_cache_store_nvfp4, a); }
};

template <class Case, class Args>
void common_store_rules(Case& c, Args& a, const char* kn) {
  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;

  SECTION("k_src null") {
    a.k_src = {};
    reject(bad, {kn, "k_src is null"});
  }
  SECTION("v_src null") {
    a.v_src = {};
    reject(bad, {kn, "v_src is null"});
  }
  SECTION("k_cache null") {
    a.k_cache = {};
    reject(bad, {kn, "k_cache is null"});
  }
  SECTION("v_cache null") {
    a.v_cache = {};
    reject(bad, {kn, "v_cache is null"});
  }
  SECTION("slot_mapping null") {
    a.slot_mapping = {};
    reject(bad, {kn, "slot_mapping is null"});
  }
  SECTION("num_tokens 0") {
    a.num_tokens = 0;
    reject(bad, {kn, "num_tokens is 0"});
  }
  SECTION("row_width 0") {
    a.row_width = 0;
    reject(bad, {kn, "row_width is 0"});
  }
  SECTION("block_size 0") {
    a.block_size = 0;
    reject(bad, {kn, "block_size is 0"});
  }
  SECTION("num_tokens past the grid's x limit") {
    a.num_tokens = 0x8000'0000u;
    reject(bad, {kn, "num_tokens 2147483648", "2147483647"});
    a.num_tokens = 0x7FFF'FFFFu;
    // (the sources then span 128 GiB: the caches go past them, at addresses the dry run never reads)
    a.k_cache = DevicePtr{0x7100'0000'0000}, a.v_cache = DevicePtr{0x7200'0000'0000};
    c.require_accepted_dry([&] { c.launch(a); });
  }
  SECTION("one latent pool as both caches, two sources") {
    a.v_cache = a.k_cache;
    reject(bad, {kn, "k_cache and v_cache are one pool", "k_src", "v_src", "differ"});
  }
  // Before: accepted, and the store overwrote its own slot mapping or wrote V's row over K's.
  SECTION("a cache's first row over a source or the slot mapping") {
    a.k_cache = a.k_src + 8;
    reject(bad, {kn, "k_cache spans", "overlaps k_src's"});
    a = c.valid(), a.v_cache = a.slot_mapping;
    reject(bad, {kn, "v_cache spans", "overlaps slot_mapping's"});
    a = c.valid(), a.k_cache = a.v_src + (std::uint64_t{a.num_tokens} * a.row_width * 2 - 1);
    reject(bad, {kn, "k_cache spans", "overlaps v_src's"});
  }
  SECTION("the two caches' first rows overlapping") {
    a.v_cache = a.k_cache + 8;
    reject(bad, {kn, "v_cache spans", "overlaps k_cache's"});
    a.v_cache = a.k_cache + a.row_width;  // the rows after its first follow slot_mapping: not seen here
    c.require_accepted_dry([&] { c.launch(a); });
  }
}

TEST_CASE("mla_paged_cache_store_fp8: every validation rule", "[validation]") {
  Fp8StoreCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  const char* kn = "mla_paged_cache_store_fp8";
  common_store_rules(c, a, kn);

  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  const std::vector<std::pair<float, std::string>> bad_scales{
      {0.0f, "0"}, {-0.5f, "-0.5"}, {kInf, "inf"}, {-kInf, "-inf"}, {kNaN, "nan"}};
  SECTION("cache_stride < row_width") {
    a.cache_stride = 31;
    reject(bad, {kn, "cache_stride 31", "row_width 32"});
  }
  SECTION("a cache's first row is row_width bytes") {
    a.v_cache = a.k_cache + (a.row_width - 1);
    reject(bad, {kn, "v_cache spans", "overlaps k_cache's"});
  }
  SECTION("k_scale not finite or not positive") {
    for (const auto& [x, text] : bad_scales) {
      a.k_scale = x;
      reject(bad, {kn, "k_scale " + text});
    }
  }
  SECTION("v_scale not finite or not positive") {
    for (const auto& [x, text] : bad_scales) {
      a.v_scale = x;
      reject(bad, {kn, "v_scale " + text});
    }
  }
  SECTION("one latent pool as both caches, two scales") {
    a.v_cache = a.k_cache, a.v_src = a.k_src;
    reject(bad, {kn, "one pool (latent)", "k_scale 0.5 and v_scale 2 differ"});
    a.v_scale = a.k_scale;
    REQUIRE_NOTHROW(c.launch(a));
  }
}

TEST_CASE("mla_paged_cache_store_nvfp4: every validation rule", "[validation]") {
  Nvfp4StoreCase c;
  REQUIRE_NOTHROW(c.launch(c.valid()));
  auto a = c.valid();
  const char* kn = "mla_paged_cache_store_nvfp4";
  common_store_rules(c, a, kn);

  auto reject = [&](Errc code, std::initializer_list<std::string> needles) {
    c.require_rejected([&] { c.launch(a); }, code, needles);
  };
  const Errc bad = Errc::invalid_argument;
  SECTION("row_width not a multiple of 16") {
    a.row_width = 24;
    reject(bad, {kn, "row width 24", "16"});
  }
  SECTION("a cache's first row is its first data row, row_width / 2 bytes") {
    a.v_cache = a.k_cache + (a.row_width / 2 - 1);
    reject(bad, {kn, "v_cache spans", "overlaps k_cache's"});
    a.v_cache = a.k_cache + a.row_width / 2;
    c.require_accepted_dry([&] { c.launch(a); });
  }
  SECTION("data_section_bytes < block_size x row_width / 2") {
    a.data_section_bytes = 63;
    reject(bad, {kn, "data_section_bytes 63"});
  }
  SECTION("block_stride_bytes < data_section_bytes + block_size x row_width / 16") {
    a.block_stride_bytes = 71;
    reject(bad, {kn, "block_stride_bytes 71"});
    a.data_section_bytes = kU64Max;
    a.block_stride_bytes = kU64Max;
    reject(bad, {kn, "block_stride_bytes 18446744073709551615"});
  }
}

// ---- every argument reaches the parameter of its name -------------------------

// Distinct non-null sentinel pointers; never dereferenced (dry run).
DevicePtr sentinel(std::uint64_t i) { return DevicePtr{i << 44}; }

using Expected = std::vector<std::pair<std::string, KernelArg>>;

// The last launch recorded must be `entry` over `grid` x `block` with exactly `expected`, in
// order (the SPEC §3 declaration order), each argument under the declared name.
void check_record(const emu::EmulatorBackend& gpu, const std::string& entry, Dim3 grid, Dim3 block,
                  const Expected& expected) {
  REQUIRE(gpu.launch_log().size() == 1);
  const emu::LaunchRecord& r = gpu.launch_log().back();
  CHECK(r.module == "mla_absorbed");
  CHECK(r.entry == entry);
  CHECK(r.grid == grid);
  CHECK(r.block == block);
  REQUIRE(r.args.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("parameter " << i << " " << expected[i].first);
    CHECK(r.args[i].name == expected[i].first);
    CHECK(r.arg(expected[i].first) == expected[i].second);
  }
}

TEST_CASE("every launcher's arguments reach the declared parameters of the same name", "[validation]") {
  Emu c;
  c.gpu.record_launches(true);
  c.gpu.set_dry_run(true);
  using A = KernelArg;
  auto p = [](std::uint64_t i) { return A::ptr(sentinel(i)); };

  SECTION("mla_batched_gemv") {
    BatchedGemvArgs a{.input = sentinel(1),
                      .weight = sentinel(2),
                      .output = sentinel(3),
                      .n_out = 8001,
                      .k = 8002,
                      .num_heads = 8003,
                      .input_stride = 8004,
                      .output_stride = 8005};
    mla_batched_gemv(c.gpu, c.kernels.batched_gemv, a);
    // num_heads is the grid's y, not a parameter; ⌈8001 / 8⌉ = 1001.
    check_record(c.gpu, "mla_batched_gemv", {1001, 8003, 1}, {256, 1, 1},
                 {{"input", p(1)},
                  {"weight", p(2)},
                  {"output", p(3)},
                  {"n_out", A::u32(8001)},
                  {"k", A::u32(8002)},
                  {"input_stride", A::u32(8004)},
                  {"output_stride", A::u32(8005)}});
  }
  SECTION("mla_q_rope_scatter") {
    QRopeScatterArgs a{.q_full = sentinel(1),
                       .q_absorbed_buf = sentinel(2),
                       .q_rope_contiguous = sentinel(3),
                       .nq = 8001,
                       .hd = 8002,
                       .nope = 3001,
                       .rope = 4001,
                       .kv_lora = 2001,
                       .mla_cache_dim = 8003};
    mla_q_rope_scatter(c.gpu, c.kernels.q_rope_scatter, a);
    check_record(c.gpu, "mla_q_rope_scatter", {1, 1, 1}, {256, 1, 1},
                 {{"q_full", p(1)},
                  {"q_absorbed_buf", p(2)},
                  {"q_rope_contiguous", p(3)},
                  {"nq", A::u32(8001)},
                  {"hd", A::u32(8002)},
                  {"nope", A::u32(3001)},
                  {"rope", A::u32(4001)},
                  {"kv_lora", A::u32(2001)},
                  {"mla_cache_dim", A::u32(8003)}});
  }
  SECTION("mla_q_rope_writeback") {
    QRopeWritebackArgs a{.q_rope_direct = sentinel(1),
                         .q_absorbed_buf = sentinel(2),
                         .nq = 8011,
                         .rope = 4011,
                         .kv_lora = 2011,
                         .mla_cache_dim = 8013};
    mla_q_rope_writeback(c.gpu, c.kernels.q_rope_writeback, a);
    check_record(c.gpu, "mla_q_rope_writeback", {1, 1, 1}, {256, 1, 1},
                 {{"q_rope_direct", p(1)},
                  {"q_absorbed_buf", p(2)},
                  {"nq", A::u32(8011)},
                  {"rope", A::u32(4011)},
                  {"kv_lora", A::u32(2011)},
                  {"mla_cache_dim", A::u32(8013)}});
  }
  SECTION("mla_cache_assemble") {
    CacheAssembleArgs a{.kv_latent = sentinel(1),
                        .k_rope = sentinel(2),
                        .k_cache = sentinel(3),
                        .v_cache = sentinel(4),
                        .kv_lora = 311,
                        .rope = 211,
                        .mla_cache_dim = 1001};
    mla_cache_assemble(c.gpu, c.kernels.cache_assemble, a);
    check_record(c.gpu, "mla_cache_assemble", {1, 1, 1}, {1001, 1, 1},
                 {{"kv_latent", p(1)},
                  {"k_rope", p(2)},
                  {"k_cache", p(3)},
                  {"v_cache", p(4)},
                  {"kv_lora", A::u32(311)},
                  {"rope", A::u32(211)},
                  {"mla_cache_dim", A::u32(1001)}});
  }
  SECTION("rope_pairs_bf16") {
    RopePairsArgs a{.x = sentinel(1), .rows = 8021, .rope = 64, .pos = 8023, .theta = 1.5f};
    rope_pairs_bf16(c.gpu, c.kernels.rope_pairs_bf16, a);
    // 8021 rows x 32 pairs = 256672 threads: ⌈256672 / 256⌉ = 1003 blocks.
    check_record(
        c.gpu, "rope_pairs_bf16", {1003, 1, 1}, {256, 1, 1},
        {{"x", p(1)}, {"rows", A::u32(8021)}, {"rope", A::u32(64)}, {"pos", A::u32(8023)}, {"theta", A::f32(1.5f)}});
  }

  // Shared decode sentinels: kv_cache_dim 1008 ≤ 1024, 8 KV heads: row width 8064 (a multiple
  // of 16); num_q_heads 8040 = 8 x 1005.
  auto decode_common = [&](PagedDecodeCommon& a) {
    a.q = sentinel(1);
    a.k_cache = sentinel(2);
    a.v_cache = sentinel(3);
    a.o = sentinel(4);
    a.block_tables = sentinel(5);
    a.seq_lens = sentinel(6);
    a.max_blocks_per_seq = 8031;
    a.num_q_heads = 8040;
    a.num_kv_heads = 8;
    a.q_head_dim = 513;
    a.kv_cache_dim = 1008;
    a.block_size = 37;
    a.inv_sqrt_d = 2.5f;
    a.num_seqs = 77;
  };
  const Expected decode_expected{{"q", p(1)},
                                 {"k_cache", p(2)},
                                 {"v_cache", p(3)},
                                 {"o", p(4)},
                                 {"block_tables", p(5)},
                                 {"seq_lens", p(6)},
                                 {"max_blocks_per_seq", A::u32(8031)},
                                 {"num_q_heads", A::u32(8040)},
                                 {"num_kv_heads", A::u32(8)},
                                 {"q_head_dim", A::u32(513)},
                                 {"kv_cache_dim", A::u32(1008)},
                                 {"block_size", A::u32(37)},
                                 {"inv_sqrt_d", A::f32(2.5f)}};
  SECTION("mla_paged_decode_nvfp4") {
    PagedDecodeNvfp4Args a;
    decode_common(a);
    a.data_section_bytes = 900001;   // ≥ 37 x 8064 / 2 = 149184
    a.block_stride_bytes = 1900001;  // ≥ 900001 + 37 x 8064 / 16
    mla_paged_decode_nvfp4(c.gpu, c.kernels.paged_decode_nvfp4, a);
    Expected e = decode_expected;
    e.emplace_back("block_stride_bytes", A::u64(1900001));
    e.emplace_back("data_section_bytes", A::u64(900001));
    check_record(c.gpu, "mla_paged_decode_nvfp4", {8040, 77, 1}, {256, 1, 1}, e);
  }
  SECTION("mla_paged_decode_fp8") {
    PagedDecodeFp8Args a;
    decode_common(a);
    a.k_scale = 3.5f;
    a.v_scale = 4.5f;
    a.cache_stride = 100003;  // ≥ 8064
    a.sliding_window = 8051;
    a.sinks = sentinel(7);
    a.comp_pool = sentinel(8);
    a.comp_block_count = 8053;
    mla_paged_decode_fp8(c.gpu, c.kernels.paged_decode_fp8, a);
    Expected e = decode_expected;
    e.emplace_back("k_scale", A::f32(3.5f));
    e.emplace_back("v_scale", A::f32(4.5f));
    e.emplace_back("cache_stride", A::u64(100003));
    e.emplace_back("sliding_window", A::u32(8051));
    e.emplace_back("sinks", p(7));
    e.emplace_back("comp_pool", p(8));
    e.emplace_back("comp_block_count", A::u32(8053));
    check_record(c.gpu, "mla_paged_decode_fp8", {8040, 77, 1}, {256, 1, 1}, e);
  }
  SECTION("mla_paged_cache_store_fp8") {
    CacheStoreFp8Args a;
    a.k_src = sentinel(1);
    a.v_src = sentinel(2);
    a.k_cache = sentinel(3);
    a.v_cache = sentinel(4);
    a.slot_mapping = sentinel(5);
    a.num_tokens = 8061;
    a.row_width = 8062;
    a.block_size = 8063;
    a.cache_stride = 90001;
    a.k_scale = 5.5f;
    a.v_scale = 6.5f;
    mla_paged_cache_store_fp8(c.gpu, c.kernels.paged_cache_store_fp8, a);
    check_record(c.gpu, "mla_paged_cache_store_fp8", {8061, 1, 1}, {256, 1, 1},
                 {{"k_src", p(1)},
                  {"v_src", p(2)},
                  {"k_cache", p(3)},
                  {"v_cache", p(4)},
                  {"slot_mapping", p(5)},
                  {"num_tokens", A::u32(8061)},
                  {"row_width", A::u32(8062)},
                  {"block_size", A::u32(8063)},
                  {"cache_stride", A::u64(90001)},
                  {"k_scale", A::f32(5.5f)},
                  {"v_scale", A::f32(6.5f)}});
  }
  SECTION("mla_paged_cache_store_nvfp4") {
    CacheStoreNvfp4Args a;
    a.k_src = sentinel(1);
    a.v_src = sentinel(2);
    a.k_cache = sentinel(3);
    a.v_cache = sentinel(4);
    a.slot_mapping = sentinel(5);
    a.num_tokens = 8071;
    a.row_width = 8064;  // a multiple of 16
    a.block_size = 8073;
    a.data_section_bytes = 40000001;  // ≥ 8073 x 8064 / 2 = 32550336
    a.block_stride_bytes = 50000001;  // ≥ 40000001 + 8073 x 8064 / 16
    mla_paged_cache_store_nvfp4(c.gpu, c.kernels.paged_cache_store_nvfp4, a);
    check_record(c.gpu, "mla_paged_cache_store_nvfp4", {8071, 1, 1}, {256, 1, 1},
                 {{"k_src", p(1)},
                  {"v_src", p(2)},
                  {"k_cache", p(3)},
                  {"v_cache", p(4)},
                  {"slot_mapping", p(5)},
                  {"num_tokens", A::u32(8071)},
                  {"row_width", A::u32(8064)},
                  {"block_size", A::u32(8073)},
                  {"block_stride_bytes", A::u64(50000001)},
                  {"data_section_bytes", A::u64(40000001)}});
  }
}

}  // namespace

TEST_CASE("paged decode offsets and key counts that would wrap are refused", "[validation][wrap]") {
  emu::EmulatorBackend gpu;
  const auto k = MlaAbsorbedKernels::resolve(gpu);
  const DevicePtr p{0x10000};  // validation rejects before anything is read
  PagedDecodeFp8Args a;
  a.q = a.k_cache = a.v_cache = a.o = a.block_tables = a.seq_lens = p;
  a.max_blocks_per_seq = 4, a.num_q_heads = 1, a.num_kv_heads = 1, a.q_head_dim = 8, a.kv_cache_dim = 8;
  a.block_size = 65536, a.inv_sqrt_d = 0.1f, a.cache_stride = std::uint64_t{1} << 32, a.num_seqs = 1;
  // Block 65536 x block_size 65536 x 2^32 would wrap around to row 0 of the pool.
  test::require_error([&] { mla_paged_decode_fp8(gpu, k.paged_decode_fp8, a); }, Errc::invalid_argument,
                      {"mla_paged_decode_fp8", "block_size 65536", "cache_stride 4294967296", "wrap"});
  a.cache_stride = 8, a.block_size = 4;
  a.comp_pool = p, a.comp_block_count = 0xFFFF'FFF0u;  // the key count would wrap to 0
  test::require_error([&] { mla_paged_decode_fp8(gpu, k.paged_decode_fp8, a); }, Errc::invalid_argument,
                      {"comp_block_count 4294967280", "keys"});
  a.comp_block_count = 2, a.max_blocks_per_seq = 0x4000'0000u;  // 2^30 blocks x 4 tokens
  test::require_error([&] { mla_paged_decode_fp8(gpu, k.paged_decode_fp8, a); }, Errc::invalid_argument,
                      {"max_blocks_per_seq 1073741824", "block_size 4"});
  PagedDecodeNvfp4Args n;
  static_cast<PagedDecodeCommon&>(n) = a;
  n.max_blocks_per_seq = 4, n.kv_cache_dim = n.q_head_dim = 16;
  n.data_section_bytes = 32, n.block_stride_bytes = std::uint64_t{1} << 32;
  test::require_error([&] { mla_paged_decode_nvfp4(gpu, k.paged_decode_nvfp4, n); }, Errc::invalid_argument,
                      {"mla_paged_decode_nvfp4", "block_stride_bytes 4294967296"});
  CHECK(gpu.calls(emu::Op::launch) == 0);
}
