// The device emulator (SPEC §2): every detection class triggered on purpose,
// launch validation, per-block execution, fault injection and the launch log.
// Test-only ports are registered under module "test".
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "metrale/buffer.hpp"
#include "metrale/case_gen.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/kernel_case.hpp"
#include "metrale/launch.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_fast.hpp"
#include "support.hpp"

namespace {

using namespace metrale;
using namespace metrale::emu;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

// ---- test ports ------------------------------------------------------------

// out[blockIdx.x * 32 + t] = index + 1 for indices below n.
// Grid: any. Block: 32.
void fill(Block& blk, Global<float> out, std::uint32_t n) {
  blk.threads([&](std::uint32_t t) {
    const std::uint64_t i = std::uint64_t{blk.blockIdx.x} * blk.blockDim.x + t;
    if (i < n) out[i] = static_cast<float>(i + 1);
  });
}

// out[i] = in[i] for i < n. Grid: 1. Block: 32.
void copy_n(Block& blk, Global<const float> in, Global<float> out, std::uint32_t n) {
  blk.threads([&](std::uint32_t t) {
    for (std::uint32_t i = t; i < n; i += blk.num_threads()) out[i] = in[i];
  });
}

// out[0] = Σ in[0..n), read as one checked span. Grid: 1. Block: 1.
void sum_span(Block&, Global<const float> in, Global<float> out, std::uint32_t n) {
  float s = 0;
  for (float v : in.read(0, n)) s += v;
  out[0] = s;
}

// Every block writes out[0..32): a race as soon as the grid has two blocks.
void same_slot(Block& blk, Global<float> out) {
  blk.threads([&](std::uint32_t t) { out[t] = 1.0f; });
}

// Block b writes out[16b .. 16b+32): neighbours overlap by 16 floats.
void overlap(Block& blk, Global<float> out) {
  blk.threads([&](std::uint32_t t) { out[blk.blockIdx.x * 16 + t] = 2.0f; });
}

// out[32b + t] = in[(32b + 32 + t) mod n]: block b reads the slots block b + 1 writes when in is
// out. Grid: n / 32. Block: 32.
void next_block(Block& blk, Global<const float> in, Global<float> out, std::uint32_t n) {
  blk.threads([&](std::uint32_t t) {
    const std::uint32_t i = blk.blockIdx.x * 32 + t;
    out[i] = in[(i + 32) % n];
  });
}

// Block b writes bytes [b·row, b·row + n) of a and of b_out, thread t bytes t, t + 32, ... of each
// in turn, as the cache store's threads do: no write touches the last one logged. Its block's
// write log, as the launch leaves it: the most ranges it held at once (its capacity) and the
// ranges left.
std::atomic<std::size_t> g_strided_log_capacity{0}, g_strided_log_ranges{0};
void strided_pair(Block& blk, Global<std::uint8_t> a, Global<std::uint8_t> b_out, std::uint32_t n, std::uint32_t row) {
  blk.threads([&](std::uint32_t t) {
    for (std::uint32_t e = t; e < n; e += blk.num_threads()) {
      a[std::uint64_t{blk.blockIdx.x} * row + e] = 1;
      b_out[std::uint64_t{blk.blockIdx.x} * row + e] = 2;
    }
  });
  g_strided_log_capacity = std::max(g_strided_log_capacity.load(), blk.writes().capacity());
  g_strided_log_ranges = blk.writes().size();
}

// out[linear block * threads + t] = x << 24 | y << 16 | z << 8 | t. Grid, block: any.
void where_am_i(Block& blk, Global<std::uint32_t> out) {
  const Dim3 b = blk.blockIdx, g = blk.gridDim;
  const std::uint64_t linear = (std::uint64_t{b.z} * g.y + b.y) * g.x + b.x;
  blk.threads([&](std::uint32_t t) { out[linear * blk.num_threads() + t] = b.x << 24 | b.y << 16 | b.z << 8 | t; });
}

// pool[index] = value; out[0] = pool[index + 1] (64-bit offsets).
void poke_peek(Block&, Global<std::uint32_t> pool, std::uint64_t index, std::uint32_t value,
               Global<std::uint32_t> out) {
  pool[index] = value;
  out[0] = pool.load(index + 1);
}

// One parameter of every kind, for kind checks.
void kinds(Block&, Global<float>, std::uint32_t, std::int32_t, float, std::uint64_t) {}

// Accepts a block of exactly n threads (its rule reads the argument).
void sized(Block&, std::uint32_t) {}

void add_test_ports(Registry& r) {
  r.add<&fill>("test", "fill", {"out", "n"}, block_is({32, 1, 1}));
  r.add<&copy_n>("test", "copy_n", {"in", "out", "n"}, block_is({32, 1, 1}));
  r.add<&sum_span>("test", "sum_span", {"in", "out", "n"}, block_is({1, 1, 1}));
  r.add<&same_slot>("test", "same_slot", {"out"}, block_is({32, 1, 1}));
  r.add<&overlap>("test", "overlap", {"out"}, block_is({32, 1, 1}));
  r.add<&next_block>("test", "next_block", {"in", "out", "n"}, block_is({32, 1, 1}));
  r.add<&strided_pair>("test", "strided_pair", {"a", "b", "n", "row"}, block_is({32, 1, 1}));
  r.add<&where_am_i>("test", "where_am_i", {"out"}, {});
  r.add<&poke_peek>("test", "poke_peek", {"pool", "index", "value", "out"}, block_is({1, 1, 1}));
  r.add<&kinds>("test", "kinds", {"p", "u", "i", "f", "w"}, {});
  r.add<&sized>("test", "sized", {"n"}, [](Dim3 block, std::span<const KernelArg> args) -> std::optional<std::string> {
    if (block.count() == args[0].as_u32()) return std::nullopt;
    return "block of " + std::to_string(block.count()) + " threads but n is " + std::to_string(args[0].as_u32());
  });
}

// Options for a backend whose test must free everything: a leak fails it.
EmulatorOptions strict(unsigned threads = 4) {
  EmulatorOptions o;
  o.threads = threads;
  o.on_leak = [](const std::vector<AllocationInfo>& leaks) {
    FAIL_CHECK(leaks.size() << " allocations leaked, first at " << leaks.front().site);
  };
  return o;
}

// A backend with the test ports.
struct Gpu {
  explicit Gpu(EmulatorOptions o = strict()) : backend(std::move(o)) { add_test_ports(backend.registry()); }
  KernelLaunch launch(std::string_view entry) { return KernelLaunch(backend, backend.kernel("test", entry)); }
  EmulatorBackend backend;
};

/// The Error `body` throws; fails the test when it throws none.
template <class F>
Error error_of(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no metrale::Error was thrown");
  return Error(Errc::internal, "unreachable");
}

/// Require `e` to be a device fault whose message contains every needle.
void require_fault(const Error& e, std::initializer_list<std::string> needles) {
  INFO("error: " << e.what());
  CHECK(to_string(e.code()) == "device_fault");
  for (const auto& n : needles) CHECK_THAT(e.message(), Contains(n));
}

/// Upload a whole host vector to `dst`.
template <class T>
void put(GpuBackend& gpu, const std::vector<T>& host, DevicePtr dst) {
  upload(gpu, std::span<const T>(host), dst);
}

std::vector<float> iota_floats(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i + 1);
  return v;
}

}  // namespace

// ---- memory -------------------------------------------------------------------

TEST_CASE("emu: allocations are aligned, separated by unmapped gaps and never reused", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  const DevicePtr a1 = b.alloc(100);
  const DevicePtr a2 = b.alloc(1);
  CHECK(a1.addr % 256 == 0);
  CHECK(a2.addr % 256 == 0);
  CHECK(a2.addr >= a1.addr + 100 + 64 * 1024);
  const auto live = b.live_allocations();
  REQUIRE(live.size() == 2);
  CHECK(live[0].serial == 1);
  CHECK(live[0].bytes == 100);
  CHECK_THAT(live[0].site, Contains("emulator_test.cpp"));
  CHECK(b.live_bytes() == 101);

  // The gap after an allocation is no allocation.
  require_fault(error_of([&] { b.copy_h2d(std::as_bytes(std::span<const float>(iota_floats(1))), a1 + 100 + 4096); }),
                {"copy_h2d: write of 4 bytes", "which is in no allocation"});

  b.free(a1);
  b.free(a2);
  CHECK(b.live_allocations().empty());
  const DevicePtr a3 = b.alloc(100);
  CHECK(a3.addr > a2.addr);
  b.free(a3);
  b.free(DevicePtr{});  // as cudaFree(0)
  test::require_error([&] { b.alloc(0); }, Errc::invalid_argument, {"0 bytes"});
}

