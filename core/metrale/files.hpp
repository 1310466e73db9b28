// Whole-file writes that never leave a truncated file, or half of a new one, where a file was:
// the bytes go to a file beside the target under a name of their own, which is then renamed or
// linked into place.
#pragma once

#include <signal.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <span>
#include <string_view>
#include <system_error>
#include <vector>

namespace metrale {

/// A file written beside `target` (same folder, named `<target>.part-<pid>-<n>`, or
/// `.metrale.part-<pid>-<n>` where that name would pass 255 bytes, so that two processes or
/// threads writing one target never share it) holding `bytes`, then put in place by
/// `commit` or `commit_new`; the destructor removes it when neither ran. A file it replaces keeps
/// its permission bits (the new file has them from the start); a new one has the umask's. Errors:
/// `invalid_argument` "cannot write <target> (<reason>)" when it cannot be created or written,
/// or when something other than a regular file is at the target (a symbolic link, a FIFO, a
/// device: the rename would replace it), or a file the user may not write (faccessat(2) W_OK, the effective IDs: the
/// rename needs only the folder's permission); `capacity_exceeded`, the same message, when the
/// disk is full, a quota is reached or the file passes the file-size limit (ENOSPC, EDQUOT,
/// EFBIG); nothing is then left behind.
class StagedFile {
 public:
  StagedFile(std::filesystem::path target, std::span<const std::byte> bytes);
  StagedFile(std::filesystem::path target, std::string_view text);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  /// Rename it over the target, replacing what is there in one step. Errors as the constructor.
  void commit();
  /// `commit` each of `files` in order, as one change: where one fails, the targets already
  /// replaced get back what they held (swapped with it in one step, Linux `RENAME_EXCHANGE`; a
  /// target that was not there is removed again), then the error is raised. On a file system
  /// without that swap, as `commit` one after the other. Errors as the constructor.
  static void commit_all(std::initializer_list<std::reference_wrapper<StagedFile>> files);
  /// Put it in place only if no file is at the target (a hard link, which fails rather than
  /// replace): false, and the target untouched, when one is. Errors as the constructor (also on a
  /// file system without hard links).
  bool commit_new();

 private:
  std::filesystem::path target_, staged_;
  bool done_ = false;
  int slot_ = -1;  // where the signal handler finds it (remove_staged_files_on_signals), or -1
};

/// For a program's main, before it starts threads: on SIGINT, SIGTERM, SIGHUP or SIGQUIT, remove
/// every file a StagedFile of this process has written and not yet put in place (its `.part` name;
/// at most 64 at once are known, as a program has; one created while the handler runs removes
/// itself), then end by the signal as before (its default action); and ignore SIGXFSZ, so that a
/// write past the file-size limit fails with EFBIG as an error of the write. A signal already
/// ignored or handled is left as it is. Errors: none.
void remove_staged_files_on_signals();

/// Hold back, in the calling thread, the signals remove_staged_files_on_signals handles (for a
/// worker thread, so that they go to the program's own threads); `before`, where given, receives
/// the thread's mask as it was (pthread_sigmask). Errors: none.
void hold_staged_file_signals(sigset_t* before = nullptr);

/// `StagedFile(path, bytes).commit()`: `path` then holds `bytes`, or, on an error, what it held.
void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes);

/// For an error about a path the user gave: " (relative to <working folder>)" where `path` is
/// relative (" (relative to a working folder that is gone)" where that cannot be read), else "".
/// Errors: none.
std::string relative_note(const std::filesystem::path& path);

/// The path that names `path`'s file when two paths are compared: `weakly_canonical`, or the
/// lexically normal path where that fails, so that `d/x`, `d/./x`, `e/../d/x` and a link to `d`
/// give one key. Errors: none.
std::filesystem::path file_key(const std::filesystem::path& path);

/// The files of folder `dir` (not its subfolders') whose names end in `.safetensors`, sorted: the
/// case files `case run` and `conform` take from a folder. Errors: none; a listing error is left
/// in `ec`, with the files found before it returned.
std::vector<std::filesystem::path> safetensors_in_folder(const std::filesystem::path& dir, std::error_code& ec);

/// Whether a file could be written at `path`: no folder there, and a staged file created beside
/// it and removed. Errors: `invalid_argument` "cannot write <path> (<reason>)" when not; nothing
/// is changed.
void check_writable(const std::filesystem::path& path);

}  // namespace metrale
