// The port-side half of the emulator (port.hpp): how a checked access that
// fails is reported, the common block rule and the registry lookup.
#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "metrale/emu/port.hpp"
#include "metrale/error.hpp"

namespace metrale::emu {

namespace {

std::string dims(Dim3 d) { return fmt::format("({},{},{})", d.x, d.y, d.z); }

}  // namespace

namespace detail {

std::string describe(const Allocation& alloc) {
  return fmt::format("allocation #{}: {} bytes at {:#x}, allocated at {}", alloc.serial, alloc.bytes, alloc.base.addr,
                     alloc.site);
}

std::size_t merge_ranges(std::vector<AccessRange>& log) {
  std::sort(log.begin(), log.end(), [](const AccessRange& a, const AccessRange& b) {
    if (a.alloc != b.alloc) return a.alloc->serial < b.alloc->serial;
    if (a.param != b.param) return std::less<const char*>{}(a.param, b.param);
    return a.begin < b.begin;
  });
  std::size_t kept = 0;
  for (const AccessRange& r : log) {
    if (kept > 0) {
      AccessRange& last = log[kept - 1];
      if (last.alloc == r.alloc && last.param == r.param && r.begin <= last.end) {
        last.end = std::max(last.end, r.end);
        continue;
      }
    }
    log[kept++] = r;
  }
  log.resize(kept);
  return kept;
}

}  // namespace detail

// The message starts with the entry name, not "module.entry": KernelLaunch
// already adds the full name as context, and the entry is enough to find the
// port when the backend is called directly.
std::string Block::who() const {
  std::string who = fmt::format("{} block {}", kernel_, dims(blockIdx));
  if (thread_ != kNoThread) who += fmt::format(" thread {}", thread_);
  return who;
}

void Block::fault(std::string_view what, const detail::Allocation* alloc, DevicePtr param_addr, const char* param,
                  std::int64_t offset, std::uint64_t len) const {
  const std::string who = this->who();
  if (alloc == nullptr) {
    // Without an allocation there is no base to measure from: name the
    // pointer the port holds and the offset of the access from it.
    fail(Errc::device_fault, "{}: {} of {} bytes through parameter {} = {:#x}, offset {}, which is in no allocation",
         who, what, len, param, param_addr.addr, offset);
  }
  fail(Errc::device_fault, "{}: {} of {} bytes through parameter {} at {:#x}, offset {} of {}", who, what, len, param,
       alloc->base.addr + static_cast<std::uint64_t>(offset), offset, detail::describe(*alloc));
}

void Block::fault(std::string_view what) const { fail(Errc::device_fault, "{}: {}", who(), what); }

void Block::over_budget() const {
  fail(Errc::capacity_exceeded,
       "{}: more than {} checked accesses to device memory (its arithmetic counted with them), the emulator's "
       "limit for one block (METRALE_EMU_BLOCK_ACCESSES; a block table that repeats a page can ask for any number "
       "of keys): stopped",
       who(), max_accesses_);
}

void Block::over_launch_budget() const {
  fail(Errc::capacity_exceeded,
       "{}: the launch's blocks made more than {} checked accesses to device memory (their arithmetic counted with "
       "them), the emulator's limit for one launch (METRALE_EMU_LAUNCH_ACCESSES; a block table that repeats a page can "
       "ask for any number of keys in every block): stopped",
       who(), launch_->max);
}

BlockRule block_is(Dim3 shape) {
  return [shape](Dim3 block, std::span<const KernelArg>) -> std::optional<std::string> {
    if (block == shape) return std::nullopt;
    return fmt::format("block {} but the kernel requires {}", dims(block), dims(shape));
  };
}

const Registry::Entry* Registry::find(std::string_view module, std::string_view entry) const {
  for (const auto& e : entries_) {
    if (e.module == module && e.entry == entry) return &e;
  }
  return nullptr;
}

Registry::Entry& Registry::registered(std::string_view module, std::string_view entry, std::string_view setter) {
  for (auto& e : entries_)
    if (e.module == module && e.entry == entry) return e;
  fail(Errc::internal, "{}: no kernel {}.{} registered", setter, module, entry);
}

void Registry::set_recorded_floor(std::string_view module, std::string_view entry, std::string output, double floor) {
  registered(module, entry, "set_recorded_floor").recorded_floor.emplace_back(std::move(output), floor);
}

void Registry::set_cluster_rule(std::string_view module, std::string_view entry, ClusterRule rule) {
  registered(module, entry, "set_cluster_rule").cluster_rule = std::move(rule);
}

std::optional<double> Registry::Entry::floor_of(std::string_view name) const {
  for (const auto& [output, floor] : recorded_floor)
    if (output == name) return floor;
  return std::nullopt;
}

}  // namespace metrale::emu