TEST_CASE("emu: copies round-trip and are bounds-checked", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  const auto host = iota_floats(16);
  DeviceBuffer buf(b, 64);
  put(b, host, buf.ptr());
  CHECK(buf.to_host<float>() == host);

  // An interior destination; the copy runs one float past the end.
  require_fault(
      error_of([&] { b.copy_h2d(std::as_bytes(std::span(host).first(4)), buf.ptr() + 52); }),
      {"copy_h2d: out-of-bounds write of 16 bytes", "offset 52", "allocation #1: 64 bytes", "emulator_test.cpp"});
  require_fault(error_of([&] { download<float>(b, buf.ptr(), 17); }),
                {"copy_d2h: out-of-bounds read of 68 bytes", "offset 0", "allocation #1: 64 bytes"});
  // Nothing of a failed copy lands: the buffer still holds 1..16.
  CHECK(buf.to_host<float>() == host);

  DeviceBuffer other(b, 64);
  require_fault(error_of([&] { b.copy_d2d(buf.ptr() + 32, other.ptr(), 64); }),
                {"copy_d2d: out-of-bounds read of 64 bytes", "offset 32", "allocation #1"});
  require_fault(error_of([&] { b.copy_d2d(buf.ptr(), other.ptr() + 8, 64); }),
                {"copy_d2d: out-of-bounds write of 64 bytes", "offset 8", "allocation #2"});
  b.copy_d2d(buf.ptr() + 16, other.ptr(), 32);
  CHECK(download<float>(b, other.ptr(), 8) == std::vector<float>(host.begin() + 4, host.begin() + 12));
}

// Before: a buffer that is not whole elements came back short (6 bytes as one uint32_t, or as no
// double), and an empty buffer's to_host went through a null backend.
TEST_CASE("DeviceBuffer::to_host refuses a buffer that is not whole elements of its type", "[emu]") {
  Gpu gpu;
  const std::vector<std::uint16_t> host{1, 2, 3};
  const auto buf = DeviceBuffer::from_host<std::uint16_t>(gpu.backend, host);
  CHECK(buf.to_host<std::uint16_t>() == host);
  const auto calls = gpu.backend.calls(emu::Op::copy_d2h);
  test::require_error([&] { (void)buf.to_host<std::uint32_t>(); }, Errc::invalid_argument,
                      {"to_host", "6 bytes", "4-byte elements"});
  test::require_error([&] { (void)buf.to_host<double>(); }, Errc::invalid_argument, {"6 bytes", "8-byte elements"});
  CHECK(gpu.backend.calls(emu::Op::copy_d2h) == calls);  // refused before any copy
  CHECK(DeviceBuffer{}.to_host<double>().empty());
  DeviceBuffer moved = DeviceBuffer::from_host<std::uint16_t>(gpu.backend, host), to(std::move(moved));
  CHECK(moved.to_host<float>().empty());  // NOLINT(bugprone-use-after-move): what a moved-from buffer holds
}

TEST_CASE("emu: copy_d2d marks what it copies as written and refuses never-written source bytes", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  DeviceBuffer src(b, 64), dst(b, 64);
  put(b, iota_floats(16), src.ptr());
  b.copy_d2d(src.ptr(), dst.ptr(), 32);  // dst bytes [0, 32) now written, [32, 64) not
  CHECK(download<float>(b, dst.ptr(), 8) == std::vector<float>(iota_floats(8)));
  require_fault(error_of([&] { dst.to_host<float>(); }),
                {"copy_d2h: read of bytes never written of 32 bytes", "offset 32", "allocation #2: 64 bytes"});
  // And a copy out of never-written bytes is itself a read of them.
  DeviceBuffer fresh(b, 16);
  require_fault(error_of([&] { b.copy_d2d(fresh.ptr(), dst.ptr(), 16); }),
                {"copy_d2d: read of bytes never written of 16 bytes", "offset 0", "allocation #3: 16 bytes"});
}

