// The CPU device emulator (SPEC §2, emulator.hpp): checked memory at synthetic
// device addresses, kernel lookup and launch validation, per-block execution on
// a pool of worker threads, the cross-block race check, fault injection and the
// launch log.
#include "metrale/emu/emulator.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "metrale/error.hpp"
#include "metrale/files.hpp"
#include "metrale/mla_fast.hpp"
#include "recorder.hpp"

namespace metrale::emu {

std::string_view to_string(Op op) {
  static constexpr std::string_view kNames[] = {"alloc",    "free",   "copy_h2d", "copy_d2h",
                                                "copy_d2d", "kernel", "launch",   "synchronize"};
  return kNames[static_cast<std::size_t>(op)];
}

const KernelArg& LaunchRecord::arg(std::string_view name) const {
  for (const auto& a : args) {
    if (a.name == name) return a.value;
  }
  fail(Errc::not_found, "launch of {}.{} has no argument {}", module, entry, name);
}

void register_all_ports(Registry& registry) {
  register_mla_absorbed(registry);
  register_mla_fast(registry);
  register_mla_decode(registry);
  register_k3_fast(registry);
}

namespace {

using detail::Access;
using detail::Allocation;

// Device addresses start high so that a small integer passed as a pointer is
// never mistaken for one, and every allocation is followed by at least kGap
// unmapped bytes so that an overrun lands in no allocation. Bases are kGap
// aligned, which is more than cudaMalloc's 256 bytes.
constexpr std::uint64_t kFirstAddress = 0x7000'0000'0000;
constexpr std::uint64_t kGap = 64 * 1024;
// Far beyond any real device, far below what would wrap the address space.
constexpr std::size_t kMaxAllocation = std::size_t{1} << 44;

constexpr std::size_t kOps = 8;
constexpr std::size_t index_of(Op op) { return static_cast<std::size_t>(op); }

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

std::string dims(Dim3 d) { return fmt::format("({},{},{})", d.x, d.y, d.z); }

std::string site_of(const std::source_location& where) {
  return fmt::format("{}:{} ({})", where.file_name(), where.line(), where.function_name());
}

// Private, anonymous, lazily committed pages: a pool of several GiB costs only
// the pages touched, and they come zeroed, so the shadow starts "never written".
std::byte* map_pages(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

// ---- memory -------------------------------------------------------------------

/// Every allocation the backend ever made. Records of freed allocations stay
/// (without their pages), so a later access is reported as a use after free;
/// addresses are never reused.
class Memory final : public detail::AddressSpace {
 public:
  Memory() = default;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() override {
    for (auto& [base, a] : allocs_) unmap(a);
  }

  const Allocation* resolve(DevicePtr addr) const override {
    auto it = allocs_.upper_bound(addr.addr);
    if (it == allocs_.begin()) return nullptr;
    --it;
    return addr.addr - it->first < it->second.bytes ? &it->second : nullptr;
  }

  /// resolve() for the backend's own use, which may change the allocation.
  Allocation* find(DevicePtr addr) { return const_cast<Allocation*>(resolve(addr)); }

  const Allocation& allocate(std::size_t bytes, std::string site) {
    if (bytes > kMaxAllocation)
      fail(Errc::out_of_memory, "cannot allocate {} bytes: more than {}", bytes, kMaxAllocation);
    std::byte* data = map_pages(bytes);
    auto* written = reinterpret_cast<std::uint8_t*>(data != nullptr ? map_pages(bytes) : nullptr);
    if (written == nullptr) {
      const int err = errno;
      if (data != nullptr) munmap(data, bytes);
      fail(Errc::out_of_memory, "cannot allocate {} bytes: {}", bytes, std::strerror(err));
    }
    const std::uint64_t base = next_address_;
    next_address_ = align_up(base + bytes + kGap, kGap);
    Allocation a{next_serial_++, DevicePtr{base}, bytes, std::move(site), data, written, true};
    return allocs_.emplace(base, std::move(a)).first->second;
  }

  void free(DevicePtr ptr) {
    if (!ptr) return;  // as cudaFree(0)
    Allocation* a = find(ptr);
    if (a == nullptr) fail(Errc::device_fault, "free of {:#x}, which was never allocated", ptr.addr);
    if (a->base != ptr) {
      fail(Errc::device_fault, "free of {:#x}, offset {} inside {}, not its start", ptr.addr, ptr.addr - a->base.addr,
           detail::describe(*a));
    }
    if (!a->live) fail(Errc::device_fault, "double free of {:#x}, {}", ptr.addr, detail::describe(*a));
    unmap(*a);
  }

  /// The live allocation holding all of [addr, addr + len) for one side of a
  /// copy, checked like a port's access; `op` names the copy in the fault.
  Allocation& checked(std::string_view op, DevicePtr addr, std::size_t len, Access access, bool check_written) {
    const char* verb = access == Access::read ? "read" : "write";
    Allocation* a = find(addr);
    if (a == nullptr)
      fail(Errc::device_fault, "{}: {} of {} bytes at {:#x}, which is in no allocation", op, verb, len, addr.addr);
    const std::uint64_t off = addr.addr - a->base.addr;
    auto fault = [&](std::string_view what, std::uint64_t at, std::uint64_t n) {
      fail(Errc::device_fault, "{}: {} of {} bytes at {:#x}, offset {} of {}", op, what, n, a->base.addr + at, at,
           detail::describe(*a));
    };
    if (!a->live) fault(fmt::format("{} after free", verb), off, len);
    if (len > a->bytes - off) fault(fmt::format("out-of-bounds {}", verb), off, len);
    if (access == Access::read && check_written) {
      const std::uint8_t* w = a->written + off;
      const auto* hole = std::find(w, w + len, std::uint8_t{0});
      if (hole != w + len) fault("read of bytes never written", off + (hole - w), len - (hole - w));
    }
    return *a;
  }

  std::vector<AllocationInfo> live() const {
    std::vector<AllocationInfo> out;
    for (const auto& [base, a] : allocs_) {
      if (a.live) out.push_back({a.serial, a.base, a.bytes, a.site});
    }
    return out;  // in address order, which is allocation order
  }

 private:
  static void unmap(Allocation& a) {
    if (!a.live) return;
    munmap(a.data, a.bytes);
    munmap(a.written, a.bytes);
    a.data = nullptr;
    a.written = nullptr;
    a.live = false;
  }

  std::map<std::uint64_t, Allocation> allocs_;
  std::uint64_t next_address_ = kFirstAddress;
  std::uint64_t next_serial_ = 1;
};

// ---- the worker pool ----------------------------------------------------------

/// Persistent threads that run the blocks of one launch at a time. The
/// launching thread works too, so a pool of n threads has n - 1 workers.
class WorkerPool {
 public:
  /// Errors: `out_of_memory` when the system refuses a thread (the ones started are joined).
  explicit WorkerPool(unsigned threads) {
    try {
      for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error& e) {
      stop_and_join();
      fail(Errc::out_of_memory, "emu: cannot start worker thread {} of {} ({}); set METRALE_EMU_THREADS lower",
           workers_.size() + 1, threads - 1, e.what());
    }
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() { stop_and_join(); }

  /// Run `body(i)` for every i < count and rethrow the exception of the lowest
  /// failing i, so the reported fault does not depend on scheduling.
  void run(std::uint64_t count, const std::function<void(std::uint64_t)>& body) {
    Job job(body, count);
    if (count > 1 && !workers_.empty()) {
      {
        std::lock_guard lock(mutex_);
        job_ = &job;
        ++generation_;
        busy_ = static_cast<unsigned>(workers_.size());
      }
      wake_.notify_all();
      work(job);
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return busy_ == 0; });
      job_ = nullptr;
    } else {
      work(job);
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  void stop_and_join() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  struct Job {
    Job(const std::function<void(std::uint64_t)>& f, std::uint64_t n) : body(f), count(n) {}
    const std::function<void(std::uint64_t)>& body;
    std::uint64_t count;
    std::atomic<std::uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::uint64_t error_index = std::numeric_limits<std::uint64_t>::max();
    std::exception_ptr error;
  };

  // Indices are handed out in order, so when block k fails every block below k
  // has started and runs to the end: stopping here still finds the lowest.
  static void work(Job& job) {
    while (!job.failed.load(std::memory_order_relaxed)) {
      const std::uint64_t i = job.next.fetch_add(1);
      if (i >= job.count) return;
      try {
        job.body(i);
      } catch (...) {
        std::lock_guard lock(job.error_mutex);
        if (i < job.error_index) {
          job.error_index = i;
          job.error = std::current_exception();
        }
        job.failed = true;
      }
    }
  }

  void worker_loop() {
    // Ctrl-C and the like go to the program's own threads, not the pool's: a handler that removes
    // half-written files (remove_staged_files_on_signals) then runs on the thread that writes them.
    hold_staged_file_signals();
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      Job& job = *job_;
      lock.unlock();
      work(job);
      lock.lock();
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  std::uint64_t generation_ = 0;
  unsigned busy_ = 0;  // workers still on the current job
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// The environment variable `name` as a positive integer of type T (32 or 64 bits), or `fallback`
// when it is unset. Errors: `invalid_argument` naming the variable and its value (`unset` says
// what the default is; `form`, when given, follows a value that is not a number), also when the
// value is above `max`.
template <class T = std::uint32_t>
T positive_env(const char* name, std::type_identity_t<T> fallback, std::string_view unset,
               std::type_identity_t<T> max = std::numeric_limits<T>::max(), std::string_view form = "") {
  const char* env = std::getenv(name);
  if (env == nullptr) return fallback;
  T n = 0;
  const auto [end, ec] = std::from_chars(env, env + std::strlen(env), n);
  const bool past_type = ec == std::errc::result_out_of_range && *end == '\0';  // digits, past T
  if (!past_type && (ec != std::errc{} || *end != '\0' || n == 0))
    fail(Errc::invalid_argument, "{}='{}' is not a positive {}-bit integer (unset: {}){}", name, env, 8 * sizeof(T),
         unset, form);
  if (past_type || n > max)
    fail(Errc::invalid_argument, "{}='{}' is above the largest allowed, {} (unset: {})", name, env, max, unset);
  return n;
}

// The emulator's most worker threads: more only cost thread starts (a block's threads run on one).
constexpr unsigned kMaxThreads = 1024;

unsigned default_threads() {
  return positive_env("METRALE_EMU_THREADS", std::clamp(std::thread::hardware_concurrency(), 1u, kMaxThreads),
                      "one thread per core", kMaxThreads);
}

// EmulatorOptions::threads, 0 meaning the default. Errors: `invalid_argument` above kMaxThreads.
unsigned checked_threads(unsigned threads) {
  if (threads == 0) return default_threads();
  if (threads > kMaxThreads)
    fail(Errc::invalid_argument, "emu: EmulatorOptions::threads = {} is above the largest allowed, {}", threads,
         kMaxThreads);
  return threads;
}

// The compute capability the emulator plays (EmulatorOptions::compute_capability), major·10 +
// minor: one the kernels are built for (cmake/cuda.cmake), sm_90 unless
// METRALE_EMU_COMPUTE_CAPABILITY says otherwise. Errors: `invalid_argument` naming another value.
std::uint32_t checked_compute_capability(std::uint32_t cc) {
  constexpr const char* kNotBuilt =
      "is not a compute capability the kernels are built for: 90 (H100, H200) or 121 (GB10)";
  const auto built_for = [](std::uint32_t c) { return c == 90 || c == 121; };
  if (cc != 0) {
    if (!built_for(cc)) fail(Errc::invalid_argument, "emu: EmulatorOptions::compute_capability = {} {}", cc, kNotBuilt);
    return cc;
  }
  cc = positive_env("METRALE_EMU_COMPUTE_CAPABILITY", 90, "90, an H200");
  if (!built_for(cc))
    fail(Errc::invalid_argument, "METRALE_EMU_COMPUTE_CAPABILITY='{}' {}",
         std::getenv("METRALE_EMU_COMPUTE_CAPABILITY"), kNotBuilt);
  return cc;
}

// The largest dynamic shared memory per block (cudaFuncAttributeMaxDynamicSharedMemorySize) of
// the device played: sm_90's 227 KiB, sm_121's 99 KiB, unless METRALE_EMU_SHARED_BYTES says
// otherwise, from 48 KiB (every device's, the most static shared memory a kernel may declare: the
// emulator checks only the dynamic) to the device's own (a smaller device, never a larger one).
std::uint32_t default_shared_bytes(std::uint32_t compute_capability) {
  constexpr std::uint32_t kSm90 = 227 * 1024, kSm121 = 99 * 1024, kLeast = 48 * 1024;
  const std::uint32_t device = compute_capability == 121 ? kSm121 : kSm90;
  const std::uint32_t bytes =
      positive_env("METRALE_EMU_SHARED_BYTES", device,
                   compute_capability == 121 ? "sm_121's 101376 bytes" : "sm_90's 232448 bytes", device);
  if (bytes < kLeast)
    fail(Errc::invalid_argument, "METRALE_EMU_SHARED_BYTES='{}' is below the least a device allows, {} (48 KiB)",
         std::getenv("METRALE_EMU_SHARED_BYTES"), kLeast);
  return bytes;
}

// EmulatorOptions::max_block_accesses' default, unless METRALE_EMU_BLOCK_ACCESSES says otherwise.
std::uint32_t default_block_accesses() { return positive_env("METRALE_EMU_BLOCK_ACCESSES", 1u << 28, "268435456"); }
// EmulatorOptions::max_launch_accesses' default, unless METRALE_EMU_LAUNCH_ACCESSES says otherwise.
std::uint64_t default_launch_accesses() {
  return positive_env<std::uint64_t>("METRALE_EMU_LAUNCH_ACCESSES", std::uint64_t{1} << 30, "1073741824");
}

// EmulatorOptions::record_limit_bytes' default: 4 GB of case files.
constexpr std::uint64_t kDefaultRecordLimit = 4'000'000'000;

// ---- launch checks --------------------------------------------------------------

// The device's limits, so that a launch that would fail on hardware fails here.
void check_shape(Dim3 grid, Dim3 block) {
  if (grid.count() == 0) fail(Errc::launch_failed, "grid {} has a zero dimension", dims(grid));
  if (block.count() == 0) fail(Errc::launch_failed, "block {} has a zero dimension", dims(block));
  if (grid.x > 0x7fff'ffffu || grid.y > 65535 || grid.z > 65535)
    fail(Errc::launch_failed, "grid {} exceeds the device limits (2147483647,65535,65535)", dims(grid));
  if (block.count() > 1024)
    fail(Errc::launch_failed, "block {} has {} threads, more than 1024", dims(block), block.count());
  if (block.z > 64) fail(Errc::launch_failed, "block {} has z = {}, more than 64", dims(block), block.z);
}

void check_args(const Registry::Entry& e, std::span<const KernelArg> args) {
  if (args.size() != e.params.size())
    fail(Errc::launch_failed, "{} arguments but {} declares {}", args.size(), e.entry, e.params.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind != e.params[i].kind) {
      fail(Errc::launch_failed, "argument {} ({}) is {} but the kernel declares {}", i, e.params[i].name,
           to_string(args[i].kind), to_string(e.params[i].kind));
    }
  }
}

Dim3 block_index(std::uint64_t linear, Dim3 grid) {
  return {static_cast<std::uint32_t>(linear % grid.x), static_cast<std::uint32_t>(linear / grid.x % grid.y),
          static_cast<std::uint32_t>(linear / (std::uint64_t{grid.x} * grid.y))};
}

// ---- the race check ---------------------------------------------------------------

struct BlockRange {
  detail::AccessRange range;
  std::uint64_t block;  // linear index in the grid
  bool write;
};

/// Report two different blocks writing the same byte, or one block reading a byte another writes
/// (the reads are those of the allocations the launch writes). After sorting by start, each range
/// is compared with the furthest-reaching write — and, a write, with the furthest-reaching read —
/// of a block other than its own: the furthest two of distinct blocks so far give that.
void check_races(std::vector<BlockRange>& ranges, std::string_view entry, Dim3 grid) {
  std::sort(ranges.begin(), ranges.end(), [](const BlockRange& a, const BlockRange& b) {
    // A total order, so the report does not depend on the order blocks ran in.
    return std::tie(a.range.alloc->serial, a.range.begin, a.block, a.range.end, a.write) <
           std::tie(b.range.alloc->serial, b.range.begin, b.block, b.range.end, b.write);
  });
  struct Reach {  // the two furthest-reaching ranges of distinct blocks
    const BlockRange* top[2] = {nullptr, nullptr};
    void add(const BlockRange& r) {
      if (top[0] == nullptr || r.range.end > top[0]->range.end) {
        if (top[0] != nullptr && top[0]->block != r.block) top[1] = top[0];
        top[0] = &r;
      } else if (r.block != top[0]->block && (top[1] == nullptr || r.range.end > top[1]->range.end)) {
        top[1] = &r;
      }
    }
    // The furthest-reaching range of a block other than `r`'s, when it overlaps r.
    const BlockRange* overlapping(const BlockRange& r) const {
      const BlockRange* o = top[0] != nullptr && top[0]->block != r.block ? top[0] : top[1];
      return o != nullptr && o->range.end > r.range.begin ? o : nullptr;
    }
  };
  Reach reads, writes;
  const detail::Allocation* alloc = nullptr;
  for (const BlockRange& r : ranges) {
    if (r.range.alloc != alloc) alloc = r.range.alloc, reads = writes = Reach{};
    if (const BlockRange* o = r.write ? writes.overlapping(r) : nullptr) {
      const auto [first, second] = std::minmax(r.block, o->block);
      fail(Errc::device_fault, "write race in {}: blocks {} and {} both write bytes [{}, {}) of parameter {} ({})",
           entry, dims(block_index(first, grid)), dims(block_index(second, grid)), r.range.begin,
           std::min(r.range.end, o->range.end), r.range.param, detail::describe(*r.range.alloc));
    }
    if (const BlockRange* o = r.write ? reads.overlapping(r) : writes.overlapping(r)) {
      const BlockRange& w = r.write ? r : *o;
      const BlockRange& rd = r.write ? *o : r;
      fail(Errc::device_fault,
           "read-write race in {}: block {} writes bytes [{}, {}) of parameter {} ({}) that block {} reads through "
           "parameter {} (blocks run in no set order: an output overlaps an input)",
           entry, dims(block_index(w.block, grid)), std::max(w.range.begin, rd.range.begin),
           std::min(w.range.end, rd.range.end), w.range.param, detail::describe(*w.range.alloc),
           dims(block_index(rd.block, grid)), rd.range.param);
    }
    (r.write ? writes : reads).add(r);
  }
}

}  // namespace

// ---- the backend ------------------------------------------------------------------

struct EmulatorBackend::Impl {
  struct ActivePlan {
    FaultPlan plan;
    std::uint64_t seen = 0;  // matching calls since the plan was installed
  };

  explicit Impl(EmulatorOptions opts)
      : options(std::move(opts)), threads(checked_threads(options.threads)), pool(threads) {
    options.compute_capability = checked_compute_capability(options.compute_capability);
    if (options.max_shared_bytes_per_block == 0)
      options.max_shared_bytes_per_block = default_shared_bytes(options.compute_capability);
    if (options.multiprocessor_count == 0)  // a GB10's 6144 cores, 128 an SM; an H200's 132
      options.multiprocessor_count = options.compute_capability == 121 ? 48 : 132;
    if (options.max_block_accesses == 0) options.max_block_accesses = default_block_accesses();
    if (options.max_launch_accesses == 0) options.max_launch_accesses = default_launch_accesses();
    if (options.record_limit_bytes == 0)  // read whether or not it records, so that `info` checks it too
      options.record_limit_bytes =
          positive_env<std::uint64_t>("METRALE_RECORD_LIMIT", kDefaultRecordLimit, "4000000000 bytes, 4 GB",
                                      std::numeric_limits<std::uint64_t>::max(),
                                      "; it takes bytes in digits, where --record-limit takes units (4GB)");
  }

  EmulatorOptions options;
  unsigned threads;
  // Guards everything below. A launch holds it while its blocks run, so the
  // allocation map the ports read cannot change under them.
  mutable std::mutex mutex;
  Memory memory;
  Registry registry;
  WorkerPool pool;
  std::array<std::uint64_t, kOps> calls{};
  std::vector<ActivePlan> plans;
  bool recording = false;
  bool dry_run = false;
  std::unique_ptr<CaseRecorder> recorder;  // when options.record_dir is set
  std::vector<LaunchRecord> log;

  /// Count a call of `op`; true when a fault plan makes this call fail.
  bool count(Op op) {
    ++calls[index_of(op)];
    bool failing = false;
    for (auto& p : plans) {
      if (p.plan.op && *p.plan.op != op) continue;
      ++p.seen;
      if (p.seen == p.plan.nth || (p.plan.persistent && p.seen > p.plan.nth)) failing = true;
    }
    std::erase_if(plans, [](const ActivePlan& p) { return !p.plan.persistent && p.seen >= p.plan.nth; });
    return failing;
  }

  /// Count a call of `op` and throw if it is to fail.
  void enter(Op op) {
    if (count(op)) injected(op);
  }

  [[noreturn]] void injected(Op op) const {
    const Errc code = op == Op::alloc    ? Errc::out_of_memory
                      : op == Op::launch ? Errc::launch_failed
                      : op == Op::kernel ? Errc::not_found
                                         : Errc::device_fault;
    fail(code, "injected fault: {} call {}", to_string(op), calls[index_of(op)]);
  }

  const Registry::Entry& entry(KernelHandle kernel) const {
    const auto& entries = registry.entries();
    if (kernel.id == 0 || kernel.id > entries.size()) fail(Errc::launch_failed, "unknown kernel handle {}", kernel.id);
    return entries[kernel.id - 1];
  }

  void record(const Registry::Entry& e, Dim3 grid, Dim3 block, std::span<const KernelArg> args,
              std::uint32_t shared_bytes, Dim3 cluster) {
    LaunchRecord r{e.module, e.entry, grid, block, {}, shared_bytes, cluster};
    for (std::size_t i = 0; i < args.size(); ++i) r.args.push_back({e.params[i].name, args[i]});
    log.push_back(std::move(r));
  }

  /// Run the port once per block of the grid, then look for races between its blocks.
  void execute(const Registry::Entry& e, Dim3 grid, Dim3 block, Dim3 cluster, std::span<const KernelArg> args) {
    std::mutex ranges_mutex;
    std::vector<BlockRange> ranges;
    std::vector<const detail::Allocation*> written;  // what the writable parameters point into
    for (std::size_t i = 0; i < e.params.size() && i < args.size(); ++i)
      if (e.params[i].kind == ArgKind::ptr && e.params[i].writable)
        if (const auto* a = memory.resolve(args[i].as_ptr()); a != nullptr) written.push_back(a);
    LaunchAccesses launch{{}, options.max_launch_accesses};
    pool.run(grid.count(), [&](std::uint64_t i) {
      Block blk(e.entry, block_index(i, grid), block, grid, memory, options.check_uninitialized, options.detect_races,
                options.max_block_accesses, &launch);
      blk.clusterDim = cluster;
      blk.watch_reads(written);
      blk.count_start();
      e.run(blk, args, e.params);
      blk.report_accesses();  // the accesses since its last batch
      const auto &writes = blk.writes(), &reads = blk.reads();
      if (writes.empty() && reads.empty()) return;
      std::lock_guard lock(ranges_mutex);
      for (const auto& w : writes) ranges.push_back({w, i, true});
      for (const auto& r : reads) ranges.push_back({r, i, false});
    });
    if (options.detect_races) check_races(ranges, e.entry, grid);
  }
};

EmulatorBackend::EmulatorBackend(EmulatorOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  register_all_ports(impl_->registry);
  if (!impl_->options.record_dir.empty())
    impl_->recorder = std::make_unique<CaseRecorder>(impl_->options.record_dir, impl_->options.record_limit_bytes);
}

EmulatorBackend::~EmulatorBackend() {
  const auto leaks = impl_->memory.live();
  if (leaks.empty()) return;
  try {
    if (impl_->options.on_leak) {
      impl_->options.on_leak(leaks);
      return;
    }
    for (const auto& a : leaks) {
      spdlog::error("emu: leaked allocation #{}: {} bytes at {:#x}, allocated at {}", a.serial, a.bytes, a.base.addr,
                    a.site);
    }
  } catch (const std::exception& e) {  // a destructor must not throw
    spdlog::error("emu: leak report failed: {}", e.what());
  }
}

DevicePtr EmulatorBackend::do_alloc(std::size_t bytes, std::source_location where) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::alloc);
  if (bytes == 0) fail(Errc::invalid_argument, "alloc of 0 bytes");
  const auto& a = impl_->memory.allocate(bytes, site_of(where));
  spdlog::trace("emu: alloc #{} of {} bytes at {:#x} ({})", a.serial, bytes, a.base.addr, a.site);
  return a.base;
}

void EmulatorBackend::free(DevicePtr ptr) {
  std::lock_guard lock(impl_->mutex);
  // An injected failure still releases, as a driver reporting an earlier
  // asynchronous error from cuMemFree does.
  const bool failing = impl_->count(Op::free);
  impl_->memory.free(ptr);
  if (failing) impl_->injected(Op::free);
}

void EmulatorBackend::copy_h2d(std::span<const std::byte> src, DevicePtr dst) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::copy_h2d);
  if (src.empty()) return;
  auto& a = impl_->memory.checked("copy_h2d", dst, src.size(), Access::write, false);
  const std::uint64_t off = dst.addr - a.base.addr;
  std::memcpy(a.data + off, src.data(), src.size());
  std::memset(a.written + off, 1, src.size());
}

void EmulatorBackend::copy_d2h(DevicePtr src, std::span<std::byte> dst) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::copy_d2h);
  if (dst.empty()) return;
  auto& a = impl_->memory.checked("copy_d2h", src, dst.size(), Access::read, impl_->options.check_uninitialized);
  std::memcpy(dst.data(), a.data + (src.addr - a.base.addr), dst.size());
}

