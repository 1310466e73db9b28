#include "driver.hpp"

#include <rapidcheck.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "metrale/cli_checks.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/error.hpp"
#include "metrale/files.hpp"
#include "metrale/kernel_case.hpp"
#include "props/props.hpp"

namespace metrale::fuzz {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  double seconds = 0;
  std::uint64_t cases = 0;
  std::uint64_t seed = 0;
  int batch = 25;
  int max_size = 100;
  std::string property;
  fs::path out = "fuzz-failures";
  bool list = false;
};

// "x" -> "x", anything else a shell would split or expand -> '...'.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A file name from a property name: its words joined by '-', at most 40 characters.
std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
    if (word) out += c;
    else if (!out.empty() && out.back() != '-') out += '-';
    if (out.size() >= 40) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

// rapidcheck's default listener prints progress as configured by RC_PARAMS; the driver reports.
struct Quiet : rc::detail::TestListener {
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

// One batch of one property: the result, and the last input that failed (the shrunk one: after
// the last accepted shrink every further candidate passed).
struct Batch {
  rc::detail::TestResult result;
  props::Input failing;
};

Batch run_batch(const props::Property& p, const rc::detail::TestParams& params) {
  props::Input failing;
  auto body = [&] {
    try {
      p.check();
    } catch (const rc::detail::CaseResult& r) {
      if (r.type == rc::detail::CaseResult::Type::Failure) failing = props::current_input();
      throw;
    } catch (...) {
      failing = props::current_input();
      throw;
    }
  };
  rc::detail::TestMetadata meta;
  meta.id = p.name;
  meta.description = p.name;
  Quiet quiet;
  auto result = rc::detail::checkProperty(rc::detail::toProperty(body), meta, params, quiet, {});
  return {std::move(result), std::move(failing)};
}

// Write the failing input under `dir`: a report, its kernel cases, and (for scenario
// properties) every launch of a once-more run of the shrunk case, recorded by the emulator.
std::vector<fs::path> write_failure(const props::Property& p, const rc::detail::TestParams& params,
                                    const rc::detail::FailureResult& f, const props::Input& failing,
                                    const fs::path& dir, const std::string& report) {
  std::vector<fs::path> written;
  fs::create_directories(dir);
  for (std::size_t i = 0; i < failing.cases.size(); ++i) {
    const auto path = dir / fmt::format("{:02}_{}.safetensors", i, failing.cases[i].entry);
    to_safetensors(failing.cases[i]).write(path);
    written.push_back(path);
  }
  if (failing.cases.empty() && p.record) {
    props::set_record_dir(dir / "launches");
    rc::detail::TestMetadata meta;
    meta.id = p.name;
    rc::detail::TestParams once = params;
    once.maxSuccess = 1;
    Quiet quiet;
    rc::detail::checkProperty(rc::detail::toProperty(p.check), meta, once, quiet, {{p.name, f.reproduce}});
    props::set_record_dir({});
    if (fs::exists(dir / "launches"))
      for (const auto& e : fs::recursive_directory_iterator(dir / "launches"))
        if (e.is_regular_file()) written.push_back(e.path());
  }
  // After the cases (or the recorded launches), which reproduce the failure without it, staged and renamed into place
  // as every file the project writes: a link or a folder at the name is refused, and a failed write is an error (the
  // adversarial trial, forty-seventh session: an ofstream had written through a link, and a failure went unsaid).
  StagedFile(dir / "report.txt", report + "\ninput: " + failing.description + "\n").commit();
  written.insert(written.begin(), dir / "report.txt");
  std::sort(written.begin() + 1, written.end());
  return written;
}

// The environment variables that change what a property does, for the reproduce line.
std::string environment() {
  std::string env;
  for (const char* name : {"METRALE_EMU_COMPUTE_CAPABILITY", "METRALE_EMU_SHARED_BYTES", "METRALE_EMU_THREADS",
                           "METRALE_EMU_BLOCK_ACCESSES", "METRALE_EMU_LAUNCH_ACCESSES"})
    if (const char* v = std::getenv(name)) env += fmt::format("{}={} ", name, quoted(v));
  return env;
}

int fuzz(const Options& o, const std::string& family, const char* argv0) {
  std::vector<props::Property> properties;
  for (auto& p : props::family(family))
    if (o.property.empty() || p.name == o.property) properties.push_back(std::move(p));
  if (properties.empty()) {
    std::vector<std::string> names;
    for (const auto& p : props::family(family)) names.push_back("'" + p.name + "'");
    fail(Errc::not_found, "family {} has no property '{}'; --property takes one of these whole (--list): {}", family,
         o.property, fmt::join(names, ", "));
  }
  if (o.list) {
    for (const auto& p : properties) std::cout << p.name << "\n";
    return 0;
  }
  // The environment's emulator settings (METRALE_EMU_*), checked before any case runs: a bad
  // value is the run's error, not every property's failure.
  { const emu::EmulatorBackend probe(props::emulator_options()); }
  // Where a failure goes, checked before any case runs but made only when a property fails, so a
  // clean run, an interrupted one or one killed by a signal leaves nothing behind: the folder, or
  // the nearest folder above it that exists, must be a folder this process can make a folder in
  // (tried: a probe folder made and removed; access() passes root under /proc, where mkdir fails).
  {
    std::error_code ec;
    fs::path p = fs::absolute(o.out, ec);
    // (symlink_status: a link to nothing is something in the way, not a folder still to make)
    for (std::error_code status_ec; !ec && p != p.parent_path(); p = p.parent_path()) {
      const fs::file_type type = fs::symlink_status(p, status_ec).type();
      if (type == fs::file_type::not_found) continue;  // (its error, ENOENT or ENOTDIR, is the answer)
      if (type == fs::file_type::none) ec = status_ec;
      break;
    }
    // (is_directory's error code: a loop of links had ended the driver with the library's words)
    std::error_code dir_ec;
    const bool is_dir = !ec && fs::is_directory(p, dir_ec);
    // (ENOENT: a link to nothing, "not a folder" as before)
    if (dir_ec == std::errc::no_such_file_or_directory) dir_ec.clear();
    std::string why = ec        ? ec.message()
                      : dir_ec  ? quoted(p.string()) + ": " + dir_ec.message()
                      : !is_dir ? quoted(p.string()) + " is not a folder"
                                : "";
    if (why.empty()) {
      std::string probe = (p / ".metrale-fuzz-out-XXXXXX").string();
      // ENOENT for a folder that exists is its file system's refusal (/proc's), not a missing path.
      if (::mkdtemp(probe.data()) == nullptr)
        why = "no folder can be made in " + quoted(p.string()) + ": " +
              (errno == ENOENT ? std::string("its file system makes none (mkdir said \"No such file or directory\" "
                                             "in a folder that exists)")
                               : std::string(std::strerror(errno)));
      else
        ::rmdir(probe.c_str());
    }
    if (!why.empty())
      fail(Errc::invalid_argument, "--out {}: not a directory that can be created ({})", quoted(o.out.string()), why);
  }
  const double seconds = o.seconds == 0 && o.cases == 0 ? 10.0 : o.seconds;
  std::cout << fmt::format(
                   "fuzz_{}: {} propert{}, seed {}, batches of {}, budget {} (at least one batch of "
                   "each property)\n",
                   family, properties.size(), properties.size() == 1 ? "y" : "ies", o.seed, o.batch,
                   o.cases != 0 ? fmt::format("{} case{}", o.cases, o.cases == 1 ? "" : "s")
                                : fmt::format("{} s", seconds))
            << std::flush;
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::uint64_t cases = 0, batches = 0;
  for (std::uint64_t round = 0;; ++round) {
    for (const auto& p : properties) {
      rc::detail::TestParams params;
      params.seed = o.seed + round;
      params.maxSuccess = o.batch;
      params.maxSize = o.max_size;
      const Batch b = run_batch(p, params);
      ++batches;
      if (b.result.is<rc::detail::SuccessResult>()) {
        cases += static_cast<std::uint64_t>(b.result.get<rc::detail::SuccessResult>().numSuccess);
      } else if (b.result.is<rc::detail::FailureResult>()) {
        const auto& f = b.result.get<rc::detail::FailureResult>();
        cases += static_cast<std::uint64_t>(f.numSuccess) + 1;
        std::ostringstream msg;
        rc::detail::printResultMessage(b.result, msg);
        const std::string report = fmt::format(
            "fuzz_{}: property \"{}\" FAILED at batch seed {} (batch {}, max_size {}) after {} cases in {:.1f} s\n{}\n"
            "reproduce: {}{} --property {} --seed {} --cases {} --batch {} --max-size {}\n"
            "       or: {}RC_PARAMS=\"seed={} max_success={} max_size={}\" {} {}\n",
            family, p.name, params.seed, o.batch, o.max_size, cases, elapsed(), msg.str(), environment(), argv0,
            quoted(p.name), params.seed, o.batch, o.batch, o.max_size, environment(), params.seed, o.batch,
            o.max_size, (fs::path(argv0).parent_path() / "metrale_tests").string(), quoted(p.name));
        std::cout << report;
        // A folder of its own: one left by an earlier run of the seed is kept, and the new files are
        // not mixed with its (adversarial trial, fiftieth session: a stale case sat beside them).
        const std::string name = fmt::format("{}-{}-seed{}", family, slug(p.name), params.seed);
        fs::path dir = o.out / name;
        const auto taken = [](const fs::path& d) {
          std::error_code ec;
          return fs::symlink_status(d, ec).type() != fs::file_type::not_found;
        };
        for (int n = 2; taken(dir) && n <= 1000; ++n) dir = o.out / fmt::format("{}.{}", name, n);
        std::vector<fs::path> written;
        try {
          written = write_failure(p, params, f, b.failing, dir, report);
        } catch (const std::exception& e) {
          // The failure stands (exit 1) and its report is above; the half-written folder goes (a
          // full disk had turned the failure into exit 2 and left a case without its report).
          std::error_code ec;
          fs::remove_all(dir, ec);
          std::cout << fmt::format("could not write the failing input's files to {} ({}){}\n", dir.string(), e.what(),
                                   ec ? "; what was written is still there" : "; nothing was kept");
          return 1;
        }
        std::cout << fmt::format("wrote {} file{} to {}:\n", written.size(), written.size() == 1 ? "" : "s",
                                 dir.string());
        for (std::size_t i = 0; i < written.size() && i < 12; ++i)
          std::cout << "  " << fs::relative(written[i], dir).string() << "\n";
        if (written.size() > 12) std::cout << fmt::format("  ... and {} more\n", written.size() - 12);
        return 1;
      } else {
        std::ostringstream msg;
        rc::detail::printResultMessage(b.result, msg);
        std::cout << fmt::format("fuzz_{}: property \"{}\" at batch seed {}: {}\n", family, p.name, params.seed,
                                 msg.str());
        return 2;
      }
      // Every property runs at least one batch, whatever the budget.
      const bool all_ran = round > 0 || &p == &properties.back();
      if (all_ran && ((o.cases != 0 && cases >= o.cases) || (o.cases == 0 && elapsed() >= seconds))) {
        // Batch seeds count up from --seed modulo 2^64, so a range may wrap past the largest.
        const std::uint64_t last = o.seed + round;
        const std::string seeds = last >= o.seed ? fmt::format("seeds {}..{}", o.seed, last)
                                                 : fmt::format("seeds {}..{} and 0..{}", o.seed,
                                                               std::numeric_limits<std::uint64_t>::max(), last);
        std::cout << fmt::format(
            "fuzz_{}: {} case{} in {} batch{} ({} propert{}, a seed a round of them), {:.1f} s, "
            "{}: no failure\n",
            family, cases, cases == 1 ? "" : "s", batches, batches == 1 ? "" : "es", properties.size(),
            properties.size() == 1 ? "y" : "ies", elapsed(), seeds);
        return 0;
      }
    }
  }
}

}  // namespace

