// What a port sees (SPEC §2): the block it runs as, and checked global
// pointers. A port is a plain function with the kernel's parameter list, in the
// kernel's order, after a leading `Block&`:
//
//   __global__ void mla_batched_gemv(const bf16* input, ..., uint32_t n_out, ...)
//   void mla_batched_gemv(Block& blk, Global<const Bf16> input, ..., uint32_t n_out, ...)
//
// The registry derives each parameter's kind from the port's own signature, so
// the declared list cannot disagree with the port. Every access through a
// `Global` is checked against the allocation its parameter points into:
// bounds, alignment, use after free, bytes never written; stores (and loads of
// what the launch writes) are logged so that two blocks writing the same byte, or
// one reading a byte another writes, are reported as a race.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "metrale/device.hpp"
#include "metrale/dtype.hpp"

namespace metrale::emu {

namespace detail {

/// One allocation of the emulator's memory. Owned by the backend; ports see it
/// read-only through `Global`.
struct Allocation {
  std::uint64_t serial = 0;       // 1, 2, ... in allocation order
  DevicePtr base{};
  std::size_t bytes = 0;
  std::string site;               // "file:line (function)"
  std::byte* data = nullptr;      // nullptr once freed
  std::uint8_t* written = nullptr;  // shadow: 1 byte per byte, 1 = written
  bool live = true;
};

/// "allocation #3: 256 bytes at 0x700000010000, allocated at file:line
/// (function)", the way every emulator fault names an allocation.
std::string describe(const Allocation& alloc);

/// Resolves a device address to the allocation it falls in (live or freed), or
/// nullptr when it falls in none.
class AddressSpace {
 public:
  virtual ~AddressSpace() = default;
  virtual const Allocation* resolve(DevicePtr addr) const = 0;
};

enum class Access : std::uint8_t { read, write };

/// One range of bytes a block wrote (or read, of an allocation the launch writes), for the
/// cross-block race check.
struct AccessRange {
  const Allocation* alloc;
  std::uint64_t begin, end;  // byte offsets in the allocation
  const char* param;
};

/// Sort `log` by allocation, parameter and start, and merge the ranges of one allocation and
/// parameter that touch or overlap; returns the ranges left.
std::size_t merge_ranges(std::vector<AccessRange>& log);

}  // namespace detail

template <class T>
class Global;

/// The checked accesses of one launch's blocks together, against the launch's limit.
struct LaunchAccesses {
  std::atomic<std::uint64_t> count;
  std::uint64_t max;
};

/// The block a port runs as: `blockIdx`, `blockDim`, `gridDim` as on the
/// device. `threads(f)` runs one phase of the kernel (the code between two
/// barriers) for every thread of the block, in order.
class Block {
 public:
  Dim3 blockIdx, blockDim, gridDim;
  Dim3 clusterDim{1, 1, 1};  // the launch's cluster shape (GpuBackend::launch)

  /// Run `f(tid)` for tid = 0 .. blockDim.count()-1 (the linear thread index).
  template <class F>
  void threads(F&& f) {
    const auto n = static_cast<std::uint32_t>(blockDim.count());
    for (std::uint32_t t = 0; t < n; ++t) {
      thread_ = t;
      f(t);
    }
    thread_ = kNoThread;
  }

  std::uint32_t num_threads() const { return static_cast<std::uint32_t>(blockDim.count()); }

  /// A checked pointer for parameter `param` at address `addr`.
  template <class T>
  Global<T> global(DevicePtr addr, const char* param);

  // ---- used by Global and the executor ------------------------------------
  /// `max_accesses`: the checked accesses (Global's loads, stores, reads and writes) the block may
  /// make before it stops with `capacity_exceeded` (EmulatorOptions::max_block_accesses);
  /// `launch`, when given, counts the launch's blocks' accesses together against its own limit
  /// (EmulatorOptions::max_launch_accesses), in batches of kLaunchBatch and at the block's end.
  Block(std::string_view kernel, Dim3 block_idx, Dim3 block_dim, Dim3 grid_dim, const detail::AddressSpace& memory,
        bool check_written, bool log_writes, std::uint64_t max_accesses = ~std::uint64_t{0},
        LaunchAccesses* launch = nullptr)
      : blockIdx(block_idx),
        blockDim(block_dim),
        gridDim(grid_dim),
        kernel_(kernel),
        memory_(memory),
        check_written_(check_written),
        log_writes_(log_writes),
        max_accesses_(max_accesses),
        launch_(launch) {}

