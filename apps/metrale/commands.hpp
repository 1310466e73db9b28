// The CLI's subcommands; each registers itself on the app.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

#include "cli_checks.hpp"

namespace metrale::cli {

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
