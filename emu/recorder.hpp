// The emulator's recorder (SPEC §2): each launch written as a kernel case file
// (SPEC §5) — its arguments, the bytes its pointer arguments held before it ran
// and, for its outputs, what they held after as the expectation — so a run
// without a GPU can be replayed on hardware and compared.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "metrale/emu/port.hpp"
#include "metrale/kernel_case.hpp"

namespace metrale::emu {

class CaseRecorder {
 public:
  /// Records into `dir`, at most `limit_bytes` of case files in all (a recording grows with
  /// every launch: a long replay's can fill a disk). Errors: `invalid_argument` when `dir`
  /// cannot be created, is not a folder or cannot be listed to number its cases (names it; the
  /// folders made by then are removed).
  CaseRecorder(std::filesystem::path dir, std::uint64_t limit_bytes);
  /// Says how many cases it wrote, and where (a warning when none). The folders it made for
  /// `dir` that are empty are removed, deepest first: all of them when it wrote nothing. (Two runs
  /// recording into the same new folder each remove only what they made, so an empty folder the
  /// one made may stay where the other's was still inside it.)
  ~CaseRecorder();
  CaseRecorder(const CaseRecorder&) = delete;
  CaseRecorder& operator=(const CaseRecorder&) = delete;

  /// Snapshot a launch before it runs. A pointer argument records the bytes
  /// from its address to the end of its allocation, typed by the port's
  /// declared element type; null or unmapped pointers record nothing. Errors:
  /// `capacity_exceeded` when the case could take the files written past the limit (its
  /// inputs, and its expectations at most as large): the launch then does not run, and the
  /// cases written so far stay. From then on the recording has stopped: every later launch is
  /// refused too (a smaller one would fit, and leave a gap in the recorded sequence); so it has
  /// once a case could not be written (after()'s errors).
  KernelCase before(const Registry::Entry& e, Dim3 grid, Dim3 block, std::span<const KernelArg> args,
                    const detail::AddressSpace& memory);
  /// Whether the recording stopped: a launch refused for the limit, or a case not written.
  bool stopped() const { return !stopped_.empty(); }
  /// After it ran: the outputs (the port's writable pointers, changed or not) and any other
  /// buffer it changed become `expected.<param>` with the
  /// same-arithmetic tolerance; the case is written as NNNN_<entry>.safetensors, numbered on
  /// from the highest number already in the folder (a later run overwrites no case), past any
  /// number another recorder of the folder took meanwhile (no case is ever replaced).
  void after(KernelCase c, std::span<const KernelArg> args, const Registry::Entry& e,
             const detail::AddressSpace& memory);

  /// The cases this recorder wrote.
  std::uint64_t written() const { return written_; }

 private:
  /// Make dir_, noting in made_ the folders it creates (errors as the constructor's).
  void make_folder();
  /// Remove the folders in made_ that are real, empty folders, deepest first; true when any was.
  bool remove_made();
  /// SafeTensors::write_new into dir_, made again where another run removed it.
  bool write_new(const SafeTensors& file, const std::filesystem::path& path) const;
  std::filesystem::path dir_;
  std::vector<std::filesystem::path> made_;  // the folders the constructor made for dir_, outermost first
  std::uint64_t next_ = 0;  // the next case's number
  std::string highest_;     // the highest number taken, as its file names it (it may pass 64 bits)
  std::uint64_t written_ = 0;
  std::string stopped_;  // why the recording stopped ("at its limit of ..."), or empty
  std::uint64_t limit_bytes_;
  std::uintmax_t bytes_ = 0;  // the written files' sizes, for the closing note and the limit
};

}  // namespace metrale::emu