TEST_CASE("emu: bad frees are device faults naming the address and allocation", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  const DevicePtr p = b.alloc(48);
  SECTION("double free") {
    b.free(p);
    require_fault(error_of([&] { b.free(p); }),
                  {"double free of " + fmt::format("{:#x}", p.addr), "allocation #1: 48 bytes", "emulator_test.cpp"});
  }
  SECTION("interior address") {
    require_fault(error_of([&] { b.free(p + 16); }), {"offset 16 inside allocation #1: 48 bytes", "not its start"});
    b.free(p);
  }
  SECTION("never allocated") {
    require_fault(error_of([&] { b.free(DevicePtr{0x1234'5678}); }), {"free of 0x12345678, which was never allocated"});
    require_fault(error_of([&] { b.free(p + 4096); }), {"never allocated"});  // in the gap after p
    b.free(p);
  }
  CHECK(b.live_allocations().empty());
}

TEST_CASE("emu: use after free is reported by copies and kernels", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  const DevicePtr in = b.alloc(128);
  put(b, iota_floats(32), in);
  DeviceBuffer out(b, 128);
  b.free(in);
  require_fault(error_of([&] { download<float>(b, in, 4); }),
                {"copy_d2h: read after free of 16 bytes", "offset 0", "allocation #1: 128 bytes", "emulator_test.cpp"});
  require_fault(error_of([&] { b.copy_h2d(std::as_bytes(std::span<const float>(iota_floats(1))), in + 8); }),
                {"copy_h2d: write after free", "offset 8", "allocation #1"});
  const Error e = error_of([&] {
    gpu.launch("copy_n").block({32, 1, 1}).arg_ptr(in).arg_ptr(out.ptr()).arg_u32(32).launch();
  });
  CHECK_THAT(e.what(), StartsWith("test.copy_n: copy_n block (0,0,0) thread 0: "));
  require_fault(e, {"read after free of 4 bytes through parameter in", "offset 0", "allocation #1: 128 bytes",
                    "emulator_test.cpp"});
}

// ---- kernel accesses ------------------------------------------------------------

TEST_CASE("emu: out-of-bounds kernel writes and reads name the block, thread, parameter and allocation", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  DeviceBuffer out(b, 32 * sizeof(float));
  SECTION("write: block 1 thread 0 is the first to pass the end") {
    // Blocks 1..7 all fault; the lowest is reported whatever the scheduling.
    for (int run = 0; run < 10; ++run) {
      const Error e = error_of([&] {
        gpu.launch("fill").grid({8, 1, 1}).block({32, 1, 1}).arg_ptr(out.ptr()).arg_u32(256).launch();
      });
      CHECK_THAT(e.what(), StartsWith("test.fill: fill block (1,0,0) thread 0: "));
      require_fault(e, {"out-of-bounds write of 4 bytes through parameter out", "offset 128",
                        "allocation #1: 128 bytes at " + fmt::format("{:#x}", out.ptr().addr), "emulator_test.cpp"});
    }
  }
  SECTION("read, element by element") {
    DeviceBuffer in(b, 16 * sizeof(float));
    put(b, iota_floats(16), in.ptr());
    const Error e = error_of([&] {
      gpu.launch("copy_n").block({32, 1, 1}).arg_ptr(in.ptr()).arg_ptr(out.ptr()).arg_u32(32).launch();
    });
    require_fault(e, {"copy_n block (0,0,0) thread 16: out-of-bounds read of 4 bytes through parameter in", "offset 64",
                      "allocation #2: 64 bytes"});
  }
  SECTION("read, as one span") {
    DeviceBuffer in(b, 16 * sizeof(float));
    put(b, iota_floats(16), in.ptr());
    const Error e = error_of([&] {
      gpu.launch("sum_span").block({1, 1, 1}).arg_ptr(in.ptr()).arg_ptr(out.ptr()).arg_u32(17).launch();
    });
    require_fault(e, {"sum_span block (0,0,0): out-of-bounds read of 68 bytes through parameter in", "offset 0",
                      "allocation #2: 64 bytes"});
    // In bounds it works, and reads exactly what was uploaded.
    gpu.launch("sum_span").block({1, 1, 1}).arg_ptr(in.ptr()).arg_ptr(out.ptr()).arg_u32(16).launch();
    CHECK(download<float>(b, out.ptr(), 1)[0] == 136.0f);
  }
  SECTION("a null pointer is in no allocation") {
    const Error e = error_of([&] { gpu.launch("fill").block({32, 1, 1}).arg_ptr(DevicePtr{}).arg_u32(1).launch(); });
    require_fault(e,
                  {"fill block (0,0,0) thread 0: write of unmapped memory", "parameter out = 0x0", "in no allocation"});
  }
}

TEST_CASE("emu: reading bytes never written is a fault, unless the check is off", "[emu]") {
  SECTION("checked") {
    Gpu gpu;
    auto& b = gpu.backend;
    DeviceBuffer in(b, 64), out(b, 64);
    put(b, iota_floats(8), in.ptr());  // floats 8..15 never written
    const Error e = error_of([&] {
      gpu.launch("copy_n").block({32, 1, 1}).arg_ptr(in.ptr()).arg_ptr(out.ptr()).arg_u32(16).launch();
    });
    require_fault(e, {"copy_n block (0,0,0) thread 8: read of bytes never written of 4 bytes through parameter in",
                      "offset 32", "allocation #1: 64 bytes", "emulator_test.cpp"});
  }
  SECTION("unchecked") {
    EmulatorOptions o = strict();
    o.check_uninitialized = false;
    Gpu gpu(o);
    auto& b = gpu.backend;
    DeviceBuffer in(b, 64), out(b, 64);
    gpu.launch("copy_n").block({32, 1, 1}).arg_ptr(in.ptr()).arg_ptr(out.ptr()).arg_u32(16).launch();
    CHECK(out.to_host<float>() == std::vector<float>(16, 0.0f));  // fresh pages are zero
  }
}

TEST_CASE("emu: a misaligned access is a fault", "[emu]") {
  Gpu gpu;
  DeviceBuffer out(gpu.backend, 64);
  const Error e = error_of([&] { gpu.launch("fill").block({32, 1, 1}).arg_ptr(out.ptr() + 2).arg_u32(1).launch(); });
  require_fault(e, {"fill block (0,0,0) thread 0: misaligned write of 4 bytes through parameter out", "offset 2",
                    "allocation #1: 64 bytes"});
}

// ---- races ----------------------------------------------------------------------

// (No semicolon in a test's name: CTest would split it into two tests that match nothing.)
TEST_CASE("emu: two blocks writing the same bytes is a race, disjoint writes are not", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  DeviceBuffer out(b, 256 * sizeof(float));
  SECTION("every block writes the same slots") {
    const Error e = error_of([&] {
      gpu.launch("same_slot").grid({3, 1, 1}).block({32, 1, 1}).arg_ptr(out.ptr()).launch();
    });
    require_fault(e, {"write race in same_slot: blocks (0,0,0) and (1,0,0) both write bytes [0, 128) of parameter out",
                      "allocation #1: 1024 bytes", "emulator_test.cpp"});
  }
  SECTION("neighbouring blocks overlap by 16 floats") {
    const Error e = error_of([&] {
      gpu.launch("overlap").grid({4, 1, 1}).block({32, 1, 1}).arg_ptr(out.ptr()).launch();
    });
    require_fault(e, {"blocks (0,0,0) and (1,0,0) both write bytes [64, 128) of parameter out"});
  }
  SECTION("disjoint blocks") {
    gpu.launch("fill").grid({8, 1, 1}).block({32, 1, 1}).arg_ptr(out.ptr()).arg_u32(256).launch();
    CHECK(out.to_host<float>() == iota_floats(256));
  }
  SECTION("the check can be turned off") {
    EmulatorOptions o = strict();
    o.detect_races = false;
    Gpu quiet(o);
    DeviceBuffer buf(quiet.backend, 128);
    quiet.launch("same_slot").grid({3, 1, 1}).block({32, 1, 1}).arg_ptr(buf.ptr()).launch();
    CHECK(buf.to_host<float>() == std::vector<float>(32, 1.0f));
  }
}

TEST_CASE("emu: a block reading bytes another block writes is a race, reading its own is not", "[emu]") {
  // Before: an output overlapping an input gave a different answer on every run, without a word.
  Gpu gpu;
  auto& b = gpu.backend;
  const auto values = iota_floats(128);
  DeviceBuffer buf = DeviceBuffer::from_host(b, std::span<const float>(values)), other(b, 128 * sizeof(float));
  const auto next_block = [&](std::uint32_t blocks, DevicePtr in, DevicePtr out, std::uint32_t n) {
    gpu.launch("next_block").grid({blocks, 1, 1}).block({32, 1, 1}).arg_ptr(in).arg_ptr(out).arg_u32(n).launch();
  };
  SECTION("in is out: block 0 reads what block 1 writes") {
    const Error e = error_of([&] { next_block(4, buf.ptr(), buf.ptr(), 128); });
    // The first pair by offset: block 3 reads slots 0..31 (it wraps), which block 0 writes.
    require_fault(e, {"read-write race in next_block: block (0,0,0) writes bytes [0, 128) of parameter out",
                      "that block (3,0,0) reads through parameter in", "an output overlaps an input"});
  }
  SECTION("in lies in out's allocation at another offset") {  // block 1 reads out[16..48), block 0 writes out[0..32)
    const Error e = error_of([&] { next_block(2, buf.ptr() + 16 * sizeof(float), buf.ptr(), 64); });
    require_fault(e, {"read-write race in next_block: block (0,0,0) writes bytes [64, 128) of parameter out",
                      "that block (1,0,0) reads through parameter in"});
  }
  SECTION("separate buffers") {
    next_block(4, buf.ptr(), other.ptr(), 128);
    const auto got = other.to_host<float>();
    for (std::uint32_t i = 0; i < 128; ++i) CHECK(got[i] == static_cast<float>((i + 32) % 128 + 1));
  }
  SECTION("one block copying in place") {
    gpu.launch("copy_n").grid({1, 1, 1}).block({32, 1, 1}).arg_ptr(buf.ptr()).arg_ptr(buf.ptr()).arg_u32(128).launch();
    CHECK(buf.to_host<float>() == iota_floats(128));
  }
}

TEST_CASE("emu: a block's logged ranges are merged per allocation and parameter", "[emu]") {
  // Before (adversarial trial, forty-fourth session): a range was merged only into the last one
  // logged, so a strided loop over two rows logged a range a byte, and a 350 MB cache-store case
  // took 7.3 GB.
  emu::detail::Allocation x, y;
  x.serial = 1, y.serial = 2;
  const char *p = "p", *q = "q";
  std::vector<emu::detail::AccessRange> ranges;
  for (std::uint64_t t = 0; t < 4; ++t)
    for (std::uint64_t e = t; e < 64; e += 4) ranges.push_back({&x, e, e + 1, p}), ranges.push_back({&y, e, e + 1, p});
  ranges.push_back({&x, 100, 104, p});  // apart from [0, 64): kept
  ranges.push_back({&x, 64, 66, q});    // touches it through another parameter: kept
  ranges.push_back({&y, 60, 70, p});    // overlaps y's [0, 64)
  REQUIRE(emu::detail::merge_ranges(ranges) == 4);
  const auto is = [](const emu::detail::AccessRange& r, const emu::detail::Allocation* a, std::uint64_t b,
                     std::uint64_t e,
                     const char* param) { return r.alloc == a && r.begin == b && r.end == e && r.param == param; };
  CHECK(std::count_if(ranges.begin(), ranges.end(), [&](const auto& r) { return is(r, &x, 0, 64, p); }) == 1);
  CHECK(std::count_if(ranges.begin(), ranges.end(), [&](const auto& r) { return is(r, &x, 100, 104, p); }) == 1);
  CHECK(std::count_if(ranges.begin(), ranges.end(), [&](const auto& r) { return is(r, &x, 64, 66, q); }) == 1);
  CHECK(std::count_if(ranges.begin(), ranges.end(), [&](const auto& r) { return is(r, &y, 0, 70, p); }) == 1);
}

TEST_CASE("emu: strided writes past the merge threshold still find a race and only a race", "[emu]") {
  // 3 blocks x 2 rows x 8192 bytes, a range a byte as logged: past the first merge at 4096 ranges.
  Gpu gpu;
  DeviceBuffer a(gpu.backend, 3 * 8192), b(gpu.backend, 3 * 8192);
  const auto run = [&](std::uint32_t row) {
    gpu.launch("strided_pair")
        .grid({3, 1, 1})
        .block({32, 1, 1})
        .arg_ptr(a.ptr())
        .arg_ptr(b.ptr())
        .arg_u32(8192)
        .arg_u32(row)
        .launch();
  };
  g_strided_log_capacity = 0;
  run(8192);  // rows apart: no race
  CHECK(a.to_host<std::uint8_t>() == std::vector<std::uint8_t>(3 * 8192, 1));
  CHECK(b.to_host<std::uint8_t>() == std::vector<std::uint8_t>(3 * 8192, 2));
  // A block's log merged as it grew: it never held its 16384 byte ranges at once, and ends with
  // one range a row (the diff review: the race checks alone pass without any merging).
  CHECK(g_strided_log_capacity <= 4096);
  CHECK(g_strided_log_ranges == 2);
  // rows 8191 bytes apart: each block's last byte is the next block's first
  const Error e = error_of([&] { run(8191); });
  require_fault(e, {"write race in strided_pair: blocks (0,0,0) and (1,0,0) both write bytes [8191, 8192) of "
                    "parameter a"});
}

// ---- leaks ----------------------------------------------------------------------

TEST_CASE("emu: allocations live at destruction are reported as leaks", "[emu]") {
  std::vector<AllocationInfo> leaks;
  int calls = 0;
  {
    EmulatorOptions o;
    o.on_leak = [&](const std::vector<AllocationInfo>& l) {
      leaks = l;
      ++calls;
    };
    EmulatorBackend b(o);
    const DevicePtr kept = b.alloc(16);
    const DevicePtr leaked = b.alloc(48);
    b.free(kept);
    CHECK(leaked.addr != 0);
  }
  CHECK(calls == 1);
  REQUIRE(leaks.size() == 1);
  CHECK(leaks[0].serial == 2);
  CHECK(leaks[0].bytes == 48);
  CHECK_THAT(leaks[0].site, Contains("emulator_test.cpp"));

  calls = 0;
  {
    EmulatorOptions o;
    o.on_leak = [&](const std::vector<AllocationInfo>&) { ++calls; };
    EmulatorBackend b(o);
    b.free(b.alloc(16));
  }
  CHECK(calls == 0);  // no leak, no call
}

// ---- launch validation ---------------------------------------------------------------

TEST_CASE("emu: arguments that disagree with the declared parameters are rejected", "[emu]") {
  Gpu gpu;
  const DevicePtr sentinel{0x1000};
  const KernelHandle k = gpu.backend.kernel("test", "kinds");
  auto run = [&](std::vector<KernelArg> args) { gpu.backend.launch(k, {1, 1, 1}, {1, 1, 1}, args, 0); };
  const std::vector<KernelArg> good{KernelArg::ptr(sentinel), KernelArg::u32(1), KernelArg::i32(-1), KernelArg::f32(1),
                                    KernelArg::u64(1)};
  run(good);
  test::require_error(
      [&] {
        run({good.begin(), good.begin() + 4});
      },
      Errc::launch_failed, {"4 arguments but kinds declares 5"});
  const std::vector<std::pair<std::size_t, KernelArg>> wrong{{0, KernelArg::u64(0x1000)},
                                                             {1, KernelArg::i32(1)},
                                                             {2, KernelArg::u32(1)},
                                                             {3, KernelArg::u32(1)},
                                                             {4, KernelArg::ptr(sentinel)}};
  const char* expected[] = {
      "argument 0 (p) is u64 but the kernel declares ptr", "argument 1 (u) is i32 but the kernel declares u32",
      "argument 2 (i) is u32 but the kernel declares i32", "argument 3 (f) is u32 but the kernel declares f32",
      "argument 4 (w) is ptr but the kernel declares u64"};
  for (const auto& [index, arg] : wrong) {
    auto args = good;
    args[index] = arg;
    test::require_error([&] { run(args); }, Errc::launch_failed, {expected[index]});
  }
  // Through the launcher builder the kernel's full name comes first.
  test::require_error(
      [&] {
        gpu.launch("fill").block({32, 1, 1}).arg_ptr(sentinel).arg_f32(1).launch();
      },
      Errc::launch_failed, {"test.fill: argument 1 (n) is f32 but the kernel declares u32"});
}

TEST_CASE("emu: block rules and device limits are checked before anything runs", "[emu]") {
  Gpu gpu;
  DeviceBuffer out(gpu.backend, 128);
  auto fill = [&](Dim3 grid, Dim3 block) {
    gpu.launch("fill").grid(grid).block(block).arg_ptr(out.ptr()).arg_u32(32).launch();
  };
  test::require_error(
      [&] {
        fill({1, 1, 1}, {64, 1, 1});
      },
      Errc::launch_failed, {"block (64,1,1) but the kernel requires (32,1,1)"});
  test::require_error([&] { fill({0, 1, 1}, {32, 1, 1}); }, Errc::launch_failed, {"grid (0,1,1) has a zero dimension"});
  test::require_error(
      [&] {
        fill({1, 1, 1}, {32, 0, 1});
      },
      Errc::launch_failed, {"block (32,0,1) has a zero dimension"});
  test::require_error([&] { fill({1, 1, 1}, {1025, 1, 1}); }, Errc::launch_failed, {"1025 threads, more than 1024"});
  test::require_error([&] { fill({1, 65536, 1}, {32, 1, 1}); }, Errc::launch_failed, {"grid (1,65536,1) exceeds"});
  // A rule may read the arguments.
  auto sized = [&](Dim3 block, std::uint32_t n) { gpu.launch("sized").block(block).arg_u32(n).launch(); };
  sized({8, 2, 1}, 16);
  test::require_error([&] { sized({8, 1, 1}, 16); }, Errc::launch_failed, {"block of 8 threads but n is 16"});
  // None of the rejected launches wrote anything.
  test::require_error([&] { out.to_host<float>(); }, Errc::device_fault, {"never written"});
}

TEST_CASE("emu: kernel lookup names the module and entry it could not find", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  const KernelHandle fill = b.kernel("test", "fill");
  CHECK(fill.id != 0);
  CHECK(b.kernel_name(fill) == "test.fill");
  CHECK(b.kernel("test", "copy_n") != fill);
  test::require_error([&] { b.kernel("test", "nope"); }, Errc::not_found, {"module test has no entry nope"});
  test::require_error([&] { b.kernel("nomodule", "fill"); }, Errc::not_found, {"nomodule", "fill"});
  test::require_error(
      [&] {
        b.launch(KernelHandle{9999}, {1, 1, 1}, {1, 1, 1}, {}, 0);
      },
      Errc::launch_failed, {"unknown kernel handle 9999"});
  // The build's own ports are registered by the constructor.
  const KernelHandle gemv = b.kernel("mla_absorbed", "mla_batched_gemv");
  CHECK(b.kernel_name(gemv) == "mla_absorbed.mla_batched_gemv");
  const std::vector<KernelArg> five(5, KernelArg::u32(1));
  test::require_error(
      [&] {
        b.launch(gemv, {1, 1, 1}, {256, 1, 1}, five, 0);
      },
      Errc::launch_failed, {"5 arguments but mla_batched_gemv declares 7"});
}

// ---- execution ----------------------------------------------------------------------

TEST_CASE("emu: a port runs once per block with blockIdx, blockDim and gridDim as on the device", "[emu]") {
  const unsigned threads = GENERATE(1u, 4u);
  Gpu gpu(strict(threads));
  CHECK(gpu.backend.threads() == threads);
  const Dim3 grid{3, 2, 4}, block{4, 2, 1};
  const std::size_t n = grid.count() * block.count();
  DeviceBuffer out(gpu.backend, n * sizeof(std::uint32_t));
  put(gpu.backend, std::vector<std::uint32_t>(n, 0xdeadbeef), out.ptr());  // poison
  gpu.launch("where_am_i").grid(grid).block(block).arg_ptr(out.ptr()).launch();
  const auto got = out.to_host<std::uint32_t>();
  std::size_t i = 0;
  for (std::uint32_t z = 0; z < grid.z; ++z)
    for (std::uint32_t y = 0; y < grid.y; ++y)
      for (std::uint32_t x = 0; x < grid.x; ++x)
        for (std::uint32_t t = 0; t < block.count(); ++t, ++i) {
          INFO("block (" << x << "," << y << "," << z << ") thread " << t);
          REQUIRE(got[i] == (x << 24 | y << 16 | z << 8 | t));
        }
}

TEST_CASE("emu: METRALE_EMU_THREADS sets the default number of threads", "[emu]") {
  ::setenv("METRALE_EMU_THREADS", "3", 1);
  EmulatorBackend from_env(strict(0));
  EmulatorBackend explicit_count(strict(2));
  ::unsetenv("METRALE_EMU_THREADS");
  CHECK(from_env.threads() == 3);
  CHECK(explicit_count.threads() == 2);
}

TEST_CASE("emu: a METRALE_EMU_* value that is not a positive integer is an error naming it", "[emu]") {
  for (const char* var : {"METRALE_EMU_THREADS", "METRALE_EMU_SHARED_BYTES", "METRALE_EMU_COMPUTE_CAPABILITY",
                          "METRALE_EMU_BLOCK_ACCESSES", "METRALE_EMU_LAUNCH_ACCESSES"})
    for (const char* bad : {"0", "-1", "abc", "101,376", "", "99999999999", "99999999999999999999"}) {
      // (99999999999 is a valid 64-bit limit for the launch's accesses.)
      if (std::string_view(var) == "METRALE_EMU_LAUNCH_ACCESSES" && std::string_view(bad) == "99999999999") continue;
      INFO(var << "=" << bad);
      ::setenv(var, bad, 1);
      const Error e = error_of([] { EmulatorBackend gpu(strict(0)); });
      ::unsetenv(var);
      CHECK(e.code() == Errc::invalid_argument);
      CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains(std::string(var) + "='" + bad + "'"));
      // Digits past the type say so (before, fresh-user trial: "is not a positive 32-bit integer").
      if (std::string_view(bad).starts_with("9999"))
        CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("' is above the largest allowed, "));
    }
}

TEST_CASE("emu: more than 1024 worker threads is an error naming the value", "[emu]") {
  // Before: METRALE_EMU_THREADS=1000000 started about 32k threads before the system refused one.
  ::setenv("METRALE_EMU_THREADS", "1025", 1);
  const Error from_env = error_of([] { EmulatorBackend gpu(strict(0)); });
  ::unsetenv("METRALE_EMU_THREADS");
  CHECK(from_env.code() == Errc::invalid_argument);
  CHECK_THAT(std::string(from_env.what()),
             Catch::Matchers::Contains("METRALE_EMU_THREADS='1025' is above the largest allowed, 1024"));
  const Error from_options = error_of([] { EmulatorBackend gpu(strict(1000000)); });
  CHECK(from_options.code() == Errc::invalid_argument);
  CHECK_THAT(std::string(from_options.what()),
             Catch::Matchers::Contains("EmulatorOptions::threads = 1000000 is above the largest allowed, 1024"));
  ::setenv("METRALE_EMU_THREADS", "1024", 1);  // the largest allowed still starts
  EmulatorBackend most(strict(0));
  ::unsetenv("METRALE_EMU_THREADS");
  CHECK(most.threads() == 1024);
}

TEST_CASE("emu: a block past its checked-access limit stops the launch with capacity_exceeded", "[emu]") {
  // Before: a 657 KB case file whose block table repeats one page under a seq_len of 2^31 − 1 ran
  // for hours. Each of this GEMV's blocks reads 8 weight rows and the input, and stores 8 values;
  // the block's start counts 8 accesses (one per warp) and a thread's 256-byte weight row and
  // input 4 each (one per 64 bytes), so thread 1 passes 16.
  const KernelCase c = gen::gemv_case(64, 128, 2, 0, 0, 5);
  EmulatorOptions o = strict();
  o.max_block_accesses = 16;
  EmulatorBackend tight(o);
  const Error e = error_of([&] { (void)run_kernel_case(tight, c); });
  CHECK(e.code() == Errc::capacity_exceeded);
  CHECK_THAT(std::string(e.what()),
             Catch::Matchers::Contains("mla_batched_gemv block (0,0,0) thread 1: more than 16 checked "
                                       "accesses to device memory"));
  CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("METRALE_EMU_BLOCK_ACCESSES"));
  ::setenv("METRALE_EMU_BLOCK_ACCESSES", "16", 1);
  EmulatorBackend from_env(strict());
  ::unsetenv("METRALE_EMU_BLOCK_ACCESSES");
  CHECK(from_env.options().max_block_accesses == 16u);
  CHECK(error_of([&] { (void)run_kernel_case(from_env, c); }).code() == Errc::capacity_exceeded);
  EmulatorBackend roomy(strict());  // the default, 2^28
  CHECK(roomy.options().max_block_accesses == 1u << 28);
  test::check_case(c);  // and the same case passes under it
}

TEST_CASE("emu: a launch past its checked-access limit stops with capacity_exceeded", "[emu]") {
  // Before: a 536 KB case of 4096 blocks, each just under the block's limit (a block table that
  // repeats one page), ran for hours. Each of these 8 blocks (one a head) reads 8192 keys' rows.
  gen::PagedSpec p;
  p.num_q_heads = 8, p.block_size = 64, p.max_blocks_per_seq = 128, p.num_blocks = 128, p.seq_lens = {8192};
  const KernelCase c = gen::paged_decode_case(p);
  EmulatorOptions o = strict();
  o.max_launch_accesses = 4096;  // one block's first batch passes it
  EmulatorBackend tight(o);
  const Error e = error_of([&] { (void)run_kernel_case(tight, c); });
  CHECK(e.code() == Errc::capacity_exceeded);
  CHECK_THAT(std::string(e.what()),
             Catch::Matchers::Contains("the launch's blocks made more than 4096 checked accesses to device memory"));
  CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("METRALE_EMU_LAUNCH_ACCESSES"));
  ::setenv("METRALE_EMU_LAUNCH_ACCESSES", "4096", 1);
  EmulatorBackend from_env(strict());
  ::unsetenv("METRALE_EMU_LAUNCH_ACCESSES");
  CHECK(from_env.options().max_launch_accesses == 4096u);
  CHECK(error_of([&] { (void)run_kernel_case(from_env, c); }).code() == Errc::capacity_exceeded);
  EmulatorBackend roomy(strict());  // the default, 2^30
  CHECK(roomy.options().max_launch_accesses == std::uint64_t{1} << 30);
  test::check_case(c);  // and the same case passes under it
}

// Before: the split ports serve up to 64 heads from each key row they read, and only the reads
// counted: a 1 MB case within both limits asked for half an hour (a 64-head one for hours;
// nineteenth session's adversarial run). Their arithmetic now counts too, one access per 64
// multiply-adds: this 64-head block's one tile reads about 5K accesses' bytes (Q, the tile's K and
// V rows, its partial) but multiplies 64 heads × 64 keys × (576 + 576) = 73,728 accesses' worth.
TEST_CASE("emu: the split ports' arithmetic counts against the checked-access limits", "[emu]") {
  gen::PagedSpec p;
  p.num_q_heads = 64, p.q_head_dim = p.kv_cache_dim = 576, p.block_size = 64, p.max_blocks_per_seq = 1,
  p.num_blocks = 1, p.seq_lens = {64};
  const KernelCase c = gen::split_kernel_case(p, 1, gen::SplitEntry::wgmma);
  EmulatorOptions o = strict();
  o.max_block_accesses = 20000;
  EmulatorBackend tight(o);
  const Error e = error_of([&] { (void)run_kernel_case(tight, c); });
  CHECK(e.code() == Errc::capacity_exceeded);
  CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("more than 20000 checked accesses to device memory "
                                                              "(its arithmetic counted with them)"));
  o.max_block_accesses = 90000;  // the arithmetic and the bytes together fit
  EmulatorBackend roomy(o);
  CHECK_NOTHROW(run_kernel_case(roomy, c));
}

