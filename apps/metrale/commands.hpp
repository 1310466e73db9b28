// The CLI's subcommands; each registers itself on the app.
#pragma once

#include <exception>
#include <functional>
#include <new>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli_checks.hpp"
#include "metrale/error.hpp"

namespace metrale::cli {

/// An error as the CLI reports it: "error (<code>): <message>".
inline std::string error_text(Errc code, std::string_view message) {
  return fmt::format("error ({}): {}", to_string(code), message);
}

/// The exception being handled (call it inside a catch block) as the CLI reports an error:
/// "error (<code>): <message>" — metrale's code; out_of_memory for std::bad_alloc; internal for any
/// other std::exception (a library's own: filesystem, json, ...), its text as printable() writes it.
inline std::string error_line() {
  try {
    throw;
  } catch (const Error& e) {
    return error_text(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return "error (out_of_memory): the host ran out of memory";
  } catch (const std::exception& e) {
    return fmt::format("error (internal): {}", printable(e.what()));
  }
}

/// `set_exit(code)` records the process exit status of a subcommand that ran.
void add_replay(CLI::App& app, std::function<void(int)> set_exit);
void add_info(CLI::App& app);
/// `metrale case run FILE...`: kernel case files on a backend, against their expectations.
void add_case(CLI::App& app, std::function<void(int)> set_exit);
/// `metrale conform`: the conformance set on a backend against the emulator and the reference.
void add_conform(CLI::App& app, std::function<void(int)> set_exit);
/// `metrale bench`: kernel timings against the copy bandwidth.
void add_bench(CLI::App& app);

}  // namespace metrale::cli
