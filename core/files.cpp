#include "metrale/files.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "metrale/error.hpp"

namespace metrale {

namespace {

std::atomic<unsigned long long> g_next_part{0};

// The staged files not yet put in place, for remove_staged_files, which a signal handler calls.
// A slot is free; being filled by its owner (the path copied, the file not yet created); naming a
// staged file; or being removed by the handler, which claims it first so that its path stays as
// it reads it (the process then ends: the owner leaves such a slot).
enum SlotState : int { kFree, kFilling, kNamed, kRemoving };
struct StagedSlot {
  std::atomic<int> state{kFree};
  char path[4096];
};
constexpr int kStagedSlots = 64;
StagedSlot g_staged[kStagedSlots];
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "read from a signal handler");

// A slot holding `path`, not yet naming it (name_staged), or -1 where none is free or the path is
// too long (such a file is then left to its destructor alone).
int reserve_staged(const std::filesystem::path& path) {
  const std::string& native = path.native();
  if (native.size() >= sizeof(StagedSlot::path)) return -1;
  for (int i = 0; i < kStagedSlots; ++i) {
    int free = kFree;
    if (!g_staged[i].state.compare_exchange_strong(free, kFilling)) continue;
    std::memcpy(g_staged[i].path, native.c_str(), native.size() + 1);
    return i;
  }
  return -1;
}

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};  // those remove_staged_files_on_signals handles

// Set by the signal handler before it looks at the slots.
std::atomic<bool> g_ending{false};

// The reserved slot's file created: from here a signal removes it. A handler running on another
// thread may have looked at the slot before: then this thread removes it.
void name_staged(int slot) {
  if (slot < 0) return;
  g_staged[slot].state.store(kNamed);
  int named = kNamed;
  if (g_ending.load() && g_staged[slot].state.compare_exchange_strong(named, kRemoving)) ::unlink(g_staged[slot].path);
}

// The slot free again: the file put in place, removed, or kept as the user's.
void unname_staged(int& slot) {
  if (slot >= 0) {
    int state = g_staged[slot].state.load(std::memory_order_acquire);
    while (state != kRemoving && !g_staged[slot].state.compare_exchange_weak(state, kFree)) {
    }
  }
  slot = -1;
}

// Every staged file named in a slot removed: async-signal-safe (atomics and unlink).
void remove_staged_files() noexcept {
  g_ending.store(true);  // a file named after the look below is removed by its own thread
  for (StagedSlot& slot : g_staged) {
    int named = kNamed;
    if (slot.state.compare_exchange_strong(named, kRemoving)) ::unlink(slot.path);
  }
}

void remove_staged_then_end(int sig) {
  remove_staged_files();
  ::raise(sig);  // blocked in the handler; delivered after it under the default action (SA_RESETHAND)
}

// A full disk, a quota or the file-size limit (ulimit -f) is a capacity, not a bad argument (the
// fresh-user trial, forty-eighth session: "error (invalid_argument): ... (File too large)").
[[noreturn]] void cannot_write(const std::filesystem::path& target, int err) {
  const bool full = err == ENOSPC || err == EFBIG || err == EDQUOT;
  // ENOENT in a folder that exists is its file system's refusal (/proc's), not a missing path
  // (adversarial trial, fiftieth session: bench --json /proc/self/status said "No such file").
  std::error_code ec;
  const bool refused =
      err == ENOENT && std::filesystem::is_directory(target.parent_path().empty() ? "." : target.parent_path(), ec);
  fail(full ? Errc::capacity_exceeded : Errc::invalid_argument, "cannot write {} ({})", target.string(),
       refused ? std::string("its folder's file system makes no new files: ") + std::strerror(err)
               : std::string(std::strerror(err)));
}

const char* describe_type(std::filesystem::file_type type) {
  switch (type) {
    case std::filesystem::file_type::directory:
      return "a folder";
    case std::filesystem::file_type::symlink:
      return "a symbolic link";
    case std::filesystem::file_type::block:
      return "a block device";
    case std::filesystem::file_type::character:
      return "a character device";
    case std::filesystem::file_type::fifo:
      return "a FIFO";
    case std::filesystem::file_type::socket:
      return "a socket";
    default:
      return "something";
  }
}

}  // namespace