// Before: a block added its accesses to the launch's count only in whole batches of 4096, so a
// launch of many small blocks was never stopped (seventeenth session's adversarial run).
TEST_CASE("emu: the launch's limit counts blocks of fewer than 4096 accesses", "[emu]") {
  const KernelCase c = gen::gemv_case(64, 128, 2, 0, 0, 5);  // 16 blocks of 8 rows, about 40 accesses each
  EmulatorOptions o = strict();
  o.max_launch_accesses = 64;
  EmulatorBackend tight(o);
  const Error e = error_of([&] { (void)run_kernel_case(tight, c); });
  CHECK(e.code() == Errc::capacity_exceeded);
  CHECK_THAT(std::string(e.what()),
             Catch::Matchers::Contains("the launch's blocks made more than 64 checked accesses to device memory"));
  o.max_launch_accesses = 1u << 20;
  EmulatorBackend roomy(o);
  CHECK_NOTHROW(run_kernel_case(roomy, c));
}

// Before: a block that touched no memory counted nothing, so a raw launch of 2^31 such blocks
// (the GEMV's rows past n_out) ran for a quarter of an hour within every limit (twentieth
// session's adversarial run). Each block's start now counts one access per warp.
TEST_CASE("emu: blocks that touch no memory count against the launch's limit", "[emu]") {
  EmulatorOptions o = strict();
  o.max_launch_accesses = 4096;
  EmulatorBackend tight(o);
  const auto k = MlaAbsorbedKernels::resolve(tight);
  const std::vector<Bf16> x(8, Bf16::from_float(1.0f));
  const auto in = DeviceBuffer::from_host<Bf16>(tight, x), w = DeviceBuffer::from_host<Bf16>(tight, x);
  const DeviceBuffer out(tight, 16);
  const auto launch = [&](std::uint32_t blocks) {
    // n_out 8: block 0 computes the 8 rows, every other block returns at once.
    KernelLaunch(tight, k.batched_gemv)
        .grid({blocks, 1, 1})
        .block({256, 1, 1})
        .arg_ptr(in.ptr())
        .arg_ptr(w.ptr())
        .arg_ptr(out.ptr())
        .arg_u32(8)
        .arg_u32(1)
        .arg_u32(1)
        .arg_u32(8)
        .launch();
  };
  CHECK_NOTHROW(launch(64));  // 64 blocks x 8 warps and block 0's rows fit 4096
  const Error e = error_of([&] { launch(1024); });
  CHECK(e.code() == Errc::capacity_exceeded);
  CHECK_THAT(std::string(e.what()), Contains("the launch's blocks made more than 4096 checked accesses"));
}

