// CLI11 checks the metrale CLI and the fuzz drivers share.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "backends.hpp"
#include "metrale/error.hpp"

namespace metrale::cli {

/// A command's exit status once its standard output is flushed: `code`, or 2 with "error
/// (invalid_argument): cannot write standard output (<reason>)" on standard error when what it
/// printed could not all be written (a full disk, a closed stream), so that a script saving the
/// output does not take a truncated file for a success. `known`: the reason of a write that
/// failed before (a print's std::system_error), said where the flush gives none.
inline int with_output_written(int code, int known = 0) {
  errno = 0;
  std::cout.flush();
  if (std::cout.good() && std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return code;
  const int err = errno != 0 ? errno : known;
  std::fprintf(stderr, "error (invalid_argument): cannot write standard output (%s)\n",
               err != 0 ? std::strerror(err) : "a write failed");
  return 2;
}

/// The check of an option whose value is a path: an empty one (`--json ""`) is refused with
/// "empty path" rather than read as the option not given.
inline CLI::Validator non_empty_path() {
  return {[](std::string& s) { return s.empty() ? std::string{"an empty path"} : std::string{}; }, ""};
}

/// The check of a filter option (`--only TEXT`): an empty text, which every name contains, would
/// select everything (a script's unset variable running the whole set) and is refused.
inline CLI::Validator non_empty_filter() {
  return {[](std::string& s) {
            return s.empty() ? std::string{"an empty filter (it would match everything)"} : std::string{};
          },
          ""};
}

/// `s` read as decimal digits alone: its value, or why it cannot be (result_out_of_range past
/// 2^64 − 1, invalid_argument for anything but digits). The checks below share it.
struct Decimal {
  std::uint64_t value = 0;
  std::errc error{};
};
inline Decimal read_decimal(const std::string& s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return {v, ec == std::errc{} && end != s.data() + s.size() ? std::errc::invalid_argument : ec};
}

/// The check of an unsigned 64-bit option: decimal digits whose value fits, so that
/// 18446744073709551616 is refused instead of clamped to 2^64 − 1. The text is rewritten without
/// leading zeros: CLI11 reads "010" as octal 8.
inline CLI::Validator uint64_text() {
  return {[](std::string& s) {
            const Decimal d = read_decimal(s);
            if (d.error == std::errc::result_out_of_range) return "'" + s + "' is larger than 2^64 - 1";
            if (d.error != std::errc{}) return "'" + s + "' is not an unsigned decimal";
            s = std::to_string(d.value);
            return std::string{};
          },
          "UINT64"};
}

/// The check of a whole-number option in [lo, hi]: decimal digits, so that "1e3" or "2.5" is
/// called what it is rather than "not in range" (CLI11's Range says that of anything it cannot
/// read as the option's type). The text is rewritten without leading zeros: CLI11 reads "010"
/// as octal 8, and "08" not at all.
inline CLI::Validator integer_in(std::uint64_t lo, std::uint64_t hi) {
  return {[lo, hi](std::string& s) {
            const Decimal d = read_decimal(s);
            if (d.error == std::errc::invalid_argument) return "'" + s + "' is not a whole number (decimal digits)";
            if (d.error != std::errc{} || d.value < lo || d.value > hi)
              return "'" + s + "' is outside " + std::to_string(lo) + " to " + std::to_string(hi);
            s = std::to_string(d.value);
            return std::string{};
          },
          "INT in [" + std::to_string(lo) + " - " + std::to_string(hi) + "]"};
}

/// A decimal number, all of the text ("2", "0.5", "1e-3"; not "abc", "0x10", "nan", "inf" or
/// "1e-3x"), within [lo, hi]: CLI11 alone reads hex, says only "not in range" of text that is no
/// number, and gives its range as "0.001000 to 10000000.000000". A number past a double's range
/// ("1e-400") is outside [lo, hi], not "no number".
inline CLI::Validator decimal_in(double lo, double hi) {
  return {[lo, hi](std::string& s) {
            double v = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
            const bool whole = !s.empty() && end == s.data() + s.size();
            if (!whole || (ec != std::errc{} && ec != std::errc::result_out_of_range) || std::isnan(v) ||
                (ec == std::errc{} && std::isinf(v)))
              return "'" + s + "' is not a number (2, 0.5, 1e-3)";
            if (ec == std::errc::result_out_of_range || v < lo || v > hi)
              return fmt::format("'{}' is outside {} to {}", s, lo, hi);
            return std::string{};
          },
          ""};
}

/// The check and conversion of a size option: a whole number with an optional unit ("4GB", "2 GiB",
/// "1024"), converted by CLI::AsSizeValue (1000-based units, "Ki"-style 1024-based), rewritten as
/// decimal bytes, positive and within 64 bits. The number must come first (AsSizeValue reads a
/// bare unit, "MB", as one of it), and nothing may follow the unit (" 5MB" and "5MB " are refused,
/// as the whole-number options refuse " 16").
inline CLI::Validator size_in_bytes() {
  return {[](std::string& s) {
            // Digits first and last a digit or a letter, as the whole-number options take them (a
            // space between number and unit is CLI11's: "2 GiB").
            if (s.empty() || std::isdigit(static_cast<unsigned char>(s.front())) == 0 ||
                std::isalnum(static_cast<unsigned char>(s.back())) == 0)
              return "'" + s + "' is not a size (4GB, 500MB, 1024: digits first, nothing after the unit)";
            const std::string given = s;
            // CLI11's own words (thrown or returned) for a bad unit, a fraction ("Value 1.5 could
            // not be converted to UINT") or an overflow: ours instead, naming the value.
            std::string error;
            try {
              error = CLI::AsSizeValue(true)(s);
            } catch (const CLI::ValidationError& e) {
              error = e.what();
            }
            if (error.find("overflow") != std::string::npos) return "'" + given + "' bytes is more than 2^64 - 1";
            if (error.find("could not be converted") != std::string::npos)
              return "'" + given + "' is not a size (4GB, 500MB, 1024: a whole number, then a unit)";
            if (error.find("unit not recognized") != std::string::npos) {
              // The unit as CLI11 reads it: the letters at the end.
              std::size_t end = given.find_last_not_of(" \t") + 1, unit = end;
              while (unit > 0 && std::isalpha(static_cast<unsigned char>(given[unit - 1])) != 0) --unit;
              return "'" + given + "' is not a size: its unit '" + given.substr(unit, end - unit) +
                     "' is none of B, KB or KiB, MB or MiB, GB or GiB, TB or TiB, PB or PiB, EB or EiB (any case, "
                     "the B optional: 4GB, 500m, 2GiB)";
            }
            if (!error.empty()) return "'" + given + "': " + error;
            const Decimal d = read_decimal(s);
            if (d.error == std::errc::result_out_of_range) return "'" + given + "' bytes is more than 2^64 - 1";
            if (d.error != std::errc{}) return "'" + given + "' is not a size (4GB, 500MB, 1024)";
            if (d.value == 0) return std::string{"a size of 0 bytes (give a positive size)"};
            s = std::to_string(d.value);
            return std::string{};
          },
          ""};
}

/// One of `names`, exactly: "'<value>' is not one of a, b" (CLI11's IsMember printed an empty value
/// as nothing at all: "--kv-cache:  not in {fp8,nvfp4}").
inline CLI::Validator one_of(std::vector<std::string> names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return {[names = std::move(names), list](std::string& s) {
            if (std::find(names.begin(), names.end(), s) != names.end()) return std::string{};
            return "'" + metrale::printable(s) + "' is not one of " + list;
          },
          "{" + list + "}"};
}

/// The check of a --backend option: emu, cuda or auto (`--backend ""` is refused, not read as the
/// option left out).
inline CLI::Validator backend_name() {
  return one_of(std::vector<std::string>(std::begin(kBackendNames), std::end(kBackendNames)));
}

/// The edit distance between two option names (insertions, deletions, substitutions).
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// The long option ("--seed") of `cmd`, else of its parents, nearest to `name` ("--sedd") within
/// two edits, or for a short option ("-m") the one that starts with its letter; "" where none is.
inline std::string nearest_option(const CLI::App& cmd, const std::string& name) {
  std::string nearest;
  // A short option ("-m"): the one long option that starts with its letter (--model), if one does.
  if (name.size() == 2 && name[0] == '-' && name[1] != '-') {
    std::vector<std::string> starting;
    for (const CLI::App* at = &cmd; at != nullptr; at = at->get_parent())
      for (const CLI::Option* o : at->get_options())
        for (const std::string& long_name : o->get_lnames())
          if (long_name.front() == name[1]) starting.push_back("--" + long_name);
    return starting.size() == 1 ? starting.front() : "";
  }
  std::size_t best = 3;
  for (const CLI::App* at = &cmd; at != nullptr; at = at->get_parent())  // its own, then the top's
    for (const CLI::Option* o : at->get_options())
      for (const std::string& long_name : o->get_lnames())
        if (const std::size_t d = edit_distance(name, "--" + long_name); d < best) best = d, nearest = "--" + long_name;
  return nearest;
}

/// "<program>: unknown option <name>; did you mean <nearest_option>? (<program> --help lists its
/// options)", the question left out where no option is near: for an option `cmd` does not take,
/// in place of CLI11's "not expected" line (which names the words last first).
inline std::string unknown_option_line(const CLI::App& cmd, const std::string& program, const std::string& name) {
  const std::string nearest = nearest_option(cmd, name);
  return fmt::format("{}: unknown option {}{} ({} --help lists its options)", program, metrale::printable(name),
                     nearest.empty() ? "" : fmt::format("; did you mean {}?", nearest), program);
}

}  // namespace metrale::cli
