#include "backends.hpp"

#include <cstdlib>

#include "metrale/emu/emulator.hpp"
#include "metrale/error.hpp"

namespace metrale::cli {

std::unique_ptr<GpuBackend> make_backend(std::string choice) {
  if (choice.empty()) {
    const char* env = std::getenv("METRALE_BACKEND");
    choice = env != nullptr && *env != '\0' ? env : "auto";
  }
  if (choice == "emu" || choice == "auto") return std::make_unique<emu::EmulatorBackend>();
  if (choice == "cuda") fail(Errc::unsupported, "backend cuda: this build has no CUDA backend");
  fail(Errc::invalid_argument, "unknown backend '{}' (expected emu, cuda or auto)", choice);
}

std::vector<BackendStatus> backend_status() {
  return {{"emu", true, true, "CPU device emulator with checked memory"},
          {"cuda", false, false, "not built (CUDA toolkit not found at configure time)"}};
}

}  // namespace metrale::cli
