// metrale conform: the conformance set on a backend — every kernel over the generated sweep
// (against the float64 reference and against the emulator running the same case), recorded
// kernel case files, and the golden model replays — with report.json and report.md.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "commands.hpp"
#include "metrale/case_gen.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/error.hpp"
#include "metrale/files.hpp"
#include "metrale/kernel_case.hpp"
#include "metrale/mla_fast.hpp"
#include "metrale/model_case.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct Check {
  std::string output, against;  // "reference", "emulator", "file", or a golden tensor
  double max_abs = 0, max_rel = 0, tolerance = 0;
  double used = 0;  // the worst error as a fraction of its tolerance (OutputCheck::tolerance_used)
  std::size_t bad = 0, count = 0;
  std::string worst;
  bool pass = false;
};

struct CaseResult {
  std::string group, kernel, name;
  std::vector<Check> checks;
  std::string error;    // the exception, when the case could not run: "error (<code>): <message>"
  std::string message;  // its message alone
  std::vector<std::string> notes;  // what a golden replay found in its values (ReplayResult::notes)
  bool pass() const {
    return error.empty() && std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.pass; });
  }
};

// Whether two files hold the same bytes. `invalid_argument` naming a file that cannot be read
// (the adversarial trial, forty-fifth session: an unreadable copy was said to differ).
bool same_bytes(const fs::path& a, const fs::path& b) {
  const auto unreadable = [](const fs::path& p, const std::string& why) {
    fail(Errc::invalid_argument, "conform: cannot read golden case {} ({})", printable(p.string()), why);
  };
  const auto size = [&](const fs::path& p) {
    std::error_code ec;
    const auto n = fs::file_size(p, ec);
    if (ec) unreadable(p, ec.message());
    return n;
  };
  if (size(a) != size(b)) return false;
  std::ifstream in_a(a, std::ios::binary), in_b(b, std::ios::binary);
  for (const auto& [in, p] : {std::pair{&in_a, &a}, std::pair{&in_b, &b}})
    if (!*in) unreadable(*p, std::strerror(errno));
  std::vector<char> buf_a(1 << 20), buf_b(1 << 20);
  while (in_a && in_b) {
    in_a.read(buf_a.data(), static_cast<std::streamsize>(buf_a.size()));
    in_b.read(buf_b.data(), static_cast<std::streamsize>(buf_b.size()));
    for (const auto& [in, p] : {std::pair{&in_a, &a}, std::pair{&in_b, &b}})
      if (in->bad()) unreadable(*p, std::strerror(errno));
    if (in_a.gcount() != in_b.gcount() || !std::equal(buf_a.begin(), buf_a.begin() + in_a.gcount(), buf_b.begin()))
      return false;
  }
  return in_a.eof() && in_b.eof();
}

Check to_check(const OutputCheck& r, std::string against) {
  return {r.output, std::move(against), r.max_abs, r.max_rel, 0, r.tolerance_used, r.bad, r.count, r.worst, r.pass};
}

// The .safetensors files of `dir`. A folder that does not exist or holds none is an error when
// the user named it, and a warning for the defaults (default_folder), added to `missing` for the
// summary line. One it cannot read (a loop of links) is an error.
std::vector<fs::path> safetensors_in(const fs::path& dir, bool named, std::vector<std::string>& missing) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec && status.type() != fs::file_type::not_found)  // a loop of links, a folder it may not read
    fail(Errc::invalid_argument, "conform: cannot read folder {}: {}", dir.string(), ec.message());
  if (!fs::is_directory(status)) {
    const char* what = fs::exists(status) ? "not a folder:" : "no folder";
    if (named) fail(Errc::not_found, "conform: {} {}{}", what, dir.string(), relative_note(dir));
    fmt::print(stderr, "warning: conform: {} {}{}, skipped\n", what, dir.string(), relative_note(dir));
    missing.push_back(dir.string());
    return {};
  }
  std::vector<fs::path> out = safetensors_in_folder(dir, ec);
  if (ec) fail(Errc::invalid_argument, "conform: cannot list folder {}: {}", dir.string(), ec.message());
  if (out.empty() && named) fail(Errc::not_found, "conform: no .safetensors files in {}", dir.string());
  if (out.empty()) {  // a default folder: said as a missing one is
    fmt::print(stderr, "warning: conform: no .safetensors files in {}, skipped\n", dir.string());
    missing.push_back(dir.string());
  }
  return out;
}

