// metrale case run FILE...: kernel case files (SPEC §5) on a backend, compared with their expectations;
// metrale case show FILE...: what they hold.
#include <algorithm>
#include <filesystem>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends.hpp"
#include "commands.hpp"
#include "metrale/error.hpp"
#include "metrale/files.hpp"
#include "metrale/kernel_case.hpp"
#include "metrale/mla_fast.hpp"  // entry_unavailable

namespace metrale::cli {

namespace {

// The case files that `args` (files and folders of them) name, each once: a path that is not
// there, a folder without .safetensors files (its subfolders that hold some are named) and a
// folder that cannot be listed are errors naming `command`.
std::vector<std::filesystem::path> case_files(const std::vector<std::string>& args, const char* command) {
  // A path that is not there at all: said before anything runs (it had been a table row of an
  // empty name for "nosuch/": fresh-user trial, forty-fifth session).
  std::vector<std::string> missing;
  std::string note;  // where one of them is relative: the folder it is relative to
  for (const auto& f : args)
    if (std::error_code ec; std::filesystem::symlink_status(f, ec).type() == std::filesystem::file_type::not_found) {
      missing.push_back(printable(f));
      if (note.empty()) note = relative_note(f);
    }
  if (!missing.empty())
    fail(Errc::not_found, "case {}: {} {} not exist{}", command, fmt::join(missing, ", "),
         missing.size() == 1 ? "does" : "do", printable(note));
  std::vector<std::filesystem::path> files;
  for (const auto& f : args) {
    std::error_code ec;
    if (!std::filesystem::is_directory(f, ec)) {  // a file, or an error read_kernel_case names
      files.emplace_back(f);
      continue;
    }
    const std::vector<std::filesystem::path> in_folder = safetensors_in_folder(f, ec);
    if (ec) fail(Errc::invalid_argument, "cannot list folder {}: {}", f, ec.message());
    files.insert(files.end(), in_folder.begin(), in_folder.end());
    // A folder without cases would otherwise pass with nothing run. Its subfolders are not
    // searched; those that hold cases are named.
    if (in_folder.empty()) {
      std::vector<std::string> holders;
      for (std::filesystem::directory_iterator it(f, ec), end; !ec && it != end; it.increment(ec))
        if (std::error_code sub_ec; it->is_directory(sub_ec) && !safetensors_in_folder(it->path(), sub_ec).empty())
          holders.push_back(it->path().string());
      fail(Errc::not_found, "folder {} holds no .safetensors case files{}", f,
           holders.empty()
               ? std::string()
               : fmt::format(" (subfolders are not searched; these hold some: {})", fmt::join(holders, ", ")));
    }
  }
  // A file named twice (or in a folder named too) runs once: the summary counts files. Each
  // file's canonical path is found once, then the (path, file) pairs sorted and made unique.
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> keyed;
  for (auto& f : files) keyed.emplace_back(file_key(f), std::move(f));
  std::sort(keyed.begin(), keyed.end());
  keyed.erase(std::unique(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
              keyed.end());
  files.clear();
  for (auto& [key, f] : keyed) files.push_back(std::move(f));
  return files;
}

}  // namespace

void add_case(CLI::App& app, std::function<void(int)> set_exit) {
  struct Opts {
    std::vector<std::string> files;
    std::string backend;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("case", "kernel case files");
  cmd->require_subcommand(1);
  auto* run = cmd->add_subcommand("run", "run kernel case files on a backend and compare with their expectations");
  run->add_option("FILE", opts->files, "kernel case files (.safetensors) or folders of them")
      ->required()
      ->check(non_empty_path());
  run->add_option("--backend", opts->backend, "emu, cuda or auto (default: METRALE_BACKEND, else auto)")
      ->check(backend_name());
  // What a case holds, without running it (the fresh-user trial, forty-eighth session: reading a
  // case file took a script of one's own).
  auto* show = cmd->add_subcommand("show", "print what kernel case files hold: kernel, launch, scalars, tensors");
  show->add_option("FILE", opts->files, "kernel case files (.safetensors) or folders of them")
      ->required()
      ->check(non_empty_path());
  show->callback([opts, set_exit] {
    int errors = 0;
    const auto files = case_files(opts->files, "show");
    for (const auto& path : files) {
      fmt::print("{}{}\n", &path == files.data() ? "" : "\n", printable(path.string()));
      try {
        // (its header and tolerances: the rest is not shown, so not read)
        fmt::print("{}", describe_kernel_case(read_kernel_case_header(path)));
      } catch (const Error&) {
        ++errors;
        fmt::print("{}\n", error_line());
      } catch (const std::bad_alloc&) {  // the next file may still fit
        ++errors;
        fmt::print("{}\n", error_line());
      }
    }
    set_exit(errors == 0 ? 0 : 2);
  });
  run->callback([opts, set_exit] {
    std::vector<std::filesystem::path> files = case_files(opts->files, "run");
    auto gpu = make_backend(opts->backend);
    // Rows are labelled by file, its stem (two formats' recordings of one launch share the case's
    // name); a file name cannot fake a row.
    fmt::print("{:<56} {:<20} {:>11} {:>9}  {}\n", "case file", "output", "max_abs", "bad", "result");
    int failed = 0, errors = 0, skipped = 0, unchecked = 0, compared = 0;
    const auto label_of = [](const std::filesystem::path& path) { return printable(path.stem().string()); };
    const auto error_row = [&](const std::filesystem::path& path) {  // inside a catch block
      ++errors;
      fmt::print("{:<56} {:<20} {:>11} {:>9}  {}\n", label_of(path), "-", "-", "-", error_line());
    };
    std::size_t ran = files.size();
    for (const auto& path : files) {
      try {  // a file that cannot be read or run is reported, and the others still run
        const std::string label = label_of(path);
        // mla_wgmma off sm_90, too little shared memory: said from the header, the data unread
        if (const auto why = case_unavailable(*gpu, read_kernel_case_header(path))) {
          fmt::print("{:<56} {:<20} {:>11} {:>9}  skipped: {}\n", label, "-", "-", "-", *why);
          ++skipped;
          continue;
        }
        const KernelCase c = read_kernel_case(SafeTensors::read(path), path);  // (its header checked above)
        const auto out = run_kernel_case(*gpu, c);
        if (c.expected.empty()) {
          fmt::print("{:<56} {:<20} {:>11} {:>9}  {}\n", label, "-", "-", "-", "ran (no expectation)");
          ++unchecked;
        }
        for (const auto& [param, want] : c.expected) {
          const auto tol = expected_tolerance(c, param, want);
          const auto r = check_output(param, out.at(param), want, tol);
          fmt::print("{:<56} {:<20} {:>11.3e} {:>9}  {}\n", label, param, r.max_abs,
                     fmt::format("{}/{}", r.bad, r.count), r.pass ? "ok" : "FAIL " + r.worst);
          failed += r.pass ? 0 : 1;
          ++compared;
        }
      } catch (const Error&) {
        error_row(path);
      } catch (const std::bad_alloc&) {  // running it (its buffers): the next file may still fit
        error_row(path);
      }
      // A recording stopped at its limit (--record-limit) stops the run: every later file would
      // fail alike (the fresh-user trial, forty-sixth session: conform went on).
      if (recording_stopped(*gpu)) {
        ran = static_cast<std::size_t>(&path - files.data()) + 1;
        fmt::print("(the recording stopped: {} of the {} files not run)\n", files.size() - ran, files.size());
        break;
      }
    }
    files.resize(ran);  // the summary counts the files that ran
    // A PASS says nothing of the files that ran without an expectation: the line counts them.
    std::vector<std::string> notes;
    if (skipped > 0) notes.push_back(fmt::format("{} skipped: the device cannot run them", skipped));
    if (unchecked > 0) notes.push_back(fmt::format("{} ran with no expectation to check", unchecked));
    // Every file skipped, or run with nothing to compare, checks nothing: not a PASS (a folder
    // with one file compared is one).
    const bool none_ran = skipped > 0 && static_cast<std::size_t>(skipped) == files.size();
    const bool none_compared = !none_ran && compared == 0 && errors == 0;
    fmt::print("\n{} file{} on {}{}: {}\n", files.size(), files.size() == 1 ? "" : "s", gpu->name(),
               notes.empty() ? std::string() : fmt::format(" ({})", fmt::join(notes, "; ")),
               none_ran || none_compared ? std::string("NOTHING CHECKED")
               : failed == 0 && errors == 0
                   ? std::string("PASS")
                   : fmt::format("FAIL: {} output{} out of tolerance, {} file{} in error", failed,
                                 failed == 1 ? "" : "s", errors, errors == 1 ? "" : "s"));
    if (errors > 0) {
      set_exit(2);  // an error outranks a comparison out of tolerance
      return;
    }
    if (none_ran)
      fail(Errc::unsupported, "case run: the device ({}) cannot run {}: nothing was checked", gpu->name(),
           files.size() == 1 ? std::string("the one file") : fmt::format("any of the {} files", files.size()));
    if (none_compared)
      fail(Errc::invalid_argument,
           "case run: {} expected.<output> tensor, so no output was compared{} (a case file holds one for "
           "each output it checks; --record writes them)",
           files.size() - skipped == 1 ? std::string("the file run has no")
                                       : std::string("none of the files run has an"),
           gpu->name() == "emu" ? "; the emulator's memory checks passed" : "");
    set_exit(failed == 0 ? 0 : 1);
  });
}

}  // namespace metrale::cli
