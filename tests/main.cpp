// The test runner: Catch2's, with the library's log at warnings and above unless SPDLOG_LEVEL says
// otherwise, so that its info lines (the recorder's closing note, the backend chosen) do not
// interleave with Catch2's report. Tests of those lines run the CLI, which logs as it always does.
// A test spec that matches no test fails (Catch2's `-w NoTests`, on by default here): a mistyped
// tag ("[nosuchtag]") had printed "No tests ran" and exited 0 (fresh-user trial).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

int main(int argc, char* argv[]) {
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();
  Catch::Session session;
  session.configData().warnings = Catch::WarnAbout::NoTests;
  if (const int code = session.applyCommandLine(argc, argv); code != 0) return code;
  return session.run();
}
