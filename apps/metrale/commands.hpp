// The CLI's subcommands; each registers itself on the app.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace metrale::cli {

/// `set_exit(code)` records the process exit status of a subcommand that ran.
void add_replay(CLI::App& app, std::function<void(int)> set_exit);
void add_info(CLI::App& app);

}  // namespace metrale::cli
