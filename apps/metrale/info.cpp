// metrale info: version, backends, emulator settings.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends.hpp"
#include "commands.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/mla_fast.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::cli {

namespace {

// The emulator's settings and what its plans dispatch, as `info` lists them.
void print_emulator(const emu::EmulatorBackend& emu) {
  const auto& o = emu.options();
  fmt::print("\nemulator\n  worker threads        {}\n  uninitialised reads   {}\n  cross-block races     {}\n",
             emu.threads(), o.check_uninitialized ? "checked" : "off", o.detect_races ? "checked" : "off");
  fmt::print("  shared memory/block   {} bytes\n", emu.max_shared_bytes_per_block());
  fmt::print("  accesses/block        at most {} (METRALE_EMU_BLOCK_ACCESSES)\n", o.max_block_accesses);
  fmt::print("  accesses/launch       at most {} (METRALE_EMU_LAUNCH_ACCESSES)\n", o.max_launch_accesses);
  fmt::print("  case files (--record) at most {} bytes a run ({})\n", o.record_limit_bytes,
             recording_limit() != 0 ? "--record-limit" : "METRALE_RECORD_LIMIT, else 4 GB");
  // Which of mla_wgmma's blocks the plans dispatch here, per format (576-wide rows), and why none
  // (said once, below the list).
  const std::string why_none =
      module_runs_on(emu, kMlaWgmmaModule)
          ? "too little shared memory"
          : fmt::format("mla_wgmma is sm_90a only, and this plays sm_{}", emu.compute_capability());
  bool any_none = false;
  auto listed = [&](const std::vector<std::string>& fit) {
    any_none = any_none || fit.empty();
    return fit.empty() ? std::string("none") : fmt::format("{}", fmt::join(fit, ", "));
  };
  auto formats = [&](const char* entry) {
    std::vector<std::string> fit;
    for (const char* f : {"fp8", "nvfp4"})
      if (!entry_unavailable(emu, kMlaWgmmaModule, fmt::format("{}_{}", entry, f))) fit.emplace_back(f);
    return listed(fit);
  };
  // The formats whose 16-head blocks the plan stages here, asked for a problem with many tiles
  // per block slot (128 sequences of 64K keys).
  std::vector<std::string> staged16;
  for (const KvFormat f : {KvFormat::fp8, KvFormat::nvfp4}) {
    try {
      PagedDecodeCommon big;
      big.num_seqs = 128, big.num_q_heads = 16, big.q_head_dim = big.kv_cache_dim = 576;
      big.block_size = 64, big.max_blocks_per_seq = 1024;
      const SplitPlan p = plan_split_decode(big, f, 0, emu.multiprocessor_count(), emu.max_shared_bytes_per_block(),
                                            module_runs_on(emu, kMlaWgmmaModule));
      if (p.wgmma && p.rows_per_block == 16 && p.staged) staged16.emplace_back(to_string(f));
    } catch (const Error&) {  // not even a 16-head split block fits: no wgmma either
    }
  }
  fmt::print("  plays                 sm_{}, {} SMs (the decode plans size their grids for it)\n",
             emu.compute_capability(), emu.multiprocessor_count());
  fmt::print("  576-wide decode rows  mla_wgmma's 64-head blocks above 32 heads: {}\n",
             formats("mla_paged_decode_wgmma"));
  fmt::print(
      "                        one latent pool (v_cache = k_cache), a table of 4096 keys or more\n"
      "                        (max_blocks_per_seq x block_size): the heads-in-M\n"
      "                        block (its combine in clusters where the plan fuses), {}\n",
      formats("mla_paged_decode_wgmma_latent"));
  fmt::print("                        its 16-head blocks up to 16 heads: {}\n", formats("mla_paged_decode_wgmma16"));
  fmt::print(
      "                        staged 16-head blocks where a block has many tiles (two pools;\n"
      "                        over one latent pool FP8 only): {}\n",
      listed(staged16));
  fmt::print("                        anything else: mla_fast's mma.sync blocks, or the seed kernel\n");
  if (any_none) fmt::print("                        (none: {})\n", why_none);
  fmt::print("  kernels registered    {}\n", emu.registry().entries().size());
  for (const auto& e : emu.registry().entries())
    fmt::print("    {:<56} {} parameters\n", e.full_name(), e.params.size());
}

}  // namespace

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "version, backends and emulator settings");
  cmd->callback([] {
    const auto t0 = std::chrono::steady_clock::now();
    emu::EmulatorOptions options;  // as a recording run's: --record-limit, else METRALE_RECORD_LIMIT
    options.record_limit_bytes = recording_limit();
    // The settings info reports as errors (the commands that use them refuse them): after the
    // whole list, info exits 2 naming them (the fresh-user trials, forty-sixth session: the CUDA
    // settings had exited 0; forty-seventh: an emulator setting had ended info before its list).
    std::vector<std::string> in_error;
    std::optional<const emu::EmulatorBackend> emu;
    std::string emu_error;
    try {
      emu.emplace(options);
    } catch (const Error& e) {  // a bad setting's message begins with it: "METRALE_EMU_THREADS='abc' is not ..."
      emu_error = e.what();
      const std::size_t eq = emu_error.find('=');
      const bool setting = emu_error.starts_with("METRALE_") && eq != std::string::npos &&
                           emu_error.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == eq;
      in_error.push_back(setting ? emu_error.substr(0, eq) : "the emulator");  // (a worker thread that did not start)
    }
    fmt::print("metrale {}\n\nbackends\n", METRALE_VERSION);
    const auto statuses = backend_status();
    for (const auto& b : statuses)
      fmt::print("  {:<6} built: {:<3}  runs here: {:<3}  {}\n", b.name, b.built ? "yes" : "no",
                 b.can_run ? "yes" : "no", b.detail);
    // What a command without --backend asks for (make_backend refuses an unknown name then).
    const std::string choice = backend_from_env();
    if (choice.empty()) {
      fmt::print("  without --backend: auto (METRALE_BACKEND {})\n",
                 std::getenv("METRALE_BACKEND") ? "empty" : "unset");
    } else if (std::ranges::find(kBackendNames, choice) != std::end(kBackendNames)) {
      // A backend that cannot run here is said beside it (the fresh-user trial, forty-eighth
      // session: info read as fine while every kernel command failed); not an error of the
      // setting itself, so info still exits 0.
      const auto it = std::ranges::find_if(statuses, [&](const auto& b) { return b.name == choice; });
      const bool runs = choice == "auto" || (it != statuses.end() && it->can_run);
      fmt::print("  without --backend: {} (METRALE_BACKEND){}\n", choice,
                 runs ? "" : "; it cannot run here, so the commands that run kernels fail without --backend");
    } else {
      fmt::print("  without --backend: an error: METRALE_BACKEND '{}' is not emu, cuda or auto\n", printable(choice));
      in_error.emplace_back("METRALE_BACKEND");
    }
    // Kernel images the CUDA backend would load from METRALE_CUDA_FATBIN_DIR instead of its own.
    const char* fatbin_dir = std::getenv("METRALE_CUDA_FATBIN_DIR");
    if (fatbin_dir == nullptr || *fatbin_dir == '\0') {
      fmt::print("  cuda kernel images: built in (METRALE_CUDA_FATBIN_DIR unset)\n");
    } else if (std::error_code ec; !std::filesystem::is_directory(fatbin_dir, ec)) {
      fmt::print("  cuda kernel images: an error: METRALE_CUDA_FATBIN_DIR '{}' is not a folder\n",
                 printable(fatbin_dir));
      in_error.emplace_back("METRALE_CUDA_FATBIN_DIR");
    } else {
      std::set<std::string> modules, found;
      std::vector<std::string> not_files;  // the CUDA backend refuses these (cuda_backend.cpp)
      emu::Registry ports;                 // the kernels' modules, whether or not the emulator's settings hold
      emu::register_all_ports(ports);
      for (const auto& e : ports.entries()) modules.insert(e.module);
      for (const auto& m : modules) {
        const auto path = std::filesystem::path(fatbin_dir) / (m + ".fatbin");
        if (std::filesystem::is_regular_file(path, ec))
          found.insert(m);
        else if (std::filesystem::exists(path, ec))
          not_files.push_back(printable(path.string()));
      }
      if (!not_files.empty()) {
        fmt::print("  cuda kernel images: an error: {} {} not a regular file (METRALE_CUDA_FATBIN_DIR)\n",
                   fmt::join(not_files, ", "), not_files.size() == 1 ? "is" : "are");
        in_error.emplace_back("METRALE_CUDA_FATBIN_DIR");
      } else if (found.empty())
        fmt::print("  cuda kernel images: built in (METRALE_CUDA_FATBIN_DIR '{}' holds no <module>.fatbin)\n",
                   printable(fatbin_dir));
      else
        fmt::print("  cuda kernel images: {} from METRALE_CUDA_FATBIN_DIR '{}', {} built in\n", fmt::join(found, ", "),
                   printable(fatbin_dir), modules.size() - found.size());
      // A .fatbin named after no module (a typo) is never loaded: the built-in image runs instead.
      std::set<std::string> strays;
      for (const auto& entry : std::filesystem::directory_iterator(fatbin_dir, ec))
        if (const auto name = entry.path().filename();
            name.extension() == ".fatbin" && !modules.contains(name.stem().string()))
          strays.insert(printable(name.string()));
      if (!strays.empty())
        fmt::print("  cuda kernel images: not loaded, named after no module ({}): {}\n", fmt::join(modules, ", "),
                   fmt::join(strays, ", "));
    }
#ifdef METRALE_WITH_CUDA
    // How the CUDA backend asks for a cluster's blocks to be placed (an error there, as for the
    // kernel images: the CUDA backend refuses it when made).
    const char* policy_env = std::getenv("METRALE_CUDA_CLUSTER_POLICY");
    const char* policy_from = policy_env == nullptr ? " unset" : *policy_env == '\0' ? " empty" : "";
    try {
      fmt::print("  cuda cluster placement: {} (METRALE_CUDA_CLUSTER_POLICY{})\n",
                 CudaBackend::cluster_policy_setting(), policy_from);
    } catch (const Error& e) {
      fmt::print("  cuda cluster placement: an error: {}\n", e.what());
      in_error.emplace_back("METRALE_CUDA_CLUSTER_POLICY");
    }
#endif
    if (emu) {
      print_emulator(*emu);
    } else {
      fmt::print("\nemulator\n  an error: {}\n", emu_error);
    }
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("\n{:<48} {:>10}\n{:<48} {:>10.2f}\n", "stage", "ms", "start emulator and list", ms);
    if (!in_error.empty())
      fail(Errc::invalid_argument, "info: {} (above) {} an error: the commands that use {} refuse {}",
           fmt::join(in_error, ", "), in_error.size() == 1 ? "is" : "are", in_error.size() == 1 ? "it" : "them",
           in_error.size() == 1 ? "it" : "them");
  });
}

}  // namespace metrale::cli
