// The CPU device emulator (SPEC §2): checked memory, a registry of kernel
// ports, per-block execution over the launched grid, fault injection and a
// launch log.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/emu/port.hpp"

namespace metrale::emu {

/// The backend operations that fault injection counts.
enum class Op : std::uint8_t { alloc, free, copy_h2d, copy_d2h, copy_d2d, kernel, launch, synchronize };
std::string_view to_string(Op op);

/// Make the `nth` call (1-based) fail: of `op`, or of any operation when `op`
/// is empty. Calls are counted from the `inject_fault` that installs the plan
/// ("fail the nth call from now"), so a test need not know how many calls came
/// before. `persistent`: that call and every later one that matches fail.
/// Several plans may be active; each counts on its own.
/// An injected failure changes nothing (a failed alloc allocates nothing, a
/// failed copy copies nothing) except a failed `free`, which still releases
/// the allocation and then reports the error, as a driver reporting an earlier
/// asynchronous error does.
struct FaultPlan {
  std::optional<Op> op;
  std::uint64_t nth = 1;
  bool persistent = false;
};

/// A live (or, in a leak report, leaked) allocation.
struct AllocationInfo {
  std::uint64_t serial = 0;
  DevicePtr base{};
  std::size_t bytes = 0;
  std::string site;
};

/// One launch as the kernel saw it: arguments named by the declared list.
struct LaunchRecord {
  struct Arg {
    std::string name;
    KernelArg value;
  };
  std::string module, entry;
  Dim3 grid, block;
  std::vector<Arg> args;
  std::uint32_t shared_bytes = 0;  // dynamic shared memory a block
  Dim3 cluster{1, 1, 1};           // blocks a cluster
  /// The argument named `name`; throws `not_found` when there is none.
  const KernelArg& arg(std::string_view name) const;
};

struct EmulatorOptions {
  /// Worker threads that run blocks, at most 1024; 0 = one per available core
  /// (`METRALE_EMU_THREADS` overrides the default; a value that is not a positive integer, or one
  /// above 1024 here or there, is an `invalid_argument` error of the constructor).
  unsigned threads = 0;
  /// Report reads of bytes never written (by a copy or a kernel store).
  bool check_uninitialized = true;
  /// Report two blocks of one launch writing the same byte.
  bool detect_races = true;
  /// Called by the destructor with the allocations still live; the default
  /// logs each one as an error through spdlog.
  std::function<void(const std::vector<AllocationInfo>&)> on_leak;
  /// When set, every launch is written there as a kernel case file (SPEC §5).
  std::filesystem::path record_dir;
  /// The most bytes of case files a recording writes (a case's inputs and expectations: it grows
  /// with every launch). A launch whose case could pass it fails with `capacity_exceeded`
  /// before it runs; the cases already written stay. 0 = 4 GB (`METRALE_RECORD_LIMIT`, in bytes,
  /// overrides the default, or is an `invalid_argument` error of the constructor when it is not
  /// a positive 64-bit integer, recording or not).
  std::uint64_t record_limit_bytes = 0;
  /// The most dynamic shared memory a block may have, in bytes; 0 = the played device's: sm_90's
  /// 227 KiB (232448), sm_121's 99 KiB (101376) (`METRALE_EMU_SHARED_BYTES` overrides the default,
  /// or is an `invalid_argument` error of the constructor when it is not an integer from 49152 —
  /// 48 KiB, every device's least, the static shared memory the emulator does not count — to
  /// the played device's own: a smaller device, never a larger one). A value set here is taken as
  /// it is (the tests' small devices).
  std::uint32_t max_shared_bytes_per_block = 0;
  /// The compute capability the backend plays, major·10 + minor (GpuBackend::compute_capability):
  /// one the kernels are built for, 90 (H100, H200) or 121 (GB10); 0 = 90
  /// (`METRALE_EMU_COMPUTE_CAPABILITY` overrides the default; another value, here or there, is an
  /// `invalid_argument` error of the constructor). At 121 the emulator refuses the sm_90a-only
  /// module's entries (`kernel`: `unsupported`), as the CUDA backend cannot load them there, and
  /// gives a block 99 KiB by default, so the launchers and plans take what a GB10 runs.
  std::uint32_t compute_capability = 0;
  /// The checked accesses to device memory (Global's loads, stores, reads, writes; one of more
  /// than 64 bytes counts once for each 64 bytes or part, as its checks cost) one block may
  /// make before the launch stops with `capacity_exceeded`, so that a small case cannot ask for
  /// hours of work (a block table whose entries repeat one page, with a seq_len of 2^31 − 1);
  /// 0 = 2^28, some hundreds of times what the largest benchmark shape's block makes
  /// (`METRALE_EMU_BLOCK_ACCESSES` overrides the default, or is an `invalid_argument` error of the
  /// constructor when it is not a positive 32-bit integer).
  std::uint32_t max_block_accesses = 0;
  /// The checked accesses all the blocks of one launch may make together before it stops with
  /// `capacity_exceeded` (counted in batches of 4096 a block and at its end), so that many blocks each just under
  /// max_block_accesses cannot ask for hours either; 0 = 2^30, about a minute and a half of one core's
  /// work (`METRALE_EMU_LAUNCH_ACCESSES` overrides the default, or is an `invalid_argument` error
  /// of the constructor when it is not a positive 64-bit integer).
  std::uint64_t max_launch_accesses = 0;
  /// The streaming multiprocessors the backend reports, for the plans that size grids to the
  /// device; 0 = the played device's: an H200's 132, a GB10's 48 (compute_capability 121). A few
  /// let a small problem take the plans' many-tiles-per-slot paths.
  std::uint32_t multiprocessor_count = 0;
};

class EmulatorBackend final : public GpuBackend {
 public:
  explicit EmulatorBackend(EmulatorOptions options = {});
  ~EmulatorBackend() override;