TEST_CASE("emu: METRALE_EMU_SHARED_BYTES sets the shared memory a block may have", "[emu]") {
  ::setenv("METRALE_EMU_SHARED_BYTES", "101376", 1);  // an sm_121's 99 KiB
  Gpu gb10;
  ::unsetenv("METRALE_EMU_SHARED_BYTES");
  Gpu h200;
  EmulatorOptions o = strict();
  o.max_shared_bytes_per_block = 4096;
  Gpu small(o);
  CHECK(gb10.backend.max_shared_bytes_per_block() == 101376u);
  CHECK(h200.backend.max_shared_bytes_per_block() == 232448u);
  CHECK(small.backend.max_shared_bytes_per_block() == 4096u);
  DeviceBuffer pool(gb10.backend, 8), out(gb10.backend, 4);
  const std::vector<std::uint32_t> init{1, 2};
  upload(gb10.backend, std::span<const std::uint32_t>(init), pool.ptr());
  auto poke = [&](std::uint32_t shared) {
    gb10.launch("poke_peek").block({1, 1, 1}).shared_bytes(shared).arg_ptr(pool.ptr()).arg_u64(0).arg_u32(7).arg_ptr(
        out.ptr()).launch();
  };
  poke(101376);
  CHECK(download<std::uint32_t>(gb10.backend, out.ptr(), 1)[0] == 2u);
  const Error e = error_of([&] { poke(101377); });
  CHECK(e.code() == Errc::launch_failed);
  CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("101377") && Catch::Matchers::Contains("101376"));
}

