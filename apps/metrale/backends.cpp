#include "backends.hpp"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "metrale/emu/emulator.hpp"
#include "metrale/error.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::cli {

namespace {
std::string g_record_dir;      // --record
std::uint64_t g_record_limit = 0;  // --record-limit (0: the emulator's default)
bool g_recorder_made = false;  // a backend made since, which records
#ifndef METRALE_WITH_CUDA
constexpr const char* kNotBuilt = "not built (no CUDA toolkit at configure time)";
#endif
}  // namespace

void record_launches_to(std::string dir) { g_record_dir = std::move(dir); }
void limit_recording_to(std::uint64_t bytes) { g_record_limit = bytes; }
std::uint64_t recording_limit() { return g_record_limit; }
bool recorder_made() { return g_recorder_made; }

bool recording_stopped(const GpuBackend& gpu) {
  const auto* emu = dynamic_cast<const emu::EmulatorBackend*>(&gpu);
  return emu != nullptr && emu->recording_stopped();
}

std::string backend_from_env() {
  const char* env = std::getenv("METRALE_BACKEND");
  return env != nullptr ? env : "";
}

std::unique_ptr<GpuBackend> make_backend(std::string choice) {
  const bool from_env = choice.empty();  // (an empty METRALE_BACKEND becomes auto, which is known)
  if (from_env) choice = backend_from_env();
  if (choice.empty()) choice = "auto";
  spdlog::debug("backend: asked for '{}'{}", choice, g_record_dir.empty() ? "" : ", recording to " + g_record_dir);
  if (!g_record_dir.empty()) {
    if (choice != "emu" && choice != "auto") {
      if (!from_env || choice != "cuda")  // (an unknown name stays an error)
        fail(Errc::invalid_argument, "--record {} needs the emulator, not backend {}", g_record_dir, choice);
      spdlog::info("--record {}: the emulator, not METRALE_BACKEND's {}", g_record_dir, printable(choice));
    }
    emu::EmulatorOptions o;
    o.record_dir = g_record_dir;
    o.record_limit_bytes = g_record_limit;
    auto gpu = std::make_unique<emu::EmulatorBackend>(o);
    g_recorder_made = true;
    return gpu;
  }
  if (choice == "emu") return std::make_unique<emu::EmulatorBackend>();
#ifdef METRALE_WITH_CUDA
  if (choice == "cuda") return std::make_unique<CudaBackend>();
  if (choice == "auto") {
    if (CudaBackend::available()) return std::make_unique<CudaBackend>();
    spdlog::info("backend auto: the emulator (cuda: {})", CudaBackend::unavailable_reason());
    return std::make_unique<emu::EmulatorBackend>();
  }
#else
  if (choice == "cuda")
    fail(Errc::unsupported, "backend cuda: this build has no CUDA backend (no toolkit at configure time)");
  if (choice == "auto") {
    spdlog::info("backend auto: the emulator (cuda: {})", kNotBuilt);
    return std::make_unique<emu::EmulatorBackend>();
  }
#endif
  fail(Errc::invalid_argument, "unknown backend '{}'{} (expected emu, cuda or auto)", printable(choice),
       from_env ? " from METRALE_BACKEND" : "");
}

std::vector<BackendStatus> backend_status() {
  std::vector<BackendStatus> out{{"emu", true, true, "CPU device emulator with checked memory"}};
#ifdef METRALE_WITH_CUDA
  if (CudaBackend::available()) {
    try {  // a driver that answers but no backend made (a bad METRALE_CUDA_CLUSTER_POLICY, a device
           // taken by another process): this says why, as the commands that need one fail on it
      CudaBackend gpu;
      out.push_back({"cuda", true, true,
                     fmt::format("{} (sm_{}), driver {}, built with CUDA {}", gpu.device_name(),
                                 gpu.compute_capability(), gpu.driver_version(), CudaBackend::toolkit_version())});
    } catch (const Error& e) {
      out.push_back({"cuda", true, false, e.what()});
    }
  } else {
    out.push_back({"cuda", true, false, CudaBackend::unavailable_reason()});
  }
#else
  out.push_back({"cuda", false, false, kNotBuilt});
#endif
  return out;
}

std::string cuda_unusable_reason() {
#ifdef METRALE_WITH_CUDA
  return CudaBackend::unavailable_reason();
#else
  return kNotBuilt;
#endif
}

}  // namespace metrale::cli
