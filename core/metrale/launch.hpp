// The typed launch builder of the seeds (SPEC §1): every argument keeps its
// kind (ptr, u32, i32, f32, u64) all the way to the backend.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>

#include "metrale/backend.hpp"

namespace metrale {

/// ⌈a / b⌉ for unsigned integers; b must be > 0.
template <std::unsigned_integral T>
constexpr T div_ceil(T a, T b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

class KernelLaunch {
 public:
  static constexpr std::size_t kMaxArgs = 32;

  KernelLaunch(GpuBackend& gpu, KernelHandle kernel) : gpu_(gpu), kernel_(kernel) {}

  KernelLaunch& grid(Dim3 g) { grid_ = g; return *this; }
  KernelLaunch& block(Dim3 b) { block_ = b; return *this; }
  /// Dynamic shared memory per block, in bytes.
  KernelLaunch& shared_bytes(std::uint32_t n) { shared_ = n; return *this; }
  /// Programmatic dependent launch (GpuBackend::launch's `early_start`).
  KernelLaunch& early_start(bool on = true) { early_start_ = on; return *this; }
  /// Thread-block clusters of shape `c` (GpuBackend::launch's `cluster`).
  KernelLaunch& cluster(Dim3 c) { cluster_ = c; return *this; }
  KernelLaunch& arg_ptr(DevicePtr v) { return push(KernelArg::ptr(v)); }
  KernelLaunch& arg_u32(std::uint32_t v) { return push(KernelArg::u32(v)); }
  KernelLaunch& arg_i32(std::int32_t v) { return push(KernelArg::i32(v)); }
  KernelLaunch& arg_f32(float v) { return push(KernelArg::f32(v)); }
  KernelLaunch& arg_u64(std::uint64_t v) { return push(KernelArg::u64(v)); }

  /// Launch on `stream`. Errors from the backend gain the kernel's name as
  /// context; more than kMaxArgs arguments is an `internal` error.
  void launch(Stream stream = 0);

 private:
  KernelLaunch& push(KernelArg a);

  GpuBackend& gpu_;
  KernelHandle kernel_;
  Dim3 grid_{}, block_{};
  std::uint32_t shared_ = 0;
  bool early_start_ = false;
  Dim3 cluster_{1, 1, 1};
  std::array<KernelArg, kMaxArgs> args_{};
  std::size_t count_ = 0;
  bool overflow_ = false;
};

}  // namespace metrale
