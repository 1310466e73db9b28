// The abstract device every launcher targets (SPEC §1). Two implementations:
// `emu::EmulatorBackend` (always built) and `CudaBackend` (built with the CUDA
// toolkit). All calls are synchronous from the host's point of view except
// `launch`, which may be asynchronous on its stream until `synchronize`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "metrale/device.hpp"

namespace metrale {

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  GpuBackend() = default;
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  /// Allocate `bytes` (> 0) of device memory. `where` is recorded by backends
  /// that report allocations (the emulator names it in faults and leaks).
  /// Errors: `invalid_argument` for 0 bytes, `out_of_memory`.
  DevicePtr alloc(std::size_t bytes, std::source_location where = std::source_location::current()) {
    return do_alloc(bytes, where);
  }
  /// Free an allocation by its start address. Errors: `device_fault` for a
  /// double free, an interior address or an address never allocated.
  virtual void free(DevicePtr ptr) = 0;
  /// Copy `src.size()` bytes from the host to `dst`. Errors: `device_fault`.
  virtual void copy_h2d(std::span<const std::byte> src, DevicePtr dst) = 0;
  /// Copy `dst.size()` bytes from `src` to the host. Errors: `device_fault`.
  virtual void copy_d2h(DevicePtr src, std::span<std::byte> dst) = 0;
  /// Copy `bytes` bytes between device addresses. Errors: `device_fault`.
  virtual void copy_d2d(DevicePtr src, DevicePtr dst, std::size_t bytes) = 0;
  /// Look a kernel up by module and entry name (the `.cu` file stem and the
  /// `__global__` function). Errors: `not_found` naming both.
  virtual KernelHandle kernel(std::string_view module, std::string_view entry) = 0;
  /// Launch `kernel` over `grid` x `block` with `args` in declaration order and
  /// `shared_bytes` of dynamic shared memory per block. Errors: `launch_failed`
  /// when the arguments or block shape disagree with the kernel's declared
  /// parameters or the shared memory exceeds the device's limit;
  /// `device_fault` for a faulting kernel.
  /// `early_start`: programmatic dependent launch (CUDA, sm_90 and later): the kernel may
  /// start before the kernel ahead of it on `stream` has finished, and must wait for it
  /// (`griddepcontrol.wait`) before it touches anything that kernel writes; what it reads
  /// before the wait must not be written by that kernel. Backends without it (the
  /// emulator, which runs launches one after the other) launch as usual: the same result.
  /// `cluster`: thread-block clusters of that shape (sm_90 and later; at most 8 blocks, each
  /// dimension dividing the grid's), whose blocks run together and may read each other's shared
  /// memory; the emulator passes the shape to the port (`Block::clusterDim`), which plays the
  /// cluster's exchange itself. Errors: `launch_failed` for a shape that does not divide the
  /// grid, more than 8 blocks, or a device below sm_90.
  void launch(KernelHandle kernel, Dim3 grid, Dim3 block, std::span<const KernelArg> args, Stream stream,
              std::uint32_t shared_bytes = 0, bool early_start = false, Dim3 cluster = {1, 1, 1}) {
    check_cluster(grid, cluster);
    if (observer_) observer_(kernel, grid, block);
    do_launch(kernel, grid, block, args, stream, shared_bytes, early_start, cluster);
  }
  /// While it lives, `see` is called with each launch's kernel, grid and block before the
  /// backend runs it (run_kernel_case compares them with a recorded launch); an observer made
  /// while another lives takes its place until it ends.
  class LaunchObserver {
   public:
    using Fn = std::function<void(KernelHandle, Dim3 grid, Dim3 block)>;
    LaunchObserver(GpuBackend& gpu, Fn see) : gpu_(gpu), before_(std::exchange(gpu.observer_, std::move(see))) {}
    ~LaunchObserver() { gpu_.observer_ = std::move(before_); }
    LaunchObserver(const LaunchObserver&) = delete;
    LaunchObserver& operator=(const LaunchObserver&) = delete;

   private:
    GpuBackend& gpu_;
    Fn before_;
  };
  /// Wait for the work queued on `stream`. Errors: `device_fault`.
  virtual void synchronize(Stream stream) = 0;
  /// "emu" or "cuda".
  virtual std::string name() const = 0;
  /// "module.entry" of a handle this backend returned, for messages.
  virtual std::string kernel_name(KernelHandle kernel) const = 0;
  /// Streaming multiprocessors, for launchers that size their grid to the
  /// device; the emulator answers as the device it plays (an H200's 132, a GB10's 48).
  virtual std::uint32_t multiprocessor_count() const { return 132; }
  /// The most dynamic shared memory a block may opt in to, in bytes; the emulator answers as
  /// sm_90 (227 KiB) unless told otherwise (sm_121: 99 KiB).
  virtual std::uint32_t max_shared_bytes_per_block() const { return 227 * 1024; }
  /// How many clusters of `cluster_size` blocks (in x) of `kernel`, each of `block` threads and
  /// `shared_bytes` of dynamic shared memory, the device runs at once, for plans that size their
  /// clusters: the driver's occupancy on CUDA (which knows how clusters pack into GPCs); by
  /// default (the emulator) as many as fill every SM by threads (2048) and shared memory, divided
  /// by the cluster size, 0 below sm_90 or above 8 blocks.
  virtual std::uint32_t max_active_clusters(KernelHandle kernel, Dim3 block, std::uint32_t shared_bytes,
                                            std::uint32_t cluster_size) const;
  /// The device's compute capability, major·10 + minor (90: H100/H200, 121: GB10), for launchers
  /// that pick architecture-specific kernels; the emulator answers as sm_90 unless
  /// EmulatorOptions::compute_capability says otherwise.
  virtual std::uint32_t compute_capability() const { return 90; }

 protected:
  virtual DevicePtr do_alloc(std::size_t bytes, std::source_location where) = 0;
  virtual void do_launch(KernelHandle kernel, Dim3 grid, Dim3 block, std::span<const KernelArg> args, Stream stream,
                         std::uint32_t shared_bytes, bool early_start, Dim3 cluster) = 0;

 private:
  /// Errors: `launch_failed` naming the cluster shape that `launch` refuses.
  void check_cluster(Dim3 grid, Dim3 cluster) const;

  LaunchObserver::Fn observer_;
};

}  // namespace metrale
