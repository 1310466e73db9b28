// The CUDA backend (SPEC §1): the driver API over the fatbins of kernels/ that
// are embedded in this library, one module per `.cu`, under the same module and
// entry names the emulator registers. The driver (libcuda.so.1) is loaded at
// run time, so binaries that contain this backend start on machines without a
// GPU; `available()` says whether a device answers.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "metrale/backend.hpp"

namespace metrale {

class CudaBackend final : public GpuBackend {
 public:
  /// Load the driver, read METRALE_CUDA_CLUSTER_POLICY (cluster_policy), take device `ordinal`'s
  /// primary context. Errors, in that order: `unsupported` when the driver cannot be loaded or
  /// no device answers, naming why; `invalid_argument` naming a METRALE_CUDA_CLUSTER_POLICY
  /// other than balance, spread or default; `unsupported` for an `ordinal` the driver does not
  /// have (CUDA_ERROR_INVALID_DEVICE); other driver errors per `check`.
  explicit CudaBackend(int ordinal = 0);
  ~CudaBackend() override;

  /// Whether the driver loads and at least one device answers.
  static bool available();
  /// Why `available()` is false ("" when it is true).
  static std::string unavailable_reason();

  void free(DevicePtr ptr) override;
  void copy_h2d(std::span<const std::byte> src, DevicePtr dst) override;
  void copy_d2h(DevicePtr src, std::span<std::byte> dst) override;
  void copy_d2d(DevicePtr src, DevicePtr dst, std::size_t bytes) override;
  /// Errors: `not_found` naming the module and entry.
  KernelHandle kernel(std::string_view module, std::string_view entry) override;

  void synchronize(Stream stream) override;
  std::string name() const override { return "cuda"; }
  std::string kernel_name(KernelHandle kernel) const override;
  std::uint32_t multiprocessor_count() const override;
  std::uint32_t max_shared_bytes_per_block() const override;

  /// Fill `bytes` bytes at `dst` with `value` (for benchmarks: cache flushes, poisons).
  void memset(DevicePtr dst, std::uint8_t value, std::size_t bytes);
  /// Device name, compute capability, driver version and the toolkit this was built with.
  std::string device_name() const;
  std::uint32_t compute_capability() const override;  // major·10 + minor
  /// cuOccupancyMaxActiveClusters under this backend's cluster_policy (the kernel's dynamic
  /// shared memory limit raised to `shared_bytes` first, as a launch would).
  std::uint32_t max_active_clusters(KernelHandle kernel, Dim3 block, std::uint32_t shared_bytes,
                                    std::uint32_t cluster_size) const override;
  /// How clustered launches, and the occupancy query above, ask the driver to place a cluster's
  /// blocks: "balance" (CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING, unless
  /// METRALE_CUDA_CLUSTER_POLICY says otherwise), "spread" (…_SPREAD) or "default" (the driver's
  /// own). docs/performance.md, thirty-seventh session.
  const std::string& cluster_policy() const;
  /// The policy a backend made now would take, by METRALE_CUDA_CLUSTER_POLICY, with no device.
  /// Errors: `invalid_argument` as the constructor's.
  static std::string cluster_policy_setting();
  int driver_version() const;      // e.g. 13000
  static int toolkit_version();    // CUDA_VERSION at build time
  /// Milliseconds between two events recorded around `work` on `stream` (cuEventElapsedTime).
  /// `held`: the stream is first held by a wait (cuStreamWaitValue32) on a word of mapped host
  /// memory, and let go once `work` has queued its launches and the stop event, so the start
  /// event fires with all of them queued: the host's time to launch is not in the time, and the
  /// stream waits without traffic in memory (as nvbench's blocking kernel). `work` must not wait
  /// on the stream (a synchronize, a blocking copy) nor fill its queue; a watchdog lets the
  /// stream go 2 s on. Not for two threads at once on one backend. Errors: `launch_failed` when
  /// the watchdog had to let it go; the driver's errors per `check` (a driver without stream
  /// memory operations: its cuStreamWaitValue32 error).
  double time_ms(const std::function<void()>& work, Stream stream = 0, bool held = false);

 protected:
  DevicePtr do_alloc(std::size_t bytes, std::source_location where) override;
  /// Checks the argument count and each argument's size against the kernel
  /// image (cuFuncGetParamInfo) first, and raises the kernel's dynamic shared
  /// memory limit when a launch asks for more than 48 KiB. Errors:
  /// `launch_failed` naming the argument; the driver's launch errors. `early_start` launches
  /// with programmatic stream serialization (cuLaunchKernelEx) on sm_90 and later, and as
  /// usual before or when the build targets anything below sm_90. A clustered launch asks for
  /// this backend's cluster_policy.
  void do_launch(KernelHandle kernel, Dim3 grid, Dim3 block, std::span<const KernelArg> args, Stream stream,
                 std::uint32_t shared_bytes, bool early_start, Dim3 cluster) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace metrale