  [[noreturn]] void fault(std::string_view what, const detail::Allocation* alloc, DevicePtr param_addr,
                          const char* param, std::int64_t offset, std::uint64_t len) const;
  /// A fault the port names itself (a bad index, before the access it would make): "<kernel>
  /// block (x,y,z)[ thread t]: <what>", Errc::device_fault.
  [[noreturn]] void fault(std::string_view what) const;
  bool check_written() const { return check_written_; }
  /// Count one checked access of `bytes`, as one access per kAccessBytes or part of them (a row's
  /// view costs the emulator its bytes' worth of checks); past the block's or the launch's limit,
  /// stop (`capacity_exceeded`).
  void count_access(std::uint64_t bytes) {
    charge(bytes <= kAccessBytes ? 1 : (bytes + kAccessBytes - 1) / kAccessBytes);
  }
  /// Count `macs` multiply-adds of the port's own arithmetic against the same limits, as one
  /// access per kMacsPerAccess (about what checking one access costs the emulator): the split
  /// ports serve up to 64 heads from each key row they read, so their time grows with the work,
  /// not with the bytes (a repeated page under a huge seq_len would otherwise run for hours).
  void count_work(std::uint64_t macs) { charge(macs / kMacsPerAccess); }
  /// Count the block's start against the same limits, as one access per warp: a block that
  /// touches no memory still costs the emulator about that much, so a grid of 2^31 of them stops
  /// at the launch's limit instead of running for a quarter of an hour.
  void count_start() { charge((num_threads() + 31) / 32); }
  /// Add the accesses not yet counted to the launch's (every kLaunchBatch, and when the block
  /// ends); past its limit, stop (`capacity_exceeded`).
  void report_accesses() {
    const std::uint64_t n = std::exchange(unreported_, 0);
    if (launch_ != nullptr && launch_->count.fetch_add(n, std::memory_order_relaxed) + n > launch_->max)
      over_launch_budget();
  }
  void log_write(const detail::Allocation* alloc, std::uint64_t begin, std::uint64_t end, const char* param) {
    if (!log_writes_) return;
    if (!writes_.empty()) {
      auto& last = writes_.back();
      if (last.alloc == alloc && last.end == begin && last.param == param) {  // (as merge_ranges: a race
        last.end = end;                                                       // names the parameter)
        return;
      }
    }
    writes_.push_back({alloc, begin, end, param});
    if (writes_.size() >= compact_writes_at_) compact_writes_at_ = compact(writes_);
  }
  /// The block's writes, each allocation's and parameter's touching ranges merged (call it once
  /// the block has run).
  std::vector<detail::AccessRange>& writes() {
    compact(writes_);
    return writes_;
  }
  /// Log reads of these allocations too (those the launch's writable parameters point into): a
  /// block reading bytes another block writes is a race, as two writing them are.
  void watch_reads(std::span<const detail::Allocation* const> allocs) { watched_ = allocs; }
  void log_read(const detail::Allocation* alloc, std::uint64_t begin, std::uint64_t end, const char* param) {
    if (!log_writes_ || std::find(watched_.begin(), watched_.end(), alloc) == watched_.end()) return;
    if (!reads_.empty()) {
      auto& last = reads_.back();
      if (last.alloc == alloc && last.begin <= end && begin <= last.end && last.param == param) {
        last.begin = std::min(last.begin, begin), last.end = std::max(last.end, end);
        return;
      }
    }
    reads_.push_back({alloc, begin, end, param});
    if (reads_.size() >= compact_reads_at_) compact_reads_at_ = compact(reads_);
  }
  /// The block's logged reads, merged as writes() merges.
  std::vector<detail::AccessRange>& reads() {
    compact(reads_);
    return reads_;
  }
  std::string_view kernel() const { return kernel_; }