// A GB10 played on the emulator (sm_121, 99 KiB a block) runs what the device would: the sm_90a
// module's entries are refused as the CUDA backend cannot load them, so a 64-head FP8 step takes
// the mma.sync entries, and its o still matches the float64 reference. An H200 (the default)
// takes the wgmma entries on the same step.
TEST_CASE("emu: METRALE_EMU_COMPUTE_CAPABILITY plays another device", "[emu][mla_fast]") {
  ::setenv("METRALE_EMU_COMPUTE_CAPABILITY", "121", 1);  // and a GB10's shared memory and SMs by default
  EmulatorBackend gb10;
  ::unsetenv("METRALE_EMU_COMPUTE_CAPABILITY");
  EmulatorBackend h200;
  CHECK(gb10.compute_capability() == 121u);
  CHECK(gb10.max_shared_bytes_per_block() == 101376u);
  CHECK(gb10.multiprocessor_count() == 48u);  // 6144 CUDA cores, 128 an SM
  CHECK(h200.compute_capability() == 90u);
  CHECK(h200.max_shared_bytes_per_block() == 232448u);
  CHECK(h200.multiprocessor_count() == 132u);
  const Error refused = error_of([&] { gb10.kernel("mla_wgmma", "mla_paged_decode_wgmma_fp8"); });
  CHECK(refused.code() == Errc::unsupported);
  CHECK_THAT(std::string(refused.what()), Contains("module mla_wgmma is not built for compute capability 121"));
  CHECK(h200.kernel("mla_wgmma", "mla_paged_decode_wgmma_fp8").id != 0);
  const MlaFastKernels fast = MlaFastKernels::resolve(gb10);
  CHECK(fast.wgmma_fp8.id == 0);
  CHECK(fast.wgmma_latent_fp8.id == 0);
  CHECK(fast.wgmma_latent_nvfp4.id == 0);
  CHECK(fast.wgmma_latent_combine_nvfp4.id == 0);
  CHECK(fast.split_fp8.id != 0);

  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 64, p.block_size = 16, p.num_seqs = 2;
  p.max_blocks_per_seq = 12, p.num_blocks = 30, p.seq_lens = {150, 41}, p.sinks = true;
  const KernelCase c = gen::split_path_case(p);
  for (EmulatorBackend* gpu : {&h200, &gb10}) {
    INFO("compute capability " << gpu->compute_capability());
    gpu->record_launches(true);
    test::check_expected(*gpu, c);
    const bool wgmma =
        std::ranges::any_of(gpu->launch_log(), [](const LaunchRecord& l) { return l.module == "mla_wgmma"; });
    CHECK(wgmma == (gpu == &h200));
  }

  // Only the devices the kernels are built for (cmake/cuda.cmake): elsewhere the CUDA backend
  // would find no image of any module.
  for (const char* bad : {"80", "89", "100", "120", "1000"}) {
    INFO(bad);
    ::setenv("METRALE_EMU_COMPUTE_CAPABILITY", bad, 1);
    const Error e = error_of([] { EmulatorBackend{}; });
    ::unsetenv("METRALE_EMU_COMPUTE_CAPABILITY");
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(std::string(e.what()), Contains(fmt::format("METRALE_EMU_COMPUTE_CAPABILITY='{}' is not a compute "
                                                           "capability the kernels are built for: 90",
                                                           bad)));
  }
  EmulatorOptions o;
  o.compute_capability = 80;
  const Error e = error_of([&] { EmulatorBackend{o}; });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK_THAT(std::string(e.what()), Contains("EmulatorOptions::compute_capability = 80 is not"));
  // Less shared memory than any device allows, or more than the device played has (sm_90's 227
  // KiB, sm_121's 99 KiB), is refused too: the emulator checks only the dynamic, and a kernel may
  // declare up to 48 KiB of static.
  for (const auto& [bytes, cc, says] :
       {std::tuple{"49151", 90u, "is below the least a device allows, 49152"},
        std::tuple{"232449", 90u, "is above the largest allowed, 232448"},
        std::tuple{"101377", 121u, "is above the largest allowed, 101376 (unset: sm_121's 101376 bytes)"},
        std::tuple{"232448", 121u, "is above the largest allowed, 101376"}}) {
    INFO(bytes << " at compute capability " << cc);
    EmulatorOptions options;
    options.compute_capability = cc;
    ::setenv("METRALE_EMU_SHARED_BYTES", bytes, 1);
    const Error s = error_of([&] { EmulatorBackend{options}; });
    ::unsetenv("METRALE_EMU_SHARED_BYTES");
    CHECK(s.code() == Errc::invalid_argument);
    CHECK_THAT(std::string(s.what()), Contains(fmt::format("METRALE_EMU_SHARED_BYTES='{}' {}", bytes, says)));
  }
  // The device's own, and less, are taken.
  for (const auto& [bytes, cc] : {std::pair{"101376", 121u}, std::pair{"65536", 121u}, std::pair{"232448", 90u}}) {
    INFO(bytes << " at compute capability " << cc);
    EmulatorOptions options;
    options.compute_capability = cc;
    ::setenv("METRALE_EMU_SHARED_BYTES", bytes, 1);
    const std::uint32_t got = EmulatorBackend{options}.max_shared_bytes_per_block();
    ::unsetenv("METRALE_EMU_SHARED_BYTES");
    CHECK(got == std::stoul(bytes));
  }
}