  /// Freeing the null pointer does nothing, as `cudaFree(0)`.
  void free(DevicePtr ptr) override;
  void copy_h2d(std::span<const std::byte> src, DevicePtr dst) override;
  void copy_d2h(DevicePtr src, std::span<std::byte> dst) override;
  void copy_d2d(DevicePtr src, DevicePtr dst, std::size_t bytes) override;
  KernelHandle kernel(std::string_view module, std::string_view entry) override;

  void synchronize(Stream stream) override;
  std::string name() const override { return "emu"; }
  std::uint32_t max_shared_bytes_per_block() const override;
  std::uint32_t multiprocessor_count() const override;
  std::uint32_t compute_capability() const override;
  std::string kernel_name(KernelHandle kernel) const override;

  // ---- inspection ---------------------------------------------------------
  std::vector<AllocationInfo> live_allocations() const;
  std::size_t live_bytes() const;
  const Registry& registry() const;
  /// Tests may register extra ports (a kernel handle is valid for the
  /// backend's lifetime).
  Registry& registry();
  const EmulatorOptions& options() const;
  unsigned threads() const;
  /// Whether the recording (EmulatorOptions::record_dir) refused a launch for its limit: it
  /// refuses every later launch too, so a run should stop there. False when not recording.
  bool recording_stopped() const;

  // ---- fault injection ----------------------------------------------------
  /// Errors: `invalid_argument` when `plan.nth` is 0.
  void inject_fault(FaultPlan plan);
  void clear_faults();
  /// Calls made so far of `op`, or of every operation when empty (failed calls
  /// included).
  std::uint64_t calls(std::optional<Op> op = std::nullopt) const;

  // ---- launch log -----------------------------------------------------------
  /// Keep a `LaunchRecord` of every launch from now on.
  void record_launches(bool on);
  /// Check and record launches but run no block (for argument-order checks with
  /// sentinel pointers).
  void set_dry_run(bool on);
  const std::vector<LaunchRecord>& launch_log() const;
  void clear_launch_log();

 protected:
  DevicePtr do_alloc(std::size_t bytes, std::source_location where) override;
  /// Also rejects more dynamic shared memory than options.max_shared_bytes_per_block.
  /// `early_start` changes nothing: each launch runs to its end before the next starts.
  void do_launch(KernelHandle kernel, Dim3 grid, Dim3 block, std::span<const KernelArg> args, Stream stream,
                 std::uint32_t shared_bytes, bool early_start, Dim3 cluster) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Register every port of this build (one `register_<module>` per module).
void register_all_ports(Registry& registry);
void register_mla_absorbed(Registry& registry);
void register_mla_fast(Registry& registry);
void register_mla_decode(Registry& registry);
void register_k3_fast(Registry& registry);

}  // namespace metrale::emu