void EmulatorBackend::copy_d2d(DevicePtr src, DevicePtr dst, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::copy_d2d);
  if (bytes == 0) return;
  auto& from = impl_->memory.checked("copy_d2d", src, bytes, Access::read, impl_->options.check_uninitialized);
  auto& to = impl_->memory.checked("copy_d2d", dst, bytes, Access::write, false);
  const std::uint64_t from_off = src.addr - from.base.addr, to_off = dst.addr - to.base.addr;
  // memmove: source and destination may overlap inside one allocation. The
  // shadow travels with the data (all ones while the source check is on).
  std::memmove(to.data + to_off, from.data + from_off, bytes);
  std::memmove(to.written + to_off, from.written + from_off, bytes);
}

KernelHandle EmulatorBackend::kernel(std::string_view module, std::string_view entry) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::kernel);
  if (!module_runs_on(*this, module))  // as the CUDA backend finds no image for the device
    fail(Errc::unsupported,
         "kernel {}.{}: module {} is not built for compute capability {} (the one the emulator plays: "
         "EmulatorOptions::compute_capability, METRALE_EMU_COMPUTE_CAPABILITY)",
         module, entry, module, compute_capability());
  const auto& entries = impl_->registry.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].module == module && entries[i].entry == entry) return KernelHandle{i + 1};
  }
  const bool module_known = std::ranges::any_of(entries, [&](const auto& e) { return e.module == module; });
  if (!module_known) fail(Errc::not_found, "no kernel module {} (looking up entry {})", module, entry);
  fail(Errc::not_found, "kernel module {} has no entry {}", module, entry);
}