 private:
  static constexpr std::uint32_t kNoThread = ~0u;
  std::string who() const;  // "<kernel> block (x,y,z)[ thread t]", a fault's first words
  std::string_view kernel_;
  const detail::AddressSpace& memory_;
  bool check_written_;
  bool log_writes_;
  static constexpr std::uint64_t kLaunchBatch = 4096;  // accesses a block adds to its launch's count at once
  static constexpr std::uint64_t kAccessBytes = 64;    // the bytes one counted access covers
  static constexpr std::uint64_t kMacsPerAccess = 64;  // the multiply-adds one counted access covers
  std::uint64_t max_accesses_, accesses_ = 0, unreported_ = 0;
  LaunchAccesses* launch_;
  // n more accesses, against the block's limit and (in batches) the launch's.
  void charge(std::uint64_t n) {
    if ((accesses_ += n) > max_accesses_) over_budget();
    if ((unreported_ += n) >= kLaunchBatch) report_accesses();
  }
  [[noreturn]] void over_budget() const;
  [[noreturn]] void over_launch_budget() const;
  std::uint32_t thread_ = kNoThread;
  // The logs merge a range into the last when they touch; a strided loop (thread t writing bytes
  // t, t + 256, ... of two rows in turn, as the cache store does) touches none of the last, and
  // logged a range a byte: about 100 bytes of log a byte written, 7 GB for a 350 MB case file
  // (adversarial trial, forty-fourth session). So a log is sorted and merged whenever it reaches
  // twice what the last merge left (kCompactFirst at first).
  static constexpr std::size_t kCompactFirst = 4096;
  /// merge_ranges(log); the size at which to merge it again.
  static std::size_t compact(std::vector<detail::AccessRange>& log) {
    return std::max(kCompactFirst, 2 * detail::merge_ranges(log));
  }
  std::vector<detail::AccessRange> writes_;
  std::size_t compact_writes_at_ = kCompactFirst;
  std::span<const detail::Allocation* const> watched_;
  std::vector<detail::AccessRange> reads_;
  std::size_t compact_reads_at_ = kCompactFirst;
};

/// A checked device pointer to T (const T for read-only parameters), with the
/// kernel's pointer arithmetic in elements. Element access is checked per
/// access; `read`/`write` check a whole range once and hand out a span.
template <class T>
class Global {
  using V = std::remove_const_t<T>;
  static constexpr bool kWritable = !std::is_const_v<T>;

 public:
  Global() = default;
  Global(Block* blk, const detail::Allocation* alloc, DevicePtr addr, const char* param)
      : blk_(blk), alloc_(alloc), addr_(addr), param_(param),
        offset_(alloc != nullptr ? static_cast<std::int64_t>(addr.addr - alloc->base.addr) : 0) {}

  bool is_null() const { return !addr_; }
  explicit operator bool() const { return !is_null(); }
  DevicePtr addr() const { return addr_; }

  /// Pointer arithmetic in elements, as `p + n` in CUDA.
  Global operator+(std::int64_t n) const {
    Global g = *this;
    const auto delta = n * static_cast<std::int64_t>(sizeof(T));
    g.addr_ = DevicePtr{addr_.addr + static_cast<std::uint64_t>(delta)};
    g.offset_ += delta;
    return g;
  }
  /// The same address seen as another element type (`(const uint8_t*)p`).
  template <class U>
  Global<U> as() const {
    Global<U> g(blk_, alloc_, addr_, param_);
    return g;
  }