TEST_CASE("emu: a pool past 2^31 bytes is addressed with 64-bit offsets", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  const std::size_t bytes = (std::size_t{1} << 31) + 4096;
  DeviceBuffer pool(b, bytes);  // costs only the pages touched
  DeviceBuffer out(b, 4);
  const std::uint64_t index = ((std::size_t{1} << 31) + 256) / 4;  // byte offset 2^31 + 256
  const std::uint32_t next = 0x600dcafe;
  upload(b, std::span<const std::uint32_t>(&next, 1), pool.ptr() + (index + 1) * 4);
  gpu.launch("poke_peek")
      .block({1, 1, 1})
      .arg_ptr(pool.ptr())
      .arg_u64(index)
      .arg_u32(0x12345678)
      .arg_ptr(out.ptr())
      .launch();
  CHECK(download<std::uint32_t>(b, out.ptr(), 1)[0] == next);
  CHECK(download<std::uint32_t>(b, pool.ptr() + index * 4, 1)[0] == 0x12345678u);
  // The last element is in bounds; one past it is not, at an offset past 2^31.
  const std::uint64_t last = bytes / 4 - 1;
  const Error e = error_of([&] {
    gpu.launch("poke_peek").block({1, 1, 1}).arg_ptr(pool.ptr()).arg_u64(last).arg_u32(1).arg_ptr(out.ptr()).launch();
  });
  require_fault(e, {"out-of-bounds read of 4 bytes through parameter pool", "offset 2147487744",
                    "allocation #1: 2147487744 bytes"});
}

// ---- dry run and launch log --------------------------------------------------------------

TEST_CASE("emu: the launch log names every argument", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  DeviceBuffer out(b, 128);
  gpu.launch("fill").block({32, 1, 1}).arg_ptr(out.ptr()).arg_u32(32).launch();
  CHECK(b.launch_log().empty());  // not recording yet
  b.record_launches(true);
  gpu.launch("fill").grid({1, 1, 1}).block({32, 1, 1}).shared_bytes(4096).arg_ptr(out.ptr()).arg_u32(7).launch();
  REQUIRE(b.launch_log().size() == 1);
  const LaunchRecord& r = b.launch_log()[0];
  CHECK(r.module == "test");
  CHECK(r.entry == "fill");
  CHECK(r.grid == Dim3{1, 1, 1});
  CHECK(r.block == Dim3{32, 1, 1});
  CHECK(r.shared_bytes == 4096);
  CHECK(r.cluster == Dim3{1, 1, 1});
  REQUIRE(r.args.size() == 2);
  CHECK(r.args[0].name == "out");
  CHECK(r.args[1].name == "n");
  CHECK(r.arg("out").as_ptr() == out.ptr());
  CHECK(r.arg("n").as_u32() == 7);
  test::require_error([&] { r.arg("missing"); }, Errc::not_found, {"test.fill", "missing"});
  // A rejected launch is not recorded.
  CHECK_THROWS(gpu.launch("fill").block({64, 1, 1}).arg_ptr(out.ptr()).arg_u32(7).launch());
  CHECK(b.launch_log().size() == 1);
  b.clear_launch_log();
  CHECK(b.launch_log().empty());
  b.record_launches(false);
  gpu.launch("fill").block({32, 1, 1}).arg_ptr(out.ptr()).arg_u32(7).launch();
  CHECK(b.launch_log().empty());
}

TEST_CASE("emu: a dry run validates and records but runs no block", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  DeviceBuffer out(b, 128);
  put(b, std::vector<float>(32, -1.0f), out.ptr());
  b.set_dry_run(true);
  gpu.launch("fill").block({32, 1, 1}).arg_ptr(out.ptr()).arg_u32(32).launch();
  // A sentinel pointer would fault if a block ran.
  gpu.launch("fill").grid({2, 1, 1}).block({32, 1, 1}).arg_ptr(DevicePtr{0xbad0}).arg_u32(64).launch();
  test::require_error(
      [&] {
        gpu.launch("fill").block({32, 1, 1}).arg_ptr(out.ptr()).arg_i32(1).launch();
      },
      Errc::launch_failed, {"argument 1 (n) is i32"});
  REQUIRE(b.launch_log().size() == 2);
  CHECK(b.launch_log()[1].arg("out").as_ptr() == DevicePtr{0xbad0});
  CHECK(b.launch_log()[1].grid == Dim3{2, 1, 1});
  b.set_dry_run(false);
  CHECK(out.to_host<float>() == std::vector<float>(32, -1.0f));
}

// ---- fault injection ------------------------------------------------------------------