std::uint32_t EmulatorBackend::max_shared_bytes_per_block() const { return impl_->options.max_shared_bytes_per_block; }
std::uint32_t EmulatorBackend::compute_capability() const { return impl_->options.compute_capability; }
std::uint32_t EmulatorBackend::multiprocessor_count() const { return impl_->options.multiprocessor_count; }

void EmulatorBackend::do_launch(KernelHandle kernel, Dim3 grid, Dim3 block, std::span<const KernelArg> args,
                                Stream /*stream: blocks run synchronously*/, std::uint32_t shared_bytes,
                                bool /*early_start: as soon as the launch before has ended*/, Dim3 cluster) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::launch);
  const auto& e = impl_->entry(kernel);
  check_shape(grid, block);
  if (shared_bytes > max_shared_bytes_per_block())
    fail(Errc::launch_failed, "{} asks for {} bytes of shared memory, more than a block may have ({})", e.entry,
         shared_bytes, max_shared_bytes_per_block());
  check_args(e, args);
  // The rule runs only on arguments known to be of the declared kinds.
  if (e.block_rule) {
    if (auto why = e.block_rule(block, args)) fail(Errc::launch_failed, "{}", *why);
  }
  if (e.cluster_rule) {
    if (auto why = e.cluster_rule(grid, cluster)) fail(Errc::launch_failed, "{}", *why);
  }
  if (impl_->recording || impl_->dry_run) impl_->record(e, grid, block, args, shared_bytes, cluster);
  if (impl_->dry_run) return;
  const auto t0 = std::chrono::steady_clock::now();
  if (!impl_->recorder) {
    impl_->execute(e, grid, block, cluster, args);
  } else {
    KernelCase recorded = impl_->recorder->before(e, grid, block, args, impl_->memory);
    impl_->execute(e, grid, block, cluster, args);
    impl_->recorder->after(std::move(recorded), args, e, impl_->memory);
  }
  spdlog::debug("emu: {} grid {} block {} ran in {:.3f} ms", e.full_name(), dims(grid), dims(block),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void EmulatorBackend::synchronize(Stream /*stream*/) {
  std::lock_guard lock(impl_->mutex);
  impl_->enter(Op::synchronize);
}

std::string EmulatorBackend::kernel_name(KernelHandle kernel) const {
  std::lock_guard lock(impl_->mutex);
  const auto& entries = impl_->registry.entries();
  if (kernel.id == 0 || kernel.id > entries.size()) return fmt::format("kernel handle {}", kernel.id);
  return entries[kernel.id - 1].full_name();
}

std::vector<AllocationInfo> EmulatorBackend::live_allocations() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->memory.live();
}