// A default folder (`relative`, e.g. cases/kernels): in the working folder when anything is there
// under that name (safetensors_in then says what is wrong with it: a file, a loop of links, no
// case files), else in the source tree this metrale was built from (a run from another folder,
// said in a note; `from_source_tree` set), else `relative` as it is (then reported missing).
std::string default_folder(const std::string& relative, bool& from_source_tree) {
  from_source_tree = false;
  std::error_code ec;
  if (fs::symlink_status(relative, ec).type() != fs::file_type::not_found ||
      (ec && ec != std::errc::no_such_file_or_directory))
    return relative;
  const fs::path built = fs::path(METRALE_SOURCE_DIR) / relative;
  if (!fs::is_directory(built, ec)) return relative;
  fmt::print(stderr, "note: conform: no folder {} here; taking {} (the source tree metrale was built from)\n", relative,
             built.string());
  from_source_tree = true;
  return built.string();
}

// Run `body` into a result; an error is the case's failure, not the run's.
template <class F>
CaseResult guarded(std::string group, std::string kernel, std::string name, F&& body) {
  CaseResult r{std::move(group), std::move(kernel), std::move(name), {}, "", "", {}};
  try {
    body(r);
  } catch (const std::exception& e) {
    r.error = error_line();
    r.message = dynamic_cast<const Error*>(&e) != nullptr ? e.what() : r.error;
  }
  return r;
}

CaseResult sweep_case(GpuBackend& gpu, emu::EmulatorBackend& emu, const KernelCase& c) {
  return guarded("sweep", c.entry, c.name, [&](CaseResult& r) {
    const auto out = run_kernel_case(gpu, c);
    const auto emu_out = run_kernel_case(emu, c);
    for (const auto& [param, want] : c.expected) {
      r.checks.push_back(to_check(check_output(param, out.at(param), want, c.tolerance.at(param)), "reference"));
      const auto& e = emu_out.at(param);
      r.checks.push_back(to_check(check_output(param, out.at(param), e, backend_tolerance(c, param, e)), "emulator"));
    }
  });
}

// A recorded case file, or nothing: when `wanted(entry, file name)` does not pick it (a file whose
// case cannot be built is picked by the entry its metadata names; one that cannot be read as
// safetensors at all, whose entry is unknown, always runs, as a failure; a recorded step over one
// latent pool, v_cache an alias of k_cache, is also picked by "latent", as the sweep's latent cases
// are), and, with a note and `skipped` counted, when the device cannot run its entry.
template <class Wanted>
std::optional<CaseResult> file_case(GpuBackend& gpu, const fs::path& path, const Wanted& wanted, std::size_t& skipped) {
  std::optional<std::string> skip;
  bool unwanted = false, model_case = false;
  // (its kernel "unreadable file" until the file names one: the summary had a blank row)
  constexpr const char* kUnread = "unreadable file";
  CaseResult result = guarded("file", kUnread, printable(path.filename().string()), [&](CaseResult& r) {
    // The header first: a file --only does not pick, or the device cannot run, is not read
    // (adversarial trial, fiftieth session: --only rope_pairs read a 2.1 GB case file whole).
    const SafeTensors header = SafeTensors::read_header(path, is_tolerance_tensor);  // its errors name the file
    r.kernel = header.metadata.count("entry") != 0 ? excerpt(header.meta("entry")) : "kernel case file";
    if ((model_case = is_model_case(header)))  // (read_kernel_case would say "run it with metrale replay")
      fail(Errc::invalid_argument, "{}: a model case, not a kernel case: conform replays those from --golden DIR",
           path.string());
    const KernelCase described = read_kernel_case(header, path);  // (read_kernel_case_header's checks)
    const auto alias = described.aliases.find("v_cache");
    const bool latent = alias != described.aliases.end() && alias->second == "k_cache";
    if ((unwanted = !wanted(described.entry, latent ? r.name + " latent" : r.name))) return;
    if ((skip = case_unavailable(gpu, described))) return;
    // (the header checked above; the file's tensors only in the case: 3x its size in all)
    const KernelCase c = read_kernel_case(SafeTensors::read(path), path);
    const auto out = run_kernel_case(gpu, c);
    if (c.expected.empty())  // nothing compared is no pass (it had counted as one)
      fail(Errc::invalid_argument, "{}: no expected.<output> tensor, so nothing to compare{}", path.string(),
           gpu.name() == "emu" ? " (it ran, and the emulator's memory checks passed)" : " (it ran)");
    for (const auto& [param, want] : c.expected) {
      const auto tol = expected_tolerance(c, param, want);
      r.checks.push_back(to_check(check_output(param, out.at(param), want, tol), "file"));
    }
  });
  // A model case among the case files fails whatever --only picks: a --golden folder given as
  // --cases (the fresh-user trial, forty-sixth session: under --only it passed without a word, as a
  // --cases folder given as --golden does not).
  if (unwanted || (!result.pass() && !model_case && result.kernel != kUnread && !wanted(result.kernel, result.name)))
    return std::nullopt;
  if (!skip) return result;
  fmt::print(stderr, "note: conform: {} skipped ({})\n", printable(path.filename().string()), *skip);
  ++skipped;
  return std::nullopt;
}

