#include "recorder.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "metrale/error.hpp"

namespace metrale::emu {

namespace {

// Where the region of pointer argument `i` ends: the end of its allocation, or the first other
// pointer argument further into the same allocation (a workspace holding two outputs, as the
// split decode's o_partial and ml_partial), so that a replay's separate buffers hold the same.
std::uint64_t region_end(std::size_t i, std::span<const KernelArg> args, const Registry::Entry& e,
                         const detail::Allocation& a) {
  const std::uint64_t begin = args[i].as_ptr().addr;
  std::uint64_t end = a.base.addr + a.bytes;
  for (std::size_t j = 0; j < e.params.size(); ++j) {
    if (j == i || e.params[j].kind != ArgKind::ptr) continue;
    const std::uint64_t other = args[j].as_ptr().addr;
    if (other > begin && other < end) end = other;
  }
  return end;
}

// Pointer argument `i`'s region (region_end) in whole elements of its dtype: where it starts in
// its allocation and how many; none when the address is null or in no live allocation.
struct Region {
  const detail::Allocation* allocation;
  std::uint64_t offset, elements;
};
std::optional<Region> region_of(std::size_t i, std::span<const KernelArg> args, const Registry::Entry& e,
                                const detail::AddressSpace& memory) {
  const DevicePtr addr = args[i].as_ptr();
  const detail::Allocation* a = addr ? memory.resolve(addr) : nullptr;
  if (a == nullptr || !a->live) return std::nullopt;
  return Region{a, addr.addr - a->base.addr, (region_end(i, args, e, *a) - addr.addr) / dtype_size(e.params[i].dtype)};
}

// The bytes of a region, as a tensor of its dtype.
Tensor snapshot(const Region& r, Dtype dtype) {
  Tensor t{dtype, {static_cast<std::int64_t>(r.elements)}, std::vector<std::byte>(r.elements * dtype_size(dtype))};
  std::memcpy(t.data.data(), r.allocation->data + r.offset, t.data.size());
  return t;
}

// "512 bytes", "12.3 kB", "4.5 MB", "6.7 GB" (decimal units).
std::string format_bytes(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} byte{}", bytes, bytes == 1 ? "" : "s");
}

}  // namespace

constexpr std::uint64_t kMaxCases = 10'000'000'000'000'000'000ULL;

CaseRecorder::CaseRecorder(std::filesystem::path dir, std::uint64_t limit_bytes)
    : dir_(std::move(dir)), limit_bytes_(limit_bytes) {
  make_folder();
  // Numbering continues after the highest number already there (NNNN_<entry>), so a second run
  // never overwrites a case of the first, even one whose earlier neighbours were deleted.
  std::uint64_t files = 0;
  std::error_code ec;
  // (A folder it may not list, mode 0333: named, where it had been the library's internal error.)
  const auto cannot_list = [&] {  // (the destructor will not run: the folders it made go now)
    remove_made();
    fail(Errc::invalid_argument, "recorder: cannot list {} to number its cases ({})", printable(dir_.string()),
         ec.message());
  };
  std::filesystem::directory_iterator it(dir_, ec);
  for (; !ec && it != std::filesystem::directory_iterator{}; it.increment(ec)) {
    const std::filesystem::directory_entry& e = *it;
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    const std::string stem = e.path().stem().string();
    const auto digits = stem.find_first_not_of("0123456789");
    if (digits == 0 || digits == std::string::npos || stem[digits] != '_') continue;
    // Leading zeros count for nothing; a number of 20 digits or more is past the last one
    // (kMaxCases − 1), as the most a number may be (before, such a file was not counted).
    const auto lead = std::min(stem.find_first_not_of('0'), digits - 1);
    const std::string number = stem.substr(lead, digits - lead);
    const std::uint64_t after =
        number.size() > 19 ? kMaxCases : std::min<std::uint64_t>(std::stoull(number) + 1, kMaxCases);
    // The highest number, as its file has it, for the messages (not 10^19 − 1 for a longer one).
    const bool higher = number.size() != highest_.size() ? number.size() > highest_.size() : number > highest_;
    if (after > next_ || (after == kMaxCases && higher)) next_ = after, highest_ = number;
  }
  if (ec) cannot_list();
  // A folder it may not write in (read-only, /proc's) is named before the run: it had surfaced at
  // the first launch, as that case's failure (adversarial trial, fiftieth session).
  std::string probe = (dir_ / ".metrale-record-XXXXXX").string();
  if (const int fd = ::mkstemp(probe.data()); fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  } else {
    const int err = errno;
    remove_made();
    fail(Errc::invalid_argument, "recorder: cannot write a case file in {} ({})", printable(dir_.string()),
         std::strerror(err));
  }
  if (files > 0 && next_ >= kMaxCases)
    spdlog::warn("recorder: {} already holds {} case file{}, one numbered {}: no number is left for a new one",
                 printable(dir_.string()), files, files == 1 ? "" : "s", highest_);
  else if (files > 0)
    spdlog::warn("recorder: {} already holds {} case file{}; new ones are numbered from {:04}",
                 printable(dir_.string()), files, files == 1 ? "" : "s", next_);
}