std::size_t EmulatorBackend::live_bytes() const {
  std::size_t total = 0;
  for (const auto& a : live_allocations()) total += a.bytes;
  return total;
}

const Registry& EmulatorBackend::registry() const { return impl_->registry; }
Registry& EmulatorBackend::registry() { return impl_->registry; }
const EmulatorOptions& EmulatorBackend::options() const { return impl_->options; }

bool EmulatorBackend::recording_stopped() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->recorder && impl_->recorder->stopped();
}
unsigned EmulatorBackend::threads() const { return impl_->threads; }

void EmulatorBackend::inject_fault(FaultPlan plan) {
  if (plan.nth == 0) fail(Errc::invalid_argument, "fault plan with nth 0 (calls count from 1)");
  std::lock_guard lock(impl_->mutex);
  impl_->plans.push_back({plan, 0});
}

void EmulatorBackend::clear_faults() {
  std::lock_guard lock(impl_->mutex);
  impl_->plans.clear();
}

std::uint64_t EmulatorBackend::calls(std::optional<Op> op) const {
  std::lock_guard lock(impl_->mutex);
  if (op) return impl_->calls[index_of(*op)];
  std::uint64_t total = 0;
  for (auto n : impl_->calls) total += n;
  return total;
}

void EmulatorBackend::record_launches(bool on) {
  std::lock_guard lock(impl_->mutex);
  impl_->recording = on;
}

void EmulatorBackend::set_dry_run(bool on) {
  std::lock_guard lock(impl_->mutex);
  impl_->dry_run = on;
}

const std::vector<LaunchRecord>& EmulatorBackend::launch_log() const { return impl_->log; }

void EmulatorBackend::clear_launch_log() {
  std::lock_guard lock(impl_->mutex);
  impl_->log.clear();
}

}  // namespace metrale::emu