// A replay metric's rel_l2 as a fraction of its tolerance (infinite where it fails for a
// non-finite value, as OutputCheck::tolerance_used).
double tolerance_used(const CaseMetric& m) {
  if (!std::isfinite(m.rel_l2) || !std::isfinite(m.max_abs)) return std::numeric_limits<double>::infinity();
  return m.tolerance > 0 ? m.rel_l2 / m.tolerance : m.rel_l2 > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

// A replay's metrics as checks: max_rel carries the replay's rel_l2.
// A golden replay's one figure per tensor is its rel_l2 against the tolerance: the "worst" of a
// failed check says so (the fresh-user trial, forty-sixth session: it was empty).
void add_metrics(CaseResult& r, const ReplayResult& replay) {
  for (const auto& m : replay.metrics)
    r.checks.push_back({m.name, "golden", m.max_abs, m.rel_l2, m.tolerance, tolerance_used(m), m.pass ? 0u : 1u, 1,
                        m.pass ? ""
                        : std::isfinite(m.rel_l2)
                            ? fmt::format("rel_l2 {:.3e} > tolerance {:.3e}", m.rel_l2, m.tolerance)
                            : fmt::format("rel_l2 {} (tolerance {:.3e})", m.rel_l2, m.tolerance),
                        m.pass});
  r.notes = replay.notes;
}

// One replay of a golden file: its kernel and name for --only (they follow from the file's name,
// so a file that cannot be read is still matched by them), and the run.
struct GoldenReplay {
  std::string kernel, name;
  std::function<ReplayResult(const SafeTensors&)> run;
};

// Every golden file's replays: both formats at three block sizes over a K and a V pool, and at 16
// over one latent pool, through the DeepSeek step; and the K3 decode on both KV paths.
std::vector<GoldenReplay> golden_replays(GpuBackend& gpu, const std::string& name) {
  std::vector<GoldenReplay> out;
  for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4})
    for (const auto& [bs, latent] : {std::pair{1u, false}, {16u, false}, {64u, false}, {16u, true}})
      out.push_back({"deepseek decode step",
                     fmt::format("{} {} block {}{}", name, to_string(f), bs, latent ? " latent" : ""),
                     [&gpu, name, f, bs, latent](const SafeTensors& file) {
                       return replay_deepseek_case(gpu, file, name, {f, bs, latent});
                     }});
  for (bool device_path : {true, false})
    out.push_back({"kimi k3 decode", fmt::format("{} {} KV", name, device_path ? "device" : "host"),
                   [&gpu, name, device_path](const SafeTensors& file) {
                     return replay_kimi_case(gpu, file, name, device_path);
                   }});
  return out;
}

// The replays of one golden file that `wanted(kernel, name)` picks. A file that cannot be read is
// one failed case where --only picks it (kernel "model case file" or its name) or any replay it
// would have had. `only` is --only's text; `model_case` is set when the file is a model case or
// could not be read (it may be one).
template <class Wanted>
std::vector<CaseResult> golden_cases(GpuBackend& gpu, const fs::path& path, const Wanted& wanted, std::string_view only,
                                     bool& model_case, bool& format_tables, const std::function<bool()>& stopped) {
  std::vector<CaseResult> out;
  const std::string name = printable(path.stem().string());
  const auto replays = golden_replays(gpu, name);
  SafeTensors file;  // its header, then (where a replay is picked) the whole file
  CaseResult read =
      guarded("golden", "model case file", name, [&](CaseResult&) { file = SafeTensors::read_header(path); });
  model_case = !read.pass() || is_model_case(file);
  format_tables = read.pass() && !model_case && is_format_tables(file);
  if (!read.pass()) {  // a file that cannot be read fails as one case; the others still run
    // (its replays' names too: one of them picked and left unchecked would pass unseen)
    if (wanted(read.kernel, read.name) ||
        std::any_of(replays.begin(), replays.end(), [&](const auto& g) { return wanted(g.kernel, g.name); }))
      out.push_back(std::move(read));
    return out;
  }
  if (!model_case) {               // said where --only would have picked the file (its name), else noise
    if (format_tables) {           // said only when named
      if (!only.empty() && name.find(only) != std::string::npos)
        fmt::print(stderr,
                   "note: conform: {} is the number-format tables (the formats tests read them), not a model "
                   "case, skipped\n",
                   printable(path.string()));
    } else if (wanted("model case file", name)) {
      fmt::print(stderr, "note: conform: {} is not a model case (no q_nope tensor or heads metadata), skipped\n",
                 printable(path.string()));
    }
    return out;
  }
  // The data, only where a replay is picked (adversarial trial, fiftieth session: --only rope_pairs
  // read a 2.5 GB golden file whole).
  if (std::none_of(replays.begin(), replays.end(), [&](const auto& g) { return wanted(g.kernel, g.name); })) return out;
  read = guarded("golden", "model case file", name, [&](CaseResult&) {
    with_context(path.string(), [&] { check_model_case_header(file); });  // its metadata and shapes, unread
    file = SafeTensors::read(path, SafeTensors::Use::model_case);
  });
  if (!read.pass()) {
    out.push_back(std::move(read));
    return out;
  }
  for (const auto& g : replays)
    if (wanted(g.kernel, g.name)) {
      out.push_back(guarded("golden", g.kernel, g.name, [&](CaseResult& r) { add_metrics(r, g.run(file)); }));
      if (stopped()) break;  // (the run stops: the later replays would fail alike)
    }
  return out;
}

