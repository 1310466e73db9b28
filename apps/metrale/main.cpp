// metrale: the command line of the MLA decode kernels framework.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "backends.hpp"
#include "cli_checks.hpp"
#include "commands.hpp"
#include "metrale/error.hpp"
#include "metrale/files.hpp"

namespace {

// SPDLOG_LEVEL ("debug", "info,metrale=trace", ...): spdlog skips a level it does not know without a
// word; say so.
void warn_unknown_log_levels() {
  const char* env = std::getenv("SPDLOG_LEVEL");
  if (env == nullptr) return;
  std::string_view rest = env;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (const auto eq = item.find('='); eq != std::string_view::npos) item.remove_prefix(eq + 1);
    std::string level(item);  // spdlog takes a level in any case
    std::transform(level.begin(), level.end(), level.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (spdlog::level::from_str(level) == spdlog::level::off && level != "off")
      spdlog::warn("SPDLOG_LEVEL: unknown level '{}' ignored (trace, debug, info, warn, error, critical or off)",
                   metrale::printable(level));
  }
}

// The commands given on the line, as words ("case run"; "" for none).
std::string given_commands(const CLI::App& app) {
  std::string given;
  for (const CLI::App* cmd = &app; !cmd->get_subcommands().empty();) {
    cmd = cmd->get_subcommands().front();
    given += (given.empty() ? "" : " ") + cmd->get_name();
  }
  return given;
}

// "metrale" and the commands given ("metrale case run"), as messages name where they are.
std::string command_path(const CLI::App& app) {
  const std::string given = given_commands(app);
  return given.empty() ? "metrale" : "metrale " + given;
}

// The commands under `app` that take the option `name` ("case run"), in the order --help lists
// them, each with its option.
std::vector<std::pair<std::string, const CLI::Option*>> commands_taking(const CLI::App& app, const std::string& name) {
  std::vector<std::pair<std::string, const CLI::Option*>> takers;
  const std::function<void(const CLI::App&, const std::string&)> look = [&](const CLI::App& cmd,
                                                                            const std::string& path) {
    for (const CLI::App* sub : cmd.get_subcommands({})) {
      const std::string full = path.empty() ? sub->get_name() : path + " " + sub->get_name();
      if (const CLI::Option* o = sub->get_option_no_throw(name); o != nullptr) takers.emplace_back(full, o);
      look(*sub, full);
    }
  };
  look(app, "");
  return takers;
}

// How many words after the option `word` ("--backend", not "--backend=emu") may be its values, in
// whichever command takes the most (--json is replay's flag and bench's FILE): 0, 1, or more
// (a list: --batch 1 8, --cases DIR DIR).
int values_taken(const CLI::App& app, const std::string& word) {
  int most = 0;
  for (const auto& [command, option] : commands_taking(app, word))
    most = std::max(most, option->get_items_expected_max());
  return most;
}

// The first of the words left over that is neither an option nor an option's value ("metrale
// --backend emu bogus": bogus), or "" where there is none. (After a list option every word up to
// the next option counts as its values.)
std::string first_plain_word(const CLI::App& app, const std::vector<std::string>& words) {
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (!words[i].starts_with("-")) return words[i];
    if (words[i].find('=') != std::string::npos) continue;
    const int n = values_taken(app, words[i]);
    if (n == 1) ++i;
    while (n > 1 && i + 1 < words.size() && !words[i + 1].starts_with("-")) ++i;
  }
  return "";
}

// An option no command takes ("replay FILE --modle kimi-k3"): named, with the given command's
// option nearest to it where one is within two edits (fresh-user trial, forty-fifth session:
// CLI11 had said "not expected: kimi-k3 --modle", last word first).
std::string unknown_option_line(const CLI::App& app, const std::string& name) {
  const CLI::App* cmd = &app;
  while (!cmd->get_subcommands().empty()) cmd = cmd->get_subcommands().front();
  return metrale::cli::unknown_option_line(*cmd, command_path(app), name);
}