CaseRecorder::~CaseRecorder() {
  std::fflush(stdout);  // the closing note after what the command printed, also when stdout is a pipe
  if (written_ > 0) {
    spdlog::info("recorder: wrote {} kernel case{} ({}) to {}", written_, written_ == 1 ? "" : "s",
                 format_bytes(bytes_), printable(dir_.string()));
  }
  // The folders it made that stayed empty: all of them where it wrote nothing, else those a `..`
  // passed through (`new/..`).
  const bool removed = remove_made();
  if (written_ == 0)
    spdlog::warn("recorder: wrote no kernel case to {} (no launch ran on this emulator, or none could be written){}",
                 printable(dir_.string()), removed ? "; removed the empty folders it made for it" : "");
}

KernelCase CaseRecorder::before(const Registry::Entry& e, Dim3 grid, Dim3 block, std::span<const KernelArg> args,
                                const detail::AddressSpace& memory) {
  if (!stopped_.empty())
    fail(Errc::capacity_exceeded,
         "recorder: the recording in {} stopped {} ({} written in {} case{}); the launch of {} "
         "did not run",
         printable(dir_.string()), stopped_, format_bytes(bytes_), written_, written_ == 1 ? "" : "s", e.entry);
  KernelCase c;
  c.module = e.module;
  c.entry = e.entry;
  c.grid = grid;
  c.block = block;
  c.shape_recorded = true;
  // Sized first, copied once the limit allows: a pool mapped lazily (the emulator's) costs no
  // memory until it is read, and a refused launch must not read it.
  std::vector<std::optional<Region>> regions(e.params.size());
  for (std::size_t i = 0; i < e.params.size(); ++i) {
    const ParamDecl& p = e.params[i];
    if (p.kind != ArgKind::ptr) {
      c.scalars[p.name] = args[i];
      continue;
    }
    // A pointer that an earlier one of the same dtype equals (one latent pool as both caches)
    // shares its buffer in the replay too, rather than getting a copy of its own.
    const char* same = nullptr;
    for (std::size_t j = 0; j < i && same == nullptr; ++j)
      if (e.params[j].kind == ArgKind::ptr && e.params[j].dtype == p.dtype && args[j].as_ptr() == args[i].as_ptr() &&
          regions[j])
        same = e.params[j].name;
    if (same != nullptr) {
      c.aliases[p.name] = same;
    } else {
      regions[i] = region_of(i, args, e, memory);
    }
  }
  // The file holds the inputs and, for each writable one, as many bytes again (its expectation:
  // a read-only buffer becomes one only where a written one's region covers it).
  std::uint64_t bound = 16 << 10;  // the header: a few kB of names, shapes and scalars
  for (std::size_t i = 0; i < e.params.size(); ++i)
    if (regions[i]) bound += regions[i]->elements * dtype_size(e.params[i].dtype) * (e.params[i].writable ? 2 : 1);
  if (bytes_ + bound > limit_bytes_) {
    stopped_ = fmt::format("at its limit of {}", format_bytes(limit_bytes_));
    fail(Errc::capacity_exceeded,
         "recorder: {} (up to {}) would take the recording in {} past its limit of {} ({} already written in {} "
         "case{}); the launch did not run. Raise the limit (--record-limit, METRALE_RECORD_LIMIT) or record fewer "
         "launches",
         c.entry, format_bytes(bound), printable(dir_.string()), format_bytes(limit_bytes_), format_bytes(bytes_),
         written_, written_ == 1 ? "" : "s");
  }
  for (std::size_t i = 0; i < e.params.size(); ++i)
    if (regions[i]) c.inputs[e.params[i].name] = snapshot(*regions[i], e.params[i].dtype);
  return c;
}