  V load(std::uint64_t i) const {
    const std::byte* p = check(i, 1, detail::Access::read);
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  V operator[](std::uint64_t i) const
    requires(!kWritable)
  {
    return load(i);
  }

  void store(std::uint64_t i, const V& v) const
    requires kWritable
  {
    std::byte* p = const_cast<std::byte*>(check(i, 1, detail::Access::write));
    std::memcpy(p, &v, sizeof(V));
  }

  /// `p[i] = v` and `v = p[i]` for writable pointers.
  class Ref {
   public:
    Ref(const Global& g, std::uint64_t i) : g_(g), i_(i) {}
    Ref& operator=(const V& v) { g_.store(i_, v); return *this; }
    // `a[i] = b[j]` with both pointers writable copies the value, as in CUDA.
    Ref& operator=(const Ref& o) { return *this = static_cast<V>(o); }
    operator V() const { return g_.load(i_); }  // NOLINT(google-explicit-constructor)
   private:
    const Global& g_;
    std::uint64_t i_;
  };
  Ref operator[](std::uint64_t i) const
    requires kWritable
  {
    return Ref(*this, i);
  }

  /// Faults with what() (the port's name for the value that made this pointer, e.g. a block-table
  /// entry) and the allocation when elements [first, first+count) are not all in this pointer's
  /// live allocation — before an access that would fault as a read through the parameter.
  template <class What>
  void require_in_bounds(std::uint64_t first, std::uint64_t count, const What& what) const {
    const std::int64_t off = offset_ + static_cast<std::int64_t>(first * sizeof(T));
    const bool inside = alloc_ != nullptr && alloc_->live && off >= 0 &&
                        static_cast<std::uint64_t>(off) + count * sizeof(T) <= alloc_->bytes;
    if (!inside)
      blk_->fault(std::string(what()) + " (" + (alloc_ != nullptr ? detail::describe(*alloc_) : "no allocation") + ")");
  }

  /// Elements [first, first+count) checked once for reading.
  std::span<const V> read(std::uint64_t first, std::uint64_t count) const {
    if (count == 0) return {};
    const std::byte* p = check(first, count, detail::Access::read);
    return {reinterpret_cast<const V*>(p), count};
  }
  /// Elements [first, first+count) checked once for writing; they count as
  /// written from here on.
  std::span<V> write(std::uint64_t first, std::uint64_t count) const
    requires kWritable
  {
    if (count == 0) return {};
    std::byte* p = const_cast<std::byte*>(check(first, count, detail::Access::write));
    return {reinterpret_cast<V*>(p), count};
  }

 private:
  template <class U>
  friend class Global;

  const std::byte* check(std::uint64_t first, std::uint64_t count, detail::Access access) const {
    const std::int64_t off = offset_ + static_cast<std::int64_t>(first * sizeof(T));
    const std::uint64_t len = count * sizeof(T);
    const char* verb = access == detail::Access::read ? "read" : "write";
    blk_->count_access(len);
    if (alloc_ == nullptr) blk_->fault(std::string(verb) + " of unmapped memory", nullptr, addr_, param_, off, len);
    if (!alloc_->live) blk_->fault(std::string(verb) + " after free", alloc_, addr_, param_, off, len);
    if (off < 0 || static_cast<std::uint64_t>(off) + len > alloc_->bytes)
      blk_->fault("out-of-bounds " + std::string(verb), alloc_, addr_, param_, off, len);
    if ((alloc_->base.addr + static_cast<std::uint64_t>(off)) % alignof(V) != 0)
      blk_->fault("misaligned " + std::string(verb), alloc_, addr_, param_, off, len);
    const auto uoff = static_cast<std::uint64_t>(off);
    if (access == detail::Access::read) {
      blk_->log_read(alloc_, uoff, uoff + len, param_);
      if (blk_->check_written()) {
        const std::uint8_t* w = alloc_->written + uoff;
        // memchr: the shadow scan is most of a port's cost, and memchr is vectorised.
        if (const void* hole = std::memchr(w, 0, len)) {
          const auto b = static_cast<std::uint64_t>(static_cast<const std::uint8_t*>(hole) - w);
          blk_->fault("read of bytes never written", alloc_, addr_, param_, static_cast<std::int64_t>(uoff + b),
                      len - b);
        }
      }
    } else {
      std::memset(alloc_->written + uoff, 1, len);
      blk_->log_write(alloc_, uoff, uoff + len, param_);
    }
    return alloc_->data + uoff;
  }

  Block* blk_ = nullptr;
  const detail::Allocation* alloc_ = nullptr;
  DevicePtr addr_{};
  const char* param_ = "?";
  std::int64_t offset_ = 0;  // of addr_ from the allocation's base, in bytes
};

template <class T>
Global<T> Block::global(DevicePtr addr, const char* param) {
  return Global<T>(this, memory_.resolve(addr), addr, param);
}

// ---- the registry ---------------------------------------------------------

/// One declared kernel parameter: its name and kind, in declaration order.
struct ParamDecl {
  const char* name;  // a string literal
  ArgKind kind;
  Dtype dtype;  // the element type for a pointer, the value's type for a scalar
  bool writable = false;  // a pointer the port may store through (Global<T>, T not const): an output
  bool operator==(const ParamDecl& o) const { return std::string_view(name) == o.name && kind == o.kind; }
};

/// Returns an error message when `block` is not a shape the kernel supports
/// for these arguments, nothing otherwise.
using BlockRule = std::function<std::optional<std::string>(Dim3 block, std::span<const KernelArg> args)>;

/// The rule "exactly this block shape".
BlockRule block_is(Dim3 shape);

/// Returns an error message when `cluster` is not a thread-block cluster shape the kernel supports
/// over `grid`, nothing otherwise. Checked at every launch, dry runs included, before any block runs.
using ClusterRule = std::function<std::optional<std::string>(Dim3 grid, Dim3 cluster)>;

namespace detail {
template <class T>
struct PortArg;
template <>
struct PortArg<std::uint32_t> {
  static constexpr ArgKind kind = ArgKind::u32;
  static constexpr Dtype dtype = Dtype::u32;
  static constexpr bool writable = false;
  static std::uint32_t get(const KernelArg& a, Block&, const char*) { return a.as_u32(); }
};
template <>
struct PortArg<std::int32_t> {
  static constexpr ArgKind kind = ArgKind::i32;
  static constexpr Dtype dtype = Dtype::i32;
  static constexpr bool writable = false;
  static std::int32_t get(const KernelArg& a, Block&, const char*) { return a.as_i32(); }
};
template <>
struct PortArg<float> {
  static constexpr ArgKind kind = ArgKind::f32;
  static constexpr Dtype dtype = Dtype::f32;
  static constexpr bool writable = false;
  static float get(const KernelArg& a, Block&, const char*) { return a.as_f32(); }
};
template <>
struct PortArg<std::uint64_t> {
  static constexpr ArgKind kind = ArgKind::u64;
  static constexpr Dtype dtype = Dtype::u64;
  static constexpr bool writable = false;
  static std::uint64_t get(const KernelArg& a, Block&, const char*) { return a.as_u64(); }
};
template <class T>
struct PortArg<Global<T>> {
  static constexpr ArgKind kind = ArgKind::ptr;
  static constexpr Dtype dtype = dtype_of<std::remove_const_t<T>>();
  static constexpr bool writable = !std::is_const_v<T>;
  static Global<T> get(const KernelArg& a, Block& b, const char* name) { return b.global<T>(a.as_ptr(), name); }
};
}  // namespace detail

class Registry {
 public:
  using Invoker = std::function<void(Block&, std::span<const KernelArg>, std::span<const ParamDecl>)>;