StagedFile::StagedFile(std::filesystem::path target, std::span<const std::byte> bytes) : target_(std::move(target)) {
  // The rename would put a regular file where a link, a FIFO or a device was: refused instead.
  std::error_code ec;
  const auto status = std::filesystem::symlink_status(target_, ec);
  const auto type = status.type();
  if (!ec && type != std::filesystem::file_type::not_found && type != std::filesystem::file_type::regular)
    fail(Errc::invalid_argument,
         "cannot write {} ({}, not a regular file; the file is written whole and renamed "
         "into place, which would replace it)",
         target_.string(), describe_type(type));
  // A file it replaces keeps its permissions (the new file's are the umask's: a private 0600 report
  // would become world-readable).
  const bool replaces = !ec && type == std::filesystem::file_type::regular;
  // The rename needs only the folder's write permission: a file its user may not write is refused,
  // as `>` refuses it (adversarial trial, forty-fifth session: bench --json replaced a root-owned
  // 0644 file, run as nobody in a world-writable folder).
  if (replaces && ::faccessat(AT_FDCWD, target_.c_str(), W_OK, AT_EACCESS) != 0) cannot_write(target_, errno);
  // Beside the target under its name and a suffix, or, where that would pass the file-name limit
  // (255 bytes) that the target's own name keeps, under a short hidden name.
  const std::string suffix = fmt::format(".part-{}-{}", ::getpid(), g_next_part.fetch_add(1));
  staged_ = target_.filename().native().size() + suffix.size() <= 255 ? std::filesystem::path(target_) += suffix
                                                                      : target_.parent_path() / (".metrale" + suffix);
  // Created and named with the signals that remove staged files held back: one that came between
  // the two (as they often do, on the return from open) would leave the file.
  slot_ = reserve_staged(staged_);
  sigset_t before;
  hold_staged_file_signals(&before);
  const int fd = ::open(staged_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // the umask applies
  const int open_err = errno;
  if (fd >= 0) name_staged(slot_);  // ours: a signal from here on removes it
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (fd < 0) {  // (EEXIST: another's file, which a signal must not remove either)
    unname_staged(slot_);
    cannot_write(target_, open_err);
  }
  const auto* p = reinterpret_cast<const char*>(bytes.data());
  std::size_t left = bytes.size();
  // (best effort: a file system without modes, FUSE or vfat, refuses it and the file stays as made;
  // the permission bits only, not set-user-ID, set-group-ID or sticky)
  if (replaces) (void)::fchmod(fd, static_cast<mode_t>(status.permissions() & std::filesystem::perms::all));
  int err = 0;
  while (left > 0 && err == 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) p += n, left -= static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;  // (a full disk may only show here)
  if (err != 0) {
    ::unlink(staged_.c_str());
    unname_staged(slot_);
    cannot_write(target_, err);
  }
}

StagedFile::StagedFile(std::filesystem::path target, std::string_view text)
    : StagedFile(std::move(target), std::as_bytes(std::span(text.data(), text.size()))) {}

StagedFile::~StagedFile() {
  if (!done_) ::unlink(staged_.c_str());
  unname_staged(slot_);
}

void StagedFile::commit() {
  if (::rename(staged_.c_str(), target_.c_str()) != 0) cannot_write(target_, errno);
  done_ = true;
  unname_staged(slot_);
}

void StagedFile::commit_all(std::initializer_list<std::reference_wrapper<StagedFile>> files) {
  // Each put in place by a swap where its target exists, so that the old file waits at the staged
  // name until all are in place (then the destructor removes it), or goes back if one fails.
  enum class Way { swapped, renamed, plain };  // plain: no way back (the swap unsupported)
  std::vector<std::pair<StagedFile*, Way>> placed;
  placed.reserve(files.size());  // (no allocation between a file's move and its record)
  try {
    for (StagedFile& f : files) {
      // (A swap would also move a folder that took the target's place since: only a file's.)
      std::error_code ec;
      const auto type = std::filesystem::symlink_status(f.target_, ec).type();
      // Swapped, the staged name holds the target's old file: no signal removes it from then on
      // (it stays as a .part file where the process ends before the destructor).
      if (type == std::filesystem::file_type::regular) unname_staged(f.slot_);
      if (type == std::filesystem::file_type::regular &&
          ::renameat2(AT_FDCWD, f.staged_.c_str(), AT_FDCWD, f.target_.c_str(), RENAME_EXCHANGE) == 0) {
        placed.emplace_back(&f, Way::swapped);
        continue;
      }
      f.commit();  // no target (undone by renaming it back), else as one rename
      placed.emplace_back(&f, type == std::filesystem::file_type::not_found ? Way::renamed : Way::plain);
    }
  } catch (const Error& e) {
    std::string kept;  // where a swap back failed, the old file stays at the staged name
    for (auto it = placed.rbegin(); it != placed.rend(); ++it) {
      auto& [f, way] = *it;
      if (way == Way::swapped) {
        if (::renameat2(AT_FDCWD, f->staged_.c_str(), AT_FDCWD, f->target_.c_str(), RENAME_EXCHANGE) != 0) {
          f->done_ = true;
          kept += fmt::format("; the old {} is kept as {}", f->target_.string(), f->staged_.string());
        }
      } else if (way == Way::renamed && ::rename(f->target_.c_str(), f->staged_.c_str()) == 0) {
        f->done_ = false;  // (the destructor removes it)
      }
    }
    if (kept.empty()) throw;
    throw Error(e.code(), e.message() + kept);
  }
  for (auto& [f, way] : placed) f->done_ = way != Way::swapped;  // swapped: the old file, removed
}

bool StagedFile::commit_new() {
  if (::link(staged_.c_str(), target_.c_str()) != 0) {
    if (errno == EEXIST) return false;
    cannot_write(target_, errno);
  }
  ::unlink(staged_.c_str());
  done_ = true;
  unname_staged(slot_);
  return true;
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  StagedFile(path, bytes).commit();
}

std::string relative_note(const std::filesystem::path& path) {
  if (!path.is_relative()) return "";
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  return ec ? " (relative to a working folder that is gone)" : fmt::format(" (relative to {})", cwd.string());
}

std::filesystem::path file_key(const std::filesystem::path& path) {
  std::error_code ec;
  auto canonical = std::filesystem::weakly_canonical(path, ec);
  return ec ? path.lexically_normal() : canonical;
}

std::vector<std::filesystem::path> safetensors_in_folder(const std::filesystem::path& dir, std::error_code& ec) {
  std::vector<std::filesystem::path> files;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors") files.push_back(it->path());
  std::sort(files.begin(), files.end());
  return files;
}

void hold_staged_file_signals(sigset_t* before) {
  sigset_t held;
  sigemptyset(&held);
  for (const int sig : kStopSignals) sigaddset(&held, sig);
  ::pthread_sigmask(SIG_BLOCK, &held, before);
}

void remove_staged_files_on_signals() {
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, which StagedFile reports
  // and cleans up after, where SIGXFSZ's default action had ended the program with its .part file
  // left (the adversarial trial, forty-sixth session).
  if (struct sigaction now{}; ::sigaction(SIGXFSZ, nullptr, &now) == 0 && now.sa_handler == SIG_DFL)
    ::signal(SIGXFSZ, SIG_IGN);
  for (const int sig : kStopSignals) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) continue;  // ignored or handled: left so
    struct sigaction act {};
    act.sa_handler = remove_staged_then_end;
    act.sa_flags = SA_RESETHAND;
    sigemptyset(&act.sa_mask);
    ::sigaction(sig, &act, nullptr);
  }
}

void check_writable(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(Errc::invalid_argument, "cannot write {} (a folder is in the way)", path.string());
  StagedFile probe(path, std::string_view{});
}

}  // namespace metrale