void CaseRecorder::make_folder() {
  // One component at a time as written (a `..` resolves through what exists then), so that the
  // folders made are known exactly: those this recorder created, not another run recording into
  // the same new folder. That run may also remove what it made while this one makes its own: the
  // walk then starts again, a few times.
  for (int attempt = 0;; ++attempt) {
    std::filesystem::path p;
    std::error_code ec;
    for (const auto& part : dir_) {
      p /= part;
      if (part.empty() || std::filesystem::exists(std::filesystem::symlink_status(p, ec))) continue;
      if (std::filesystem::create_directory(p, ec)) made_.push_back(p);
      if (ec) break;
    }
    std::error_code unused;
    if (!ec && std::filesystem::is_directory(dir_, unused)) return;
    // What is not a folder: dir_ itself, or the folder a component could not be made in. Its link
    // hint before the removal: `made/../link` resolves only while `made` is there.
    const bool missing = ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory;
    const std::filesystem::path bad = !ec ? dir_ : missing ? p.parent_path() : p;
    const bool link = std::filesystem::is_symlink(bad, unused);
    remove_made();
    if (attempt < 3 && missing && !link && !std::filesystem::exists(bad, unused)) continue;
    // (A folder there that refuses the new one with ENOENT, as /proc does: its own reason.)
    if (ec && (!missing || std::filesystem::is_directory(bad, unused)))
      fail(Errc::invalid_argument, "recorder: cannot create {}{}: {}", printable(dir_.string()),
           p == dir_ ? "" : fmt::format(" (at {})", printable(p.string())), ec.message());
    fail(Errc::invalid_argument, "recorder: cannot record into {}: {} is not a folder{}", printable(dir_.string()),
         bad == dir_ ? "it" : printable(bad.string()), link ? " (a link to nothing, or to a file)" : "");
  }
}

bool CaseRecorder::remove_made() {
  bool removed = false;
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    std::error_code ec;  // a real folder and empty (std::filesystem::remove would unlink a link)
    if (std::filesystem::is_directory(std::filesystem::symlink_status(*it, ec)) && std::filesystem::is_empty(*it, ec))
      removed = std::filesystem::remove(*it, ec) || removed;
  }
  made_.clear();
  return removed;
}

bool CaseRecorder::write_new(const SafeTensors& file, const std::filesystem::path& path) const {
  // The folder again first: another run that made it and wrote nothing removes it at its end,
  // also between this and the file's creation (then a few more tries).
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    try {
      return file.write_new(path);
    } catch (const Error&) {
      if (attempt == 3 || std::filesystem::is_directory(dir_, ec)) throw;
    }
  }
}

void CaseRecorder::after(KernelCase c, std::span<const KernelArg> args, const Registry::Entry& e,
                         const detail::AddressSpace& memory) {
  for (std::size_t i = 0; i < e.params.size(); ++i) {
    const ParamDecl& p = e.params[i];
    const auto in = c.inputs.find(p.name);
    if (p.kind != ArgKind::ptr || in == c.inputs.end()) continue;
    // An output is an expectation even where the launch left its bytes as they were (zeros
    // into zeros): the hardware must leave them so too. So is a read-only argument an output
    // aliases (alias.o = q: the buffer is recorded as q's). One whose region an output's overlaps
    // otherwise is not: a replay gives each its own buffer, so its bytes would not change there
    // (and the case reader refuses an expectation of a buffer the kernel only reads); the
    // output's own expectation holds the bytes it wrote.
    const bool aliased_output = std::any_of(c.aliases.begin(), c.aliases.end(), [&](const auto& a) {
      const auto w =
          std::find_if(e.params.begin(), e.params.end(), [&](const ParamDecl& q) { return q.name == a.first; });
      return a.second == p.name && w != e.params.end() && w->writable;
    });
    if (!p.writable && !aliased_output) continue;
    const auto region = region_of(i, args, e, memory);
    if (!region) continue;
    Tensor now = snapshot(*region, p.dtype);
    if (!p.writable && now.data == in->second.data) continue;
    if (const auto floor = e.floor_of(p.name)) {  // the port may round differently: both comparisons
      c.tolerance[p.name] = c.backend_tolerance[p.name] = same_arithmetic_tolerance(now, *floor);
    } else {
      c.tolerance[p.name] = same_arithmetic_tolerance(now);
    }
    c.expected[p.name] = std::move(now);
  }
  // A number another run (recording into the same folder) took meanwhile is skipped: a case file
  // is only ever created, never replaced. Numbers stay below 10^19 (19 digits), which the next
  // run's scan reads back.
  for (;; ++next_) {
    if (next_ >= kMaxCases)
      fail(Errc::capacity_exceeded, "recorder: {} holds case number {}; numbers stop at {}", printable(dir_.string()),
           highest_, kMaxCases - 1);
    c.name = fmt::format("{:04}_{}", next_, c.entry);
    bool written = false;
    try {
      written = write_new(to_safetensors(c), dir_ / (c.name + ".safetensors"));
    } catch (const Error&) {  // a full disk, ulimit -f: a later, smaller case would leave a gap
      stopped_ = fmt::format("when case {} could not be written", c.name);
      throw;
    }
    highest_ = fmt::format("{}", next_);  // this run's, or another's meanwhile
    if (written) break;
  }
  std::error_code ec;
  const auto size = std::filesystem::file_size(dir_ / (c.name + ".safetensors"), ec);
  bytes_ += ec ? 0 : size;
  ++next_, ++written_;  // only once the file is complete
  spdlog::debug("recorder: wrote {}", printable((dir_ / (c.name + ".safetensors")).string()));
}

}  // namespace metrale::emu