namespace {

// Buffers made before a fault plan is installed, so the plan counts only the
// calls under test.
struct Prepared {
  explicit Prepared(Gpu& gpu) : b(gpu.backend), src(b, 64), dst(b, 64), k(b.kernel("test", "fill")) {
    put(b, iota_floats(16), src.ptr());
    for (int i = 0; i < 3; ++i) spares.push_back(b.alloc(16));
  }
  ~Prepared() {
    b.clear_faults();  // a test that stopped early may leave a plan behind
    for (auto p : spares) b.free(p);
    for (auto p : extra) b.free(p);
  }
  EmulatorBackend& b;
  DeviceBuffer src, dst;
  KernelHandle k;
  std::vector<DevicePtr> spares;  // call i of free releases spares[i] (null once released)
  std::vector<DevicePtr> extra;   // what successful alloc calls made
};

struct OpCase {
  Op op;
  Errc code;
  std::function<void(Prepared&, int call)> call;  // call = 0, 1, 2
};

std::vector<OpCase> op_cases() {
  return {
      {Op::alloc, Errc::out_of_memory, [](Prepared& p, int) { p.extra.push_back(p.b.alloc(8)); }},
      {Op::free, Errc::device_fault, [](Prepared& p, int i) { p.b.free(std::exchange(p.spares[i], DevicePtr{})); }},
      {Op::copy_h2d, Errc::device_fault, [](Prepared& p, int) { put(p.b, iota_floats(16), p.dst.ptr()); }},
      {Op::copy_d2h, Errc::device_fault,
       [](Prepared& p, int) {
         const auto got = p.src.to_host<float>();  // outside CHECK, which would swallow the error
         CHECK(got == iota_floats(16));
       }},
      {Op::copy_d2d, Errc::device_fault, [](Prepared& p, int) { p.b.copy_d2d(p.src.ptr(), p.dst.ptr(), 64); }},
      {Op::kernel, Errc::not_found,
       [](Prepared& p, int) {
         const KernelHandle k = p.b.kernel("test", "fill");
         CHECK(k == p.k);
       }},
      {Op::launch, Errc::launch_failed,
       [](Prepared& p, int) {
         KernelLaunch(p.b, p.k).block({32, 1, 1}).arg_ptr(p.dst.ptr()).arg_u32(16).launch();
       }},
      {Op::synchronize, Errc::device_fault, [](Prepared& p, int) { p.b.synchronize(0); }},
  };
}

}  // namespace

TEST_CASE("emu: any call of any operation can be made to fail, once or from then on", "[emu]") {
  for (const auto& c : op_cases()) {
    for (const bool persistent : {false, true}) {
      INFO(to_string(c.op) << (persistent ? " persistent" : " once"));
      Gpu gpu;
      Prepared p(gpu);
      auto& b = gpu.backend;
      const auto live_before = b.live_allocations().size();
      b.inject_fault({c.op, 2, persistent});
      c.call(p, 0);
      const std::uint64_t second = b.calls(c.op) + 1;
      const Error e = error_of([&] { c.call(p, 1); });
      CHECK(to_string(e.code()) == to_string(c.code));
      CHECK(e.message() == fmt::format("injected fault: {} call {}", to_string(c.op), second));
      if (c.op == Op::alloc) CHECK(b.live_allocations().size() == live_before + 1);  // the failed one added nothing
      if (persistent) {
        CHECK_THROWS_AS(c.call(p, 2), Error);
      } else {
        c.call(p, 2);
      }
      CHECK(b.calls(c.op) == second + 1);
      if (c.op == Op::free) CHECK(b.live_allocations().size() == live_before - 3);  // a failed free still frees
      b.clear_faults();
      if (c.op != Op::free) c.call(p, 0);
    }
  }
}

TEST_CASE("emu: an injected failure changes nothing", "[emu]") {
  Gpu gpu;
  Prepared p(gpu);
  auto& b = gpu.backend;
  b.inject_fault({Op::copy_h2d});
  CHECK_THROWS(put(b, iota_floats(16), p.dst.ptr()));
  b.inject_fault({Op::copy_d2d});
  CHECK_THROWS(b.copy_d2d(p.src.ptr(), p.dst.ptr(), 64));
  b.inject_fault({Op::launch});
  CHECK_THROWS(KernelLaunch(b, p.k).block({32, 1, 1}).arg_ptr(p.dst.ptr()).arg_u32(16).launch());
  // dst was never written by any of them.
  test::require_error([&] { p.dst.to_host<float>(); }, Errc::device_fault, {"never written"});
  b.inject_fault({Op::alloc});
  const auto serials_before = b.live_allocations().back().serial;
  CHECK_THROWS(b.alloc(8));
  p.extra.push_back(b.alloc(8));
  CHECK(b.live_allocations().back().serial == serials_before + 1);  // the failed call used no serial
}

TEST_CASE("emu: a plan without an operation counts every call", "[emu]") {
  Gpu gpu;
  auto& b = gpu.backend;
  DeviceBuffer buf(b, 64);
  const std::uint64_t total = b.calls();
  b.inject_fault({std::nullopt, 3, false});
  put(b, iota_floats(16), buf.ptr());                                                                           // 1
  b.synchronize(0);                                                                                             // 2
  test::require_error([&] { buf.to_host<float>(); }, Errc::device_fault, {"injected fault: copy_d2h call 1"});  // 3
  CHECK(buf.to_host<float>() == iota_floats(16));  // once only
  CHECK(b.calls() == total + 4);
  CHECK(b.calls(Op::copy_d2h) == 2);
  CHECK(b.calls(Op::copy_h2d) == 1);
  test::require_error([&] { b.inject_fault({Op::free, 0, false}); }, Errc::invalid_argument, {"nth 0"});
}

// A block-table entry the sequence uses that is not a block of the cache (SPEC §3): every paged
// port — the seed kernels, the split entries, the wgmma entries' ports — names the entry and the
// pool, not a read through k_cache at some offset. Unused columns may hold anything.
TEST_CASE("emu: the paged ports name a block-table entry outside the cache", "[emu][validation]") {
  EmulatorBackend emu;
  struct Launch {
    const char* what;
    KvFormat format;
    std::uint32_t dim;  // q_head_dim = kv_cache_dim
    std::optional<gen::SplitEntry> entry;
  };
  for (const Launch& l : {Launch{"seed", KvFormat::fp8, 8, {}}, Launch{"seed", KvFormat::nvfp4, 32, {}},
                          Launch{"split", KvFormat::fp8, 64, gen::SplitEntry::split},
                          Launch{"split", KvFormat::nvfp4, 64, gen::SplitEntry::split},
                          Launch{"wgmma", KvFormat::fp8, 576, gen::SplitEntry::wgmma},
                          Launch{"wgmma16_rs", KvFormat::fp8, 576, gen::SplitEntry::wgmma16_rs}}) {
    for (const std::int32_t bad : {8, -1, 2147483647}) {
      INFO(l.what << " " << (l.format == KvFormat::fp8 ? "fp8" : "nvfp4") << ", entry " << bad);
      gen::PagedSpec p;
      p.format = l.format, p.q_head_dim = p.kv_cache_dim = l.dim, p.num_q_heads = 4, p.block_size = 4;
      p.num_seqs = 2, p.seq_lens = {10, 7}, p.num_blocks = 8, p.max_blocks_per_seq = 4, p.fill = 2147483647;
      KernelCase c = l.entry ? gen::split_kernel_case(p, 1, *l.entry) : gen::paged_decode_case(p);
      run_kernel_case(emu, c);  // the good table, its unused columns INT32_MAX
      reinterpret_cast<std::int32_t*>(c.inputs.at("block_tables").data.data())[4 + 1] = bad;  // sequence 1, column 1
      std::string what;
      try {
        run_kernel_case(emu, c);
      } catch (const Error& e) {
        CHECK(e.code() == Errc::device_fault);
        what = e.what();
      }
      // The entry, a key of column 1 (keys 4 to 6), and the bytes the launch's strides send it to.
      const std::string named = fmt::format("block_tables[1][1] = {} puts key ", bad);
      const auto at = what.find(named);
      REQUIRE(at != std::string::npos);
      const std::uint32_t key = std::stoul(what.substr(at + named.size()));
      CHECK((key >= 4 && key <= 6));
      std::int64_t first = 0, end = 0;
      if (l.format == KvFormat::fp8) {
        first = (std::int64_t{bad} * 4 + key % 4) * static_cast<std::int64_t>(c.scalars.at("cache_stride").as_u64());
        end = first + l.dim;
      } else {
        first = std::int64_t{bad} * static_cast<std::int64_t>(c.scalars.at("block_stride_bytes").as_u64());
        end =
            first + static_cast<std::int64_t>(c.scalars.at("data_section_bytes").as_u64()) + (key % 4 + 1) * l.dim / 16;
      }
      CHECK_THAT(
          what, Contains(fmt::format("key {} outside k_cache: its {} would be bytes [{}, {}) of it (the entry is "
                                     "not a block of the cache, or the strides, block size and pool size "
                                     "disagree) (allocation #",
                                     key, l.format == KvFormat::fp8 ? "row" : "block through its scales", first, end)));
    }
  }
}
