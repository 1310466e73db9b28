// The CUDA backend's timing (CudaBackend::time_ms), on a GPU: what a held stream takes out of the
// time, and what happens when the timed work waits on the stream it holds. Without a GPU each
// test says so and checks nothing.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "metrale/buffer.hpp"
#include "support.hpp"

#ifdef METRALE_WITH_CUDA

namespace metrale {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kBytes = std::size_t{1} << 20;

bool have_gpu() {
  if (CudaBackend::available()) return true;
  WARN("no GPU here: " << CudaBackend::unavailable_reason());
  return false;
}

// Every byte of `b` is `value`.
void check_all(const DeviceBuffer& b, std::uint8_t value) {
  const std::vector<std::uint8_t> host = b.to_host<std::uint8_t>();
  std::size_t other = 0;
  for (const std::uint8_t x : host) other += x != value;
  CHECK(other == 0);
}

TEST_CASE("time_ms held: launches queued while the host waits start together", "[cuda][bench]") {
  if (!have_gpu()) return;
  CudaBackend gpu;
  const DeviceBuffer a(gpu, kBytes), b(gpu, kBytes);
  gpu.memset(a.ptr(), 0x5A, kBytes);
  gpu.synchronize(0);
  // Two launches with the host 50 ms late for the second: the stream idles between them unless
  // held until both are queued. The copy comes last, so b ends as a whatever the order of timing.
  const auto work = [&] {
    gpu.memset(b.ptr(), 0, kBytes);
    std::this_thread::sleep_for(50ms);
    gpu.copy_d2d(a.ptr(), b.ptr(), kBytes);
  };
  const double lone = gpu.time_ms(work);
  const double held = gpu.time_ms(work, 0, true);
  INFO("lone " << lone << " ms, held " << held << " ms");
  CHECK(lone >= 45);
  CHECK(held < 10);
  check_all(b, 0x5A);
  // Held again: the hold word counts on, and a second hold waits as the first did.
  CHECK(gpu.time_ms(work, 0, true) < 10);
  check_all(b, 0x5A);
}

TEST_CASE("time_ms held: work that waits on its held stream is refused, and the stream goes on", "[cuda][bench]") {
  if (!have_gpu()) return;
  CudaBackend gpu;
  const DeviceBuffer b(gpu, kBytes);
  const auto start = std::chrono::steady_clock::now();
  test::require_error(
      [&] {
        gpu.time_ms(
            [&] {
              gpu.memset(b.ptr(), 0x11, kBytes);
              gpu.synchronize(0);  // waits for the hold: the watchdog lets the stream go
            },
            0, true);
      },
      Errc::launch_failed, {"did not queue within 2 s", "waited on that stream, or filled its queue"});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited >= 1.9);
  CHECK(waited < 10);
  gpu.synchronize(0);
  check_all(b, 0x11);
  // The backend times on as before, held or not.
  CHECK(gpu.time_ms([&] { gpu.memset(b.ptr(), 0x22, kBytes); }, 0, true) > 0);
  check_all(b, 0x22);
}

}  // namespace
}  // namespace metrale

#endif
