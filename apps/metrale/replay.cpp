// metrale replay FILE: a golden model case through the decode chain, DeepSeek
// (paged FP8/NVFP4 cache, SPEC §3) or Kimi K3 (FP32 KV on the device, or on the
// host under K3_CUDA_MLA=0, SPEC §4).
#include "commands.hpp"

#include <chrono>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "metrale/error.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/model_case.hpp"

namespace metrale::cli {

namespace {

// How the run kept its KV: the paged cache's format for DeepSeek; for Kimi K3
// an unquantised FP32 KV, on the device or on the host (no blocks).
struct KvDescription {
  std::string model, kv_cache, kv_path;  // kv_path: "device" | "host" for Kimi K3, "" for DeepSeek
  std::uint32_t block_size = 0;
  std::string layout;  // DeepSeek: "separate" (a K and a V pool) or "latent" (one pool)
};

void print_table(const ReplayResult& r, const KvDescription& kv) {
  fmt::print("case        {}\nmodel       {}\nbackend     {}\n", r.case_name, kv.model, r.backend);
  if (kv.kv_path.empty()) {
    fmt::print("kv cache    {}, block size {}, {} pool{}\n\n", kv.kv_cache, kv.block_size, kv.layout,
               kv.layout == "latent" ? " (V = K)" : "s (K and V)");
  } else {
    fmt::print("kv cache    {}, {} KV ({})\n\n", kv.kv_cache, kv.kv_path,
               kv.kv_path == "device" ? "K3_CUDA_MLA=0 selects the host path" : "K3_CUDA_MLA=0");
  }
  // rel_l2 beside its tolerance (the check); max_abs after the result, for information
  fmt::print("{:<14} {:>11} {:>18}  {:<6} {:>11}\n", "tensor", "rel_l2", "rel_l2 tolerance", "result", "max_abs");
  for (const auto& m : r.metrics)
    fmt::print("{:<14} {:>11.3e} {:>18.1e}  {:<6} {:>11.3e}\n", m.name, m.rel_l2, m.tolerance, m.pass ? "ok" : "FAIL",
               m.max_abs);
  fmt::print("\n{:<52} {:>10}\n", "stage", "ms");
  for (const auto& [stage, ms] : r.stages) fmt::print("{:<52} {:>10.2f}\n", stage, ms);
  for (const auto& note : r.notes) fmt::print("\nnote: {}\n", note);
  fmt::print("\n{}\n", r.pass ? "PASS" : "FAIL");
}

void print_json(const ReplayResult& r, const KvDescription& kv) {
  nlohmann::ordered_json j;
  j["case"] = r.case_name;
  j["model"] = kv.model;
  j["backend"] = r.backend;
  j["kv_cache"] = kv.kv_cache;
  if (kv.kv_path.empty()) {
    j["block_size"] = kv.block_size;
    j["layout"] = kv.layout;
  } else {
    j["kv_path"] = kv.kv_path;  // Kimi K3 has no paged cache, so no block_size
  }
  for (const auto& m : r.metrics)
    j["metrics"][m.name] = {
        {"rel_l2", m.rel_l2}, {"rel_l2_tolerance", m.tolerance}, {"pass", m.pass}, {"max_abs", m.max_abs}};
  for (const auto& [stage, ms] : r.stages) j["stages_ms"][stage] = ms;
  j["pass"] = r.pass;
  j["notes"] = r.notes;
  // (A file name need not be UTF-8: such bytes print as U+FFFD.)
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
}

}  // namespace

void add_replay(CLI::App& app, std::function<void(int)> set_exit) {
  struct Opts {
    std::string file, backend, model = "deepseek", kv_cache = "fp8", layout = "separate";
    std::uint32_t block_size = 16;
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("replay", "run a golden model case through the decode step and compare");
  cmd->add_option("FILE", opts->file, "model case (.safetensors)")->required()->check(non_empty_path());
  cmd->add_option("--model", opts->model,
                  "decode chain: deepseek (paged absorbed MLA) or kimi-k3 (per-head MLA; device KV unless "
                  "K3_CUDA_MLA=0)")
      ->check(one_of({"deepseek", "kimi-k3"}))
      ->capture_default_str();
  cmd->add_option("--backend", opts->backend, "emu, cuda or auto (default: METRALE_BACKEND, else auto)")
      ->check(backend_name());
  auto* kv_opt = cmd->add_option("--kv-cache", opts->kv_cache, "paged cache format (deepseek)")
                     ->check(one_of({"fp8", "nvfp4"}))
                     ->capture_default_str();
  auto* bs_opt = cmd->add_option("--block-size", opts->block_size, "tokens per cache block (deepseek)")
                     ->transform(integer_in(1, 1u << 20))
                     ->capture_default_str();
  auto* layout_opt = cmd->add_option("--kv-layout", opts->layout,
                                     "paged cache pools (deepseek): separate (a K and a V pool, the seed ABI's) or "
                                     "latent (one pool as both: V = K, half the memory)")
                         ->check(one_of({"separate", "latent"}))
                         ->capture_default_str();
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->callback([opts, set_exit, kv_opt, bs_opt, layout_opt] {
    const bool kimi = opts->model == "kimi-k3";
    for (const CLI::Option* o : {kv_opt, bs_opt, layout_opt})  // a command-line mistake: CLI11's exit code
      if (kimi && o->count() != 0)
        throw CLI::ValidationError(o->get_name(),
                                   fmt::format("applies to --model deepseek (its paged cache), not {}", opts->model));
    {  // on the header, before the data is read
      const SafeTensors header = SafeTensors::read_header(opts->file);
      if (!is_model_case(header))
        fail(Errc::invalid_argument, "{} is not a model case (no q_nope tensor or heads metadata){}", opts->file,
             header.metadata.count("kind") != 0 && header.meta("kind") == "kernel"
                 ? ": run kernel cases with metrale case run"
             : is_format_tables(header) ? ": it holds the number-format tables, which the formats tests read"
                                        : "");
      // its metadata and shapes too (adversarial trial, fiftieth session: a 2.5 GB file was read
      // whole before "no metadata key 'kv_lora_rank'")
      with_context(opts->file, [&] { check_model_case_header(header); });
    }
    const SafeTensors file = SafeTensors::read(opts->file, SafeTensors::Use::model_case);
    if (!kimi && file.has("gate"))
      spdlog::warn("{} has an output gate: --model deepseek ignores it (--model kimi-k3 applies it)", opts->file);
    auto gpu = make_backend(opts->backend);
    const std::string name = excerpt(  // printed: its control characters escaped, cut short
        file.metadata.count("case") != 0 ? file.meta("case") : std::filesystem::path(opts->file).stem().string());
    ReplayResult r;
    KvDescription kv{opts->model, "", "", 0, ""};
    // (read outside the file's context: a bad K3_CUDA_MLA is no fault of the file)
    const bool device_path = kimi && mla_kv_placement_from_env() == MlaKvPlacement::device;
    with_context(opts->file, [&] {  // what the file lacks or holds wrong, named with the file
      if (kimi) {
        // Where it is, every 10 s on the log (fresh-user trial, forty-fourth session: a replay near
        // its work bound ran six minutes without a word).
        auto last = std::chrono::steady_clock::now();
        r = replay_kimi_case(*gpu, file, name, device_path, [&](std::uint32_t done, std::uint32_t tokens) {
          if (const auto now = std::chrono::steady_clock::now();
              now - last >= std::chrono::seconds(10) && done < tokens) {
            last = now;
            spdlog::info("replay: {} of {} tokens decoded", done, tokens);
          }
        });
        kv.kv_cache = "f32";
        kv.kv_path = device_path ? "device" : "host";
      } else {
        r = replay_deepseek_case(*gpu, file, name,
                                 {parse_kv_format(opts->kv_cache), opts->block_size, opts->layout == "latent"});
        kv.kv_cache = std::string(to_string(r.kv_cache));
        kv.block_size = r.block_size;
        kv.layout = r.latent ? "latent" : "separate";
      }
    });
    opts->json ? print_json(r, kv) : print_table(r, kv);
    set_exit(r.pass ? 0 : 1);
  });
}

}  // namespace metrale::cli
