// metrale replay FILE: a golden model case through the decode chain.
#include "commands.hpp"

#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "metrale/model_case.hpp"

namespace metrale::cli {

namespace {

void print_table(const ReplayResult& r) {
  fmt::print("case        {}\nbackend     {}\nkv cache    {}, block size {}\n\n", r.case_name, r.backend,
             to_string(r.kv_cache), r.block_size);
  fmt::print("{:<12} {:>11} {:>11} {:>11}  {}\n", "tensor", "rel_l2", "max_abs", "tolerance", "result");
  for (const auto& m : r.metrics)
    fmt::print("{:<12} {:>11.3e} {:>11.3e} {:>11.1e}  {}\n", m.name, m.rel_l2, m.max_abs, m.tolerance,
               m.pass ? "ok" : "FAIL");
  fmt::print("\n{:<48} {:>10}\n", "stage", "ms");
  for (const auto& [stage, ms] : r.stages) fmt::print("{:<48} {:>10.2f}\n", stage, ms);
  fmt::print("\n{}\n", r.pass ? "PASS" : "FAIL");
}

void print_json(const ReplayResult& r) {
  nlohmann::ordered_json j;
  j["case"] = r.case_name;
  j["backend"] = r.backend;
  j["kv_cache"] = to_string(r.kv_cache);
  j["block_size"] = r.block_size;
  for (const auto& m : r.metrics)
    j["metrics"][m.name] = {{"rel_l2", m.rel_l2}, {"max_abs", m.max_abs}, {"tolerance", m.tolerance}, {"pass", m.pass}};
  for (const auto& [stage, ms] : r.stages) j["stages_ms"][stage] = ms;
  j["pass"] = r.pass;
  std::cout << j.dump(2) << '\n';
}

}  // namespace

void add_replay(CLI::App& app, std::function<void(int)> set_exit) {
  struct Opts {
    std::string file, backend, kv_cache = "fp8";
    std::uint32_t block_size = 16;
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("replay", "run a golden model case through the decode step and compare");
  cmd->add_option("FILE", opts->file, "model case (.safetensors)")->required();
  cmd->add_option("--backend", opts->backend, "emu, cuda or auto (default: METRALE_BACKEND, else auto)");
  cmd->add_option("--kv-cache", opts->kv_cache, "paged cache format")->check(CLI::IsMember({"fp8", "nvfp4"}));
  cmd->add_option("--block-size", opts->block_size, "tokens per cache block")->check(CLI::Range(1u, 1u << 20));
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->callback([opts, set_exit] {
    const SafeTensors file = SafeTensors::read(opts->file);
    auto gpu = make_backend(opts->backend);
    const std::string name =
        file.metadata.count("case") != 0 ? file.meta("case") : std::filesystem::path(opts->file).stem().string();
    const ReplayResult r = replay_deepseek_case(*gpu, file, name, {parse_kv_format(opts->kv_cache), opts->block_size});
    opts->json ? print_json(r) : print_table(r);
    set_exit(r.pass ? 0 : 1);
  });
}

}  // namespace metrale::cli