// "metrale --backend cuda replay FILE" (fresh-user trial, fortieth session): for each option of a
// command given before the command, a line naming the commands that take it (main prints them in
// place of CLI11's "not expected" line).
std::vector<std::string> where_options_go(const CLI::App& app) {
  std::vector<std::string> lines;
  const std::vector<std::string> words = app.remaining();
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    const std::string name = word.substr(0, word.find('='));
    if (name.size() < 2 || name[0] != '-' || app.get_option_no_throw(name) != nullptr) continue;
    // Given a value ("--json out.json", "--json=out.json"): the example is a command that takes
    // one (bench's FILE, not replay's flag; the adversarial trial, forty-fourth session).
    const bool valued = word.size() > name.size() || (i + 1 < words.size() && !words[i + 1].starts_with("-"));
    std::vector<std::string> takers;
    std::string example;
    for (const auto& [command, option] : commands_taking(app, name)) {
      takers.push_back(command);
      if (example.empty() && (!valued || option->get_items_expected_max() > 0)) example = command;
    }
    if (takers.empty()) {
      if (name != "--") lines.push_back(unknown_option_line(app, name));  // "--modle", "-m"
      continue;
    }
    std::string given = given_commands(app);  // as the example where it takes the option
    // A group given (case) whose command takes it (case run): where it goes in that command.
    const auto under = std::find_if(takers.begin(), takers.end(),
                                    [&](const std::string& t) { return !given.empty() && t.starts_with(given + " "); });
    if (under != takers.end()) given = *under;
    if (!given.empty() && std::find(takers.begin(), takers.end(), given) == takers.end())
      lines.push_back(fmt::format("metrale {} does not take {}; the commands that take it: {}", given, name,
                                  fmt::join(takers, ", ")));
    else
      lines.push_back(fmt::format("{} goes after the command (metrale {} {} ...); the commands that take it: {}", name,
                                  given.empty() ? (example.empty() ? takers.front() : example) : given, name,
                                  fmt::join(takers, ", ")));
  }
  return lines;
}

