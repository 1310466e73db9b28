// Backend selection for the CLI (SPEC §1): --backend emu|cuda|auto, or
// METRALE_BACKEND; auto = CUDA when a device answers, else the emulator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "metrale/backend.hpp"

namespace metrale::cli {

/// The names a backend may be asked for by: emu, cuda, auto.
inline constexpr const char* kBackendNames[] = {"emu", "cuda", "auto"};
/// What a command without --backend asks for: METRALE_BACKEND when it is set and not empty (any
/// text: make_backend refuses an unknown name), else nothing.
std::string backend_from_env();

/// The backend named `choice` ("" = backend_from_env(), else "auto"). Errors:
/// `invalid_argument` for an unknown name; `unsupported` when CUDA is asked
/// for but not built or no device answers.
std::unique_ptr<GpuBackend> make_backend(std::string choice);

/// `--record DIR`: every backend made from now on is an emulator that writes
/// each launch to DIR as a kernel case file. Asking for CUDA then is an
/// `invalid_argument` error.
void record_launches_to(std::string dir);
/// `--record-limit`: the most bytes of case files a recording writes (EmulatorOptions::
/// record_limit_bytes; 0 = its default).
void limit_recording_to(std::uint64_t bytes);
/// What limit_recording_to set (0: none, the emulator's default then).
std::uint64_t recording_limit();
/// Whether a backend was made since record_launches_to (a command without one, like `info`,
/// records nothing: main says so).
bool recorder_made();
/// Whether `gpu` is a recording emulator whose recording stopped at its limit (--record-limit):
/// every later launch would be refused, so a command that runs many cases stops there.
bool recording_stopped(const GpuBackend& gpu);

struct BackendStatus {
  std::string name;
  bool built = false;
  bool can_run = false;
  std::string detail;
};
/// Every backend this binary knows, whether it was built and whether it runs here.
std::vector<BackendStatus> backend_status();
/// Why the CUDA backend cannot run here ("" where a device answers), without making one (no
/// context on the GPU): for the commands that need a device to say why they have none.
std::string cuda_unusable_reason();

}  // namespace metrale::cli