// The device a run ran on, or the emulator played (its compute capability, SMs and shared memory
// decide which entries and plans ran).
ordered_json device_json(GpuBackend& gpu) {
  ordered_json d{{"backend", gpu.name()}};
#ifdef METRALE_WITH_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&gpu)) {
    d["device"] = cuda->device_name();
    d["driver_version"] = cuda->driver_version();
    d["toolkit_version"] = CudaBackend::toolkit_version();
  }
#endif
  d["compute_capability"] = gpu.compute_capability();
  d["multiprocessors"] = gpu.multiprocessor_count();
  d["max_shared_bytes_per_block"] = gpu.max_shared_bytes_per_block();
  return d;
}

// What a run was asked for, and what it left out, for the reports.
struct RunInfo {
  std::uint64_t seed = 0;
  std::string only;  // --only ("" = every case)
  std::vector<std::string> case_folders, golden_folders, missing;
  std::size_t skipped = 0;  // cases the device cannot run
  std::string stopped;      // why the run stopped before its end (a recording's limit), or empty
};

void write_reports(const fs::path& dir, const ordered_json& device, const RunInfo& run,
                   const std::vector<CaseResult>& results, double seconds) {
  fs::create_directories(dir);
  ordered_json cases = ordered_json::array();
  for (const auto& r : results) {
    ordered_json checks = ordered_json::array();
    for (const auto& c : r.checks)
      checks.push_back({{"output", c.output},
                        {"against", c.against},
                        {"max_abs", c.max_abs},
                        {"max_rel", c.max_rel},
                        {"tolerance_used", c.used},
                        {"bad", c.bad},
                        {"count", c.count},
                        {"worst", c.worst},
                        {"pass", c.pass}});
    cases.push_back({{"group", r.group},
                     {"kernel", r.kernel},
                     {"name", r.name},
                     {"pass", r.pass()},
                     {"error", r.error},
                     {"notes", r.notes},
                     {"checks", checks}});
  }
  const auto failed = std::count_if(results.begin(), results.end(), [](const CaseResult& r) { return !r.pass(); });
  const ordered_json report{{"device", device},
                            {"seed", run.seed},
                            {"only", run.only},
                            {"case_folders", run.case_folders},
                            {"golden_folders", run.golden_folders},
                            {"folders_not_found", run.missing},
                            {"cases_run", results.size()},
                            {"cases_failed", failed},
                            {"cases_skipped", run.skipped},
                            {"stopped", run.stopped.empty() ? ordered_json(nullptr) : ordered_json(run.stopped)},
                            {"seconds", seconds},
                            {"pass", failed == 0 && run.stopped.empty()},
                            {"cases", cases}};
  // (A case file's name need not be UTF-8: printable() wrote such bytes as \xNN; any other text
  // that is not UTF-8 would be written as U+FFFD.)
  const std::string json_text = report.dump(2, ' ', false, ordered_json::error_handler_t::replace) + '\n';

  // report.md: one row per (group, kernel) with the check that came nearest its tolerance (the
  // largest fraction used; at most 1 passes), its output and its largest error beside that
  // fraction: a large absolute error of a large output may be well inside its tolerance.
  struct Nearest {
    std::string output;  // empty: no check yet
    double abs = 0, used = 0;
  };
  struct Row {
    std::size_t cases = 0, failed = 0;
    Nearest vs_ref, vs_emu;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;
  for (const auto& r : results) {
    Row& row = rows[{r.group, r.kernel}];
    ++row.cases;
    row.failed += r.pass() ? 0 : 1;
    for (const auto& c : r.checks) {
      Nearest& slot = c.against == "emulator" ? row.vs_emu : row.vs_ref;
      const bool nearer = slot.output.empty() || std::isnan(c.used) || (!std::isnan(slot.used) && c.used > slot.used);
      if (nearer) slot = {c.output, c.max_abs, c.used};  // NaN shown, not hidden
    }
  }
  std::ostringstream md;
  md << "# Conformance report\n\n";
  for (const auto& [k, v] : device.items())
    md << "- " << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  md << fmt::format("- seed: {}\n", run.seed);
  if (!run.only.empty()) md << fmt::format("- only: cases whose kernel or name holds '{}'\n", run.only);
  const auto folders = [](const std::vector<std::string>& v) {
    return v.empty() ? "none" : fmt::format("{}", fmt::join(v, ", "));
  };
  md << fmt::format("- case folders: {}\n- golden folders: {}\n", folders(run.case_folders),
                    folders(run.golden_folders));
  if (!run.missing.empty())
    md << fmt::format("- default folders not found or empty: {}\n", fmt::join(run.missing, ", "));
  md << fmt::format("- cases: {} run, {} failed, {} skipped (the device cannot run them), {:.1f} s\n", results.size(),
                    failed, run.skipped, seconds);
  if (!run.stopped.empty()) md << fmt::format("- stopped before its end: {}\n", run.stopped);
  md << "\n";
  // What the columns mean, where the report is read without docs/conformance.md.
  md << "Each row names the check of that kernel's cases that came nearest its tolerance, and beside it "
        "that check's largest error and the fraction of its tolerance it used (at most 1 passes). For a "
        "kernel or case-file check that fraction is the worst element's: its error over the error it was "
        "allowed (absolute plus relative to the expected value, or within the ULPs where those are given), "
        "so a large error of a large value can use little of it. For a golden replay (group golden) it is "
        "the output's relative L2 error over its tolerance. The emulator columns (group sweep) compare "
        "the backend's output with the emulator's port of the same kernel: on `--backend emu` that is "
        "the emulator against itself, always 0.\n\n";
  md << "| group | kernel | cases | failed | nearest its tolerance vs reference/golden/file | its max abs error | "
        "of its tolerance | nearest vs emulator | its max abs diff | of its tolerance |\n";
  md << "|---|---|---|---|---|---|---|---|---|---|\n";
  const auto cells = [](const Nearest& n) {
    return n.output.empty() ? std::string{"- | - | -"} : fmt::format("{} | {:.3e} | {:.3g}", n.output, n.abs, n.used);
  };
  for (const auto& [k, row] : rows)
    md << fmt::format("| {} | {} | {} | {} | {} | {} |\n", k.first, k.second, row.cases, row.failed, cells(row.vs_ref),
                      cells(row.vs_emu));
  for (const auto& r : results) {
    if (r.pass() && r.notes.empty()) continue;
    md << "\n## " << (r.pass() ? "Note on " : "FAIL ") << r.name << "\n\n";
    if (!r.error.empty()) md << r.error << "\n";  // "error (<code>): <message>"
    for (const auto& c : r.checks)
      if (!c.pass)
        md << fmt::format("- {} vs {}: {} of {} bad, worst {}\n", c.output, c.against, c.bad, c.count, c.worst);
    for (const auto& note : r.notes) md << "- note: " << note << "\n";
  }
  // Both files staged, then put in place as one change (StagedFile::commit_all): an error (a full
  // disk, a folder in the way, a file that cannot be replaced) leaves the old pair as it was,
  // where the file system can swap files (Linux's local ones), and names the file.
  with_context("conform --report", [&] {
    StagedFile json(dir / "report.json", json_text), markdown(dir / "report.md", md.str());
    StagedFile::commit_all({json, markdown});
  });
}

}  // namespace