  struct Entry {
    std::string module, entry;
    std::vector<ParamDecl> params;
    BlockRule block_rule;
    ClusterRule cluster_rule;  // none: the kernel takes whatever cluster the backend allows
    Invoker run;
    /// Outputs whose port may differ from the kernel by more than the same arithmetic does,
    /// with the absolute floor of a recorded case's tolerance for them, as a fraction of the
    /// output's largest value (in place of same_arithmetic_tolerance's).
    std::vector<std::pair<std::string, double>> recorded_floor;
    std::string full_name() const { return module + "." + entry; }
    /// The recorded_floor of output `name`, if it has one.
    std::optional<double> floor_of(std::string_view name) const;
  };

  /// Register `Port` (a `void(Block&, params...)` function) under (module,
  /// entry) with its parameter names in declaration order.
  template <auto Port, std::size_t N>
  void add(std::string module, std::string entry, const char* const (&names)[N], BlockRule rule) {
    add_impl<N>(Port, std::move(module), std::move(entry), names, std::move(rule));
  }

  /// nullptr when (module, entry) is not registered.
  const Entry* find(std::string_view module, std::string_view entry) const;
  /// Set Entry::recorded_floor of `output` of a registered (module, entry). Errors: `internal`
  /// when it is not registered.
  void set_recorded_floor(std::string_view module, std::string_view entry, std::string output, double floor);
  /// Set Entry::cluster_rule of a registered (module, entry). Errors: `internal` when it is not
  /// registered.
  void set_cluster_rule(std::string_view module, std::string_view entry, ClusterRule rule);
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  /// The entry (module, entry), for `setter`'s change. Errors: `internal` when it is not registered.
  Entry& registered(std::string_view module, std::string_view entry, std::string_view setter);

  template <std::size_t N, class... A>
  void add_impl(void (*port)(Block&, A...), std::string module, std::string entry, const char* const (&names)[N],
                BlockRule rule) {
    static_assert(sizeof...(A) == N, "one name per port parameter");
    Entry e{std::move(module), std::move(entry), {}, std::move(rule), {}, {}, {}};
    constexpr ArgKind kinds[] = {detail::PortArg<A>::kind...};
    constexpr Dtype dtypes[] = {detail::PortArg<A>::dtype...};
    constexpr bool writable[] = {detail::PortArg<A>::writable...};
    for (std::size_t i = 0; i < N; ++i) e.params.push_back({names[i], kinds[i], dtypes[i], writable[i]});
    e.run = [port](Block& blk, std::span<const KernelArg> args, std::span<const ParamDecl> decl) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        port(blk, detail::PortArg<A>::get(args[I], blk, decl[I].name)...);
      }(std::index_sequence_for<A...>{});
    };
    entries_.push_back(std::move(e));
  }

  std::vector<Entry> entries_;
};

}  // namespace metrale::emu