int run(int argc, char** argv, const std::string& family) {
  spdlog::set_level(spdlog::level::warn);  // the recorder's notes would drown the report
  Options o;
  o.seed = std::random_device{}();
  o.seed = o.seed << 32 | std::random_device{}();
  CLI::App app{fmt::format("fuzz_{}: the {} property family (tests/props/) for a budget from a seed", family, family)};
  // Bounds keep one batch short: the budget is checked between batches.
  auto* secs = app.add_option("--seconds", o.seconds, "time budget, 0.001 ≤ s ≤ 1e7 (default 10)")
                   ->check(metrale::cli::decimal_in(1e-3, 1e7));
  app.add_option("--cases", o.cases,
                 "case budget: stops at the first batch that reaches it, once every property has run a batch "
                 "(so at least --batch cases a property)")
      ->transform(metrale::cli::integer_in(1, std::uint64_t{1} << 40))
      ->excludes(secs);
  app.add_option("--seed", o.seed, "first batch seed, 0 ≤ S < 2^64 (default: random)")
      ->transform(metrale::cli::uint64_text());  // (CLI11 alone clamps 2^64 to 2^64 − 1)
  app.add_option("--batch", o.batch, "cases per property per batch (1–1000)")
      ->transform(metrale::cli::integer_in(1, 1000))
      ->capture_default_str();
  app.add_option("--max-size", o.max_size, "rapidcheck's largest size (0–1000)")
      ->transform(metrale::cli::integer_in(0, 1000))
      ->capture_default_str();
  app.add_option("--property", o.property, "only this property")->check([](const std::string& v) {
    return v.empty() ? "a property name is not empty (--list names them)" : "";
  });
  app.add_option("--out", o.out, "folder a failing input's case files and repro are written under")
      ->check([](const std::string& v) { return v.empty() ? "an empty path" : ""; })
      ->capture_default_str();
  app.add_flag("--list", o.list, "print the properties and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return metrale::cli::with_output_written(app.exit(e));  // --help (to a full stdout: said, exit 2)
  } catch (const CLI::ParseError& e) {
    // An option the driver does not take, with its nearest ("--sedd": did you mean --seed?), as the
    // metrale CLI names it.
    std::vector<std::string> unknown;
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr)
      for (const std::string& word : app.remaining())
        if (const std::string name = word.substr(0, word.find('=')); name.starts_with("--") && name.size() > 2)
          unknown.push_back(metrale::cli::unknown_option_line(app, "fuzz_" + family, name));
    if (unknown.empty()) app.exit(e);
    for (const auto& line : unknown) std::cerr << line << "\n";
    return 2;  // as every other error of a driver
  }
  try {
    return metrale::cli::with_output_written(fuzz(o, family, argv[0]));
  } catch (const std::exception& e) {
    std::cerr << "fuzz_" << family << ": error: " << e.what() << "\n";
    return metrale::cli::with_output_written(2);
  }
}

}  // namespace metrale::fuzz