// A parse error's lines on stderr, and the exit code: the unknown command or option named, where
// an option goes, a flag given a value, or the commands of a group, in place of CLI11's "not
// expected" and "a subcommand is required" lines; CLI11's own handling for --help, --version and
// the rest. `record_dir`: what --record took (it may have taken the command's name).
int exit_on_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv,
                        const std::string& record_dir) {
  // "metrale bogus", "metrale case bogus", "metrale replay --bogus": name the unknown command or
  // option rather than "a subcommand is required" or "FILE is required".
  // (What a subcommand does not take falls through to the top, so look there too.)
  const CLI::App* last = &app;
  while (!last->get_subcommands().empty()) last = last->get_subcommands().front();
  const std::string path = command_path(app);
  // An option of one value given twice ("--kv-cache fp8 --kv-cache nvfp4"; the fresh-user trial,
  // forty-sixth session: CLI11's "At Most 1 required but received 2").
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr)
    for (const CLI::App* at = last; at != nullptr; at = at->get_parent())
      for (const CLI::Option* o : at->get_options())
        if (o->get_items_expected_max() == 1 && o->count() > 1) {
          // as typed: results() hold what a transform made of them ("1GB" as "1000000000")
          std::vector<std::string> given;
          for (int i = 1; i < argc; ++i)
            for (const std::string& n : o->get_lnames()) {
              const std::string_view a = argv[i];
              const std::string flag = "--" + n;
              if (a == flag && i + 1 < argc)
                given.push_back("'" + metrale::printable(argv[i + 1]) + "'");
              else if (a.starts_with(flag + "="))
                given.push_back("'" + metrale::printable(a.substr(flag.size() + 1)) + "'");
            }
          if (given.empty())
            for (const std::string& r : o->results()) given.push_back("'" + metrale::printable(r) + "'");
          fmt::print(stderr, "{}: {} given {} times ({}); it takes one value\nRun with --help for more information.\n",
                     path, o->get_name(), o->count(), fmt::join(given, ", "));
          return e.get_exit_code();
        }
  const std::vector<std::string> extra = last->remaining().empty() ? app.remaining() : last->remaining();
  const bool required = dynamic_cast<const CLI::RequiredError*>(&e) != nullptr;
  const bool extras = (last->get_require_subcommand_min() > 0 || required) && !extra.empty();
  // Where an option goes, or what the commands are, said in place of CLI11's "not expected" line
  // (which named the words last first: "emu --backend"); after any other error's line, and after
  // --help's text not at all.
  std::vector<std::string> hints = where_options_go(app);
  const bool not_expected = extras || dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr;
  // "replay --json out.json FILE": a flag given a value, which then took the command's argument's
  // place (the adversarial trial, forty-fifth session: only the FILE was named, as not expected).
  // Only a flag after the command's name that another command takes with a value (--json: replay's
  // flag, bench's FILE), where something was left over.
  int after = argc;  // the index of the command's name
  for (int i = 1; i < argc && last != &app; ++i)
    if (argv[i] == last->get_name()) {
      after = i;
      break;
    }
  for (int i = after + 1; not_expected && !extra.empty() && i + 1 < argc; ++i) {
    const CLI::Option* o = argv[i][0] == '-' ? last->get_option_no_throw(argv[i]) : nullptr;
    if (o == nullptr || o->get_items_expected_max() != 0 || argv[i + 1][0] == '-') continue;
    const auto takers = commands_taking(app, argv[i]);
    if (std::none_of(takers.begin(), takers.end(),
                     [](const auto& t) { return t.second->get_items_expected_max() > 0; }))
      continue;
    if (hints.empty()) hints.push_back(extras ? CLI::ExtrasError(extra).what() : e.what());  // what is left over
    hints.push_back(fmt::format("{} is a flag and takes no value: '{}' was read as the next argument", argv[i],
                                metrale::printable(argv[i + 1])));
  }
  // A word left over after a command's one-value positional ("replay F G": the fresh-user trial,
  // forty-sixth session, CLI11 said only "not expected: G").
  if (not_expected && hints.empty() && last != &app && last->get_require_subcommand_min() == 0)
    if (const std::string word = first_plain_word(app, extra); !word.empty())
      for (const CLI::Option* o : last->get_options())
        if (o->get_positional() && o->get_items_expected_max() == 1 && o->count() == 1)
          hints.push_back(fmt::format("{}: '{}' is left over: {} takes one value, given as '{}'", path,
                                      metrale::printable(word), o->get_name(),
                                      metrale::printable(o->results().front())));
  if ((not_expected || required) && last->get_require_subcommand_min() > 0) {  // metrale, or a group: its commands
    std::vector<std::string> commands;
    for (const CLI::App* sub : last->get_subcommands({})) commands.push_back(sub->get_name());
    // (An option's value is not the command: "metrale --backend emu bogus" names bogus.)
    if (const std::string word = first_plain_word(app, extra); !word.empty()) {
      hints.push_back(fmt::format("{}: unknown command '{}'; the commands: {}", path, metrale::printable(word),
                                  fmt::join(commands, ", ")));
      // "metrale --record replay FILE": --record took the command as its folder (fresh-user trial,
      // forty-fifth session).
      if (std::find(commands.begin(), commands.end(), record_dir) != commands.end())
        hints.push_back(
            fmt::format("--record took '{}' as its folder: the folder comes first (metrale --record DIR "
                        "{} ...)",
                        record_dir, record_dir));
    } else if (hints.empty()) {  // none given, or an option before it: CLI11's line, then the commands
      hints.push_back(extras ? CLI::ExtrasError(extra).what() : e.what());
      hints.push_back(fmt::format("The commands of {}: {} ({} COMMAND --help)", path, fmt::join(commands, ", "), path));
    }
  }
  if (hints.empty() || !(not_expected || required)) {
    const int code = extras ? app.exit(CLI::ExtrasError(extra)) : app.exit(e);
    if (code != 0)
      for (const auto& line : hints) fmt::print(stderr, "{}\n", line);
    // --help and --version (code 0) printed to stdout: a full disk is an error there too
    return code == 0 ? metrale::cli::with_output_written(0) : code;
  }
  for (const auto& line : hints) fmt::print(stderr, "{}\n", line);
  fmt::print(stderr, "Run with --help for more information.\n");
  return extras ? static_cast<int>(CLI::ExitCodes::ExtrasError) : e.get_exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  // Log lines go to stderr, so that stdout holds only a command's output (--json stays JSON).
  metrale::remove_staged_files_on_signals();  // Ctrl-C leaves no half-written case or report
  spdlog::set_default_logger(spdlog::stderr_color_mt("metrale"));
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug, ...
  warn_unknown_log_levels();
  CLI::App app{"metrale: MLA decode kernels on the CUDA backend or the checked device emulator"};
  app.set_version_flag("--version", METRALE_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // --record and --record-limit after the command too (its subcommands inherit this)
  std::string record_dir;
  app.add_option("--record", record_dir, "write every launch as a kernel case file in DIR (emulator only)")
      ->option_text("DIR")
      ->check(metrale::cli::non_empty_path())
      ->each([](const std::string& dir) { metrale::cli::record_launches_to(dir); });
  std::uint64_t record_limit = 0;
  app.add_option("--record-limit", record_limit,
                 "the most bytes of case files --record writes (4GB unless METRALE_RECORD_LIMIT says otherwise); "
                 "a launch that could pass it fails before it runs")
      ->option_text("SIZE")
      ->transform(metrale::cli::size_in_bytes())  // (digits after it: the conversion below cannot fail)
      ->each([](const std::string& s) { metrale::cli::limit_recording_to(std::stoull(s)); });
  int exit_code = 0;
  metrale::cli::add_replay(app, [&](int code) { exit_code = code; });
  metrale::cli::add_info(app);
  metrale::cli::add_case(app, [&](int code) { exit_code = code; });
  metrale::cli::add_conform(app, [&](int code) { exit_code = code; });
  metrale::cli::add_bench(app);
  // The top's options a command that launches kernels takes too (fallthrough), named in its --help
  // (not in info's, nor a group's: they launch none).
  const std::function<void(CLI::App&)> name_top_options = [&](CLI::App& cmd) {
    for (CLI::App* sub : cmd.get_subcommands({})) {
      if (sub->get_subcommands({}).empty() && sub->get_name() != "info" && sub->get_name() != "show")
        sub->footer("Also taken here, as before the command: --record DIR, --record-limit SIZE (metrale --help).");
      name_top_options(*sub);
    }
  };
  name_top_options(app);
  // "--backend=" with nothing after the '=': CLI11 takes the next word as the value ("--backend:
  // 'x.safetensors' is not one of ...") or says a TEXT is missing (the adversarial trial,
  // forty-seventh session). Only where the first '=' ends the word, and the command named before
  // it (or one above, whose options it takes too) has an option of that name that takes a value:
  // a flag's "--json=" sets it, and an unknown name is CLI11's to name.
  const CLI::App* at = &app;
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    const std::string_view a = argv[i];
    for (const CLI::App* sub : at->get_subcommands({}))
      if (sub->check_name(std::string(a))) {
        at = sub;
        break;
      }
    if (!a.starts_with("--") || a.size() <= 3 || a.find('=') != a.size() - 1) continue;
    for (const CLI::App* up = at; up != nullptr; up = up->get_parent())
      if (const CLI::Option* o = up->get_option_no_throw(std::string(a.substr(0, a.size() - 1)));
          o != nullptr && o->get_items_expected_max() != 0) {
        fmt::print(stderr,
                   "metrale: {} has no value after the '=' (give {}VALUE, or the value as the next word)\n"
                   "Run with --help for more information.\n",
                   metrale::printable(a), metrale::printable(a));
        return static_cast<int>(CLI::ExitCodes::ValidationError);
      }
  }
  try {
    app.parse(argc, argv);
    if (record_dir.empty() && record_limit != 0) spdlog::warn("--record-limit without --record: nothing is recorded");
    if (!record_dir.empty() && !metrale::cli::recorder_made()) {
      // the command as typed: "case show", not "case"
      std::string command;
      for (const CLI::App* cmd = &app; !cmd->get_subcommands().empty();) {
        cmd = cmd->get_subcommands().front();
        command += (command.empty() ? "" : " ") + cmd->get_name();
      }
      spdlog::warn("--record {}: {} launches no kernels, so nothing was recorded", metrale::printable(record_dir),
                   command);
    }
  } catch (const CLI::ParseError& e) {
    return exit_on_parse_error(app, e, argc, argv, record_dir);
  } catch (const std::exception& e) {  // metrale's, or a library's own: still an error, never a crash
    // What the command printed first (info's list, which its error points to as "above"), then the error.
    std::fflush(stdout);
    // A print to a full or closed standard output throws from inside fmt ("cannot write to file"):
    // said as every command's end says it (the adversarial trial, forty-ninth session); another
    // error is still printed.
    const auto* failed = dynamic_cast<const std::system_error*>(&e);
    if (failed != nullptr && std::ferror(stdout) != 0 && std::string_view(e.what()).starts_with("cannot write to file"))
      return metrale::cli::with_output_written(2, failed->code().value());
    fmt::print(stderr, "{}\n", metrale::cli::error_line());
    return metrale::cli::with_output_written(2);
  }
  return metrale::cli::with_output_written(exit_code);
}