void add_conform(CLI::App& app, std::function<void(int)> set_exit) {
  struct Opts {
    std::string backend, report;
    std::vector<std::string> case_dirs, golden_dirs;
    std::string only;
    std::uint64_t seed = 1;
    bool no_golden = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("conform", "the conformance set on a backend, against the emulator and the reference");
  cmd->add_option("--backend", opts->backend,
                  "backend under test: emu, cuda or auto (default: METRALE_BACKEND, else auto)")
      ->check(backend_name());
  cmd->add_option("--report", opts->report, "write report.json and report.md into DIR")
      ->option_text("DIR")
      ->check(non_empty_path());
  cmd->add_option("--cases", opts->case_dirs, "folders of recorded kernel case files (default cases/kernels)")
      ->option_text("DIR ...")
      ->check(non_empty_path());
  auto* golden = cmd->add_option("--golden", opts->golden_dirs,
                                 "folders of golden model cases (default cases/golden, and METRALE_GOLDEN_DIR)")
                     ->option_text("DIR ...")
                     ->check(non_empty_path());
  cmd->add_option("--seed", opts->seed, "seed of the generated sweep")->transform(uint64_text())->capture_default_str();
  cmd->add_flag("--no-golden", opts->no_golden, "skip the golden replays (e.g. under compute-sanitizer)")
      ->excludes(golden);
  cmd->add_option("--only", opts->only,
                  "run only the cases whose kernel or name contains this text (sweep, recorded files and golden "
                  "replays alike, case-sensitive; e.g. an entry such as wgmma16, or a case file's name)")
      ->option_text("TEXT")
      ->check(non_empty_filter());
  cmd->callback([opts, set_exit] {
    const auto t0 = std::chrono::steady_clock::now();
    // The report's folders this run creates: removed again (while empty) if it ends without a report.
    struct MadeFolders {
      fs::path leaf, root;  // root: the outermost folder that did not exist
      bool keep = false;
      ~MadeFolders() {
        if (keep || root.empty()) return;
        std::error_code ec;
        for (fs::path p = leaf; !p.empty() && fs::remove(p, ec); p = p.parent_path())
          if (p == root) {  // (its creation was logged)
            spdlog::info("conform --report: removed {} again, as no report was written", printable(root.string()));
            break;
          }
      }
    } made;
    if (!opts->report.empty()) {  // before the run: a report that cannot be written fails first
      std::error_code ec;
      // Links resolved first, as the system does: "lnk/../R" is R beside lnk's target, not beside lnk
      // (the parts that do not exist yet are normalised as text).
      made.leaf = fs::absolute(opts->report, ec);
      if (!ec) made.leaf = fs::weakly_canonical(made.leaf, ec);
      if (made.leaf.filename().empty()) made.leaf = made.leaf.parent_path();  // "DIR/"
      for (fs::path p = made.leaf; !ec && !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
        made.root = p;
        if (p == p.parent_path()) break;
      }
      // The folder the cleanup measures: "R/x/../y" must not create R/x.
      fs::create_directories(made.leaf, ec);
      if (ec || !fs::is_directory(made.leaf))
        fail(Errc::invalid_argument, "conform --report {}: not a folder that can be created ({})", opts->report,
             ec ? ec.message() : "a file is in the way");
      if (!made.root.empty())  // (a mistyped parent would otherwise be made without a word)
        spdlog::info("conform --report: created {}", printable(made.root.string()));
      with_context("conform --report", [&] {
        for (const char* name : {"report.json", "report.md"}) check_writable(made.leaf / name);
      });
    }
    auto gpu = make_backend(opts->backend);
    emu::EmulatorBackend emu;
    std::vector<CaseResult> results;
    std::size_t skipped = 0;           // cases the device cannot run
    std::vector<std::string> missing;  // default folders not found or empty
    // The folders listed first: a named one that is missing or empty fails before the sweep runs.
    // METRALE_GOLDEN_DIR counts as named: a folder the user set that is missing is an error.
    const bool named_cases = !opts->case_dirs.empty(), named_golden = !opts->golden_dirs.empty();
    bool from_source_tree = false;
    const auto case_dirs =
        named_cases ? opts->case_dirs : std::vector<std::string>{default_folder("cases/kernels", from_source_tree)};
    // folder, named, and the variable that named it (its errors say so); a file name's first folder runs
    std::vector<std::tuple<std::string, bool, const char*>> golden_dirs;
    if (named_golden) {
      for (const auto& d : opts->golden_dirs) golden_dirs.emplace_back(d, true, nullptr);
    } else if (!opts->no_golden) {
      golden_dirs.emplace_back(default_folder("cases/golden", from_source_tree), false, nullptr);
      // METRALE_GOLDEN_DIR after the working folder's cases/golden, but before the source tree's:
      // a folder the user set wins over one they did not name
      if (const char* env = std::getenv("METRALE_GOLDEN_DIR"); env != nullptr && *env != '\0')
        golden_dirs.emplace(from_source_tree ? golden_dirs.begin() : golden_dirs.end(), env, true,
                            "METRALE_GOLDEN_DIR");
    }
    std::vector<fs::path> case_files;
    std::vector<std::pair<fs::path, std::size_t>> golden_files;  // and the index of its folder
    std::set<fs::path> case_seen;  // a folder named twice (or a file reached twice) runs once
    // The report's own folder is no case, wherever it is (adversarial trial, fiftieth session:
    // --report cases/r.safetensors failed the run on its own output, and every later run too).
    if (!opts->report.empty()) case_seen.insert(file_key(opts->report));
    for (const auto& dir : case_dirs)
      for (auto& f : safetensors_in(dir, named_cases, missing))
        if (case_seen.insert(file_key(f)).second) case_files.push_back(std::move(f));
    std::map<std::string, fs::path> seen;  // a golden case's file name: the file that runs
    for (std::size_t i = 0; i < golden_dirs.size(); ++i) {
      const auto& [dir, named, variable] = golden_dirs[i];
      const auto list = [&] { return safetensors_in(dir, named, missing); };
      for (auto& f : variable == nullptr ? list() : with_context(variable, list)) {
        if (const auto it = seen.find(f.filename().string()); it != seen.end()) {
          // A folder the user named skips only a copy: a file of theirs that differs would go
          // unchecked under a PASS (the adversarial trial, forty-fifth session: an edited copy in
          // METRALE_GOLDEN_DIR behind the working folder's cases/golden, only a note said so).
          // That check runs whatever --only picks: it picks replays by kernel and replay name too, not
          // by the file's name alone (forty-seventh session: --only deepseek passed over an edited copy).
          const bool copy = named && same_bytes(f, it->second);
          if (named && !copy)
            fail(Errc::invalid_argument,
                 "conform: golden case {} differs from {}, the file taken under that name: rename one, or name one "
                 "folder (--golden)",
                 printable(f.string()), printable(it->second.string()));
          // the note for a skipped copy where --only would pick the file by its name, as below
          if (!opts->only.empty() && f.stem().string().find(opts->only) == std::string::npos) continue;
          fmt::print(stderr, "note: conform: golden case {} skipped: {}{} is the file taken under that name\n",
                     printable(f.string()), printable(it->second.string()), copy ? ", a copy of it," : "");
          continue;
        }
        seen.emplace(f.filename().string(), f);
        golden_files.emplace_back(std::move(f), i);
      }
    }
    const auto wanted = [&only = opts->only](std::string_view kernel, std::string_view name) {
      return only.empty() || kernel.find(only) != std::string_view::npos || name.find(only) != std::string_view::npos;
    };
    // Where the run is, on the log (stderr): a run under a sanitizer takes many minutes, and the
    // summary comes only at its end.
    const auto phase = [&](std::string_view what, std::size_t n) {
      if (n > 0)
        spdlog::info("conform: {} {}{}{} on {} ({} case{} done)", n, what, n == 1 ? "" : "s",
                     opts->only.empty() ? "" : " to pick from", gpu->name(), results.size(),
                     results.size() == 1 ? "" : "s");
    };
    // A recording stopped at its limit (--record-limit) stops the run, as the README says: every
    // later case would fail alike, and the smaller ones be recorded after a gap (the fresh-user
    // trial, forty-sixth session: conform went on, failing each golden case).
    // The summary and the report then cover the cases that ran (the diff review, forty-sixth session).
    const auto recording_stopped_here = [&] { return recording_stopped(*gpu); };
    std::size_t checked = 0;  // the results before it ran with the recording going
    std::string stopped;      // why the run stopped early, or empty
    const auto stop_at_record_limit = [&] {
      if (!stopped.empty()) return true;
      if (!recording_stopped_here()) {
        checked = results.size();
        return false;
      }
      // The case whose launch the recording stopped at: the first since the last check that failed
      // (a golden file's later replays failed as the recording had stopped)
      const auto first = std::find_if(results.begin() + static_cast<std::ptrdiff_t>(checked), results.end(),
                                      [](const CaseResult& r) { return !r.error.empty(); });
      stopped = fmt::format("conform: the run stopped after {} case{}, as the recording did: {}", results.size(),
                            results.size() == 1 ? "" : "s", first == results.end() ? "" : first->message);
      return true;
    };
    const auto sweep = gen::conformance_sweep(opts->seed);
    phase("generated case", sweep.size());
    for (const auto& c : sweep) {
      if (!wanted(c.entry, c.name)) continue;
      if (const auto why = case_unavailable(*gpu, c)) {
        fmt::print(stderr, "note: conform: {} skipped ({})\n", c.name, *why);
        ++skipped;
        continue;
      }
      results.push_back(sweep_case(*gpu, emu, c));
      if (stop_at_record_limit()) break;
    }
    if (stopped.empty()) phase("case file", case_files.size());
    for (const auto& f : case_files) {
      if (!stopped.empty()) break;
      if (auto r = file_case(*gpu, f, wanted, skipped)) {
        results.push_back(std::move(*r));
        stop_at_record_limit();
      }
    }
    if (stopped.empty()) phase("golden file", golden_files.size());
    std::vector<std::size_t> model_cases(golden_dirs.size(), 0), files_in(golden_dirs.size(), 0),
        tables_in(golden_dirs.size(), 0), picked_in(golden_dirs.size(), 0);
    for (const auto& [f, dir] : golden_files) {
      if (!stopped.empty()) break;
      bool model_case = false, format_tables = false;
      auto g = golden_cases(*gpu, f, wanted, opts->only, model_case, format_tables, recording_stopped_here);
      results.insert(results.end(), g.begin(), g.end());
      stop_at_record_limit();
      ++files_in[dir], model_cases[dir] += model_case ? 1 : 0, tables_in[dir] += format_tables ? 1 : 0;
      picked_in[dir] += wanted("model case file", printable(f.stem().string())) ? 1 : 0;
    }
    // A golden folder the user named that holds no model case replays nothing: a failed case, not
    // a PASS (adversarial trial, forty-fourth session: kernel case files given as --golden passed),
    // where --only picks the folder or one of its files (fresh-user trial, forty-ninth session:
    // --only rope_pairs failed on a folder of the format tables).
    for (std::size_t i = 0; i < golden_dirs.size(); ++i)
      if (const auto& [dir, named, variable] = golden_dirs[i];
          named && files_in[i] > 0 && model_cases[i] == 0 &&
          (picked_in[i] > 0 || wanted("model case file", printable(dir)))) {
        const bool one_table = files_in[i] == 1 && tables_in[i] == 1;
        results.push_back(
            {"golden",
             "model case file",
             printable(dir),
             {},
             fmt::format("{}{} holds no model case: {}{}",
                         variable == nullptr ? "conform --golden " : std::string(variable) + " ", printable(dir),
                         one_table ? std::string("its one .safetensors file is the number-format tables (the formats "
                                                 "tests read them)")
                         : files_in[i] == 1 ? std::string("its one .safetensors file is not one")
                                            : fmt::format("none of its {} .safetensors files is one", files_in[i]),
                         one_table ? "" : " (kernel case files go to --cases)"),
             "",
             {}});
      }
    if (results.empty() && skipped == 0 && !opts->only.empty()) {
      // What there is to pick (the fresh-user trial, forty-ninth session: the error named none).
      std::set<std::string> kernels;
      for (const auto& c : sweep) kernels.insert(c.entry);
      fail(Errc::not_found,
           "conform: no case matches --only '{}'{}; the sweep's kernels are {} (a case's name or a "
           "golden replay's kernel matches too)",
           opts->only,
           std::any_of(opts->only.begin(), opts->only.end(), [](unsigned char c) { return std::isupper(c) != 0; })
               ? " (the match is case-sensitive)"
               : "",
           fmt::join(kernels, ", "));
    }
    if (results.empty() && skipped > 0)  // nothing checked is not a PASS
      fail(Errc::unsupported, "conform: the device ({}) cannot run {}: nothing was checked", gpu->name(),
           skipped == 1 ? std::string("the one case selected") : fmt::format("any of the {} cases selected", skipped));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const auto device = device_json(*gpu);
    fmt::print("{:<8} {:<46} {:>6} {:>6}\n", "group", "kernel", "cases", "failed");
    std::map<std::pair<std::string, std::string>, std::pair<int, int>> summary;
    for (const auto& r : results) {
      auto& [n, bad] = summary[{r.group, r.kernel}];
      ++n;
      bad += r.pass() ? 0 : 1;
    }
    for (const auto& [k, v] : summary) fmt::print("{:<8} {:<46} {:>6} {:>6}\n", k.first, k.second, v.first, v.second);
    const auto failed = std::count_if(results.begin(), results.end(), [](const CaseResult& r) { return !r.pass(); });
    for (const auto& r : results)
      if (!r.pass() || !r.notes.empty()) {
        fmt::print("{} {} {}\n", r.pass() ? "note on" : "FAIL", r.group, r.name);
        if (!r.error.empty()) fmt::print("  {}\n", r.error);
        for (const auto& c : r.checks)
          if (!c.pass) fmt::print("  {} vs {}: {} of {} bad, worst {}\n", c.output, c.against, c.bad, c.count, c.worst);
        for (const auto& note : r.notes) fmt::print("  note: {}\n", note);
      }
    std::string where = gpu->name();
    if (device.contains("device"))
      where +=
          fmt::format(" ({}, driver {})", device["device"].get<std::string>(), device["driver_version"].get<int>());
    std::vector<std::string> notes;  // what the count leaves out
    if (!stopped.empty()) notes.push_back("the run stopped early, as the recording did: below");
    if (skipped != 0) notes.push_back(fmt::format("{} skipped (the device cannot run them)", skipped));
    if (!missing.empty())
      notes.push_back(fmt::format("default folders not found or empty: {}", fmt::join(missing, ", ")));
    fmt::print("\n{}: {} case{}, {} failed, {:.1f} s — {}{}\n", where, results.size(), results.size() == 1 ? "" : "s",
               failed, seconds, failed == 0 ? "PASS" : "FAIL",
               notes.empty() ? "" : fmt::format(" ({})", fmt::join(notes, "; ")));
    if (!opts->report.empty()) {
      // The folders read (a missing default one only under folders_not_found).
      RunInfo run{opts->seed, opts->only, {}, {}, missing, skipped, stopped};
      const auto read = [&](const std::string& dir) {
        return std::find(missing.begin(), missing.end(), fs::path(dir).string()) == missing.end();
      };
      std::copy_if(case_dirs.begin(), case_dirs.end(), std::back_inserter(run.case_folders), read);
      for (const auto& [dir, named, variable] : golden_dirs)
        if (read(dir)) run.golden_folders.push_back(dir);
      write_reports(made.leaf, device, run, results, seconds);
      made.keep = true;
    }
    if (!stopped.empty()) fmt::print(stderr, "{}\n", error_text(Errc::capacity_exceeded, stopped));
    // A case that could not run is an error (2), as in `case run`; one out of tolerance is 1.
    const bool any_error =
        std::any_of(results.begin(), results.end(), [](const CaseResult& r) { return !r.error.empty(); });
    set_exit(any_error || !stopped.empty() ? 2 : failed == 0 ? 0 : 1);
  });
}

}  // namespace metrale::cli
