// What the dispatchers of the fast paths (DeepSeek's mla_fast, K3's k3_fast) share: the workspace
// their split kernels write partial results to, and which path ran.
#pragma once

#include <cstdint>

#include "metrale/backend.hpp"
#include "metrale/buffer.hpp"
#include "metrale/error.hpp"

namespace metrale {

/// A device buffer reused across decode steps, grown when a step needs more. It belongs to the
/// backend it first allocated on (one workspace per backend: another's addresses may be live
/// buffers there).
class DecodeWorkspace {
 public:
  /// At least `bytes` of device memory on `gpu`. Errors: `invalid_argument` when the workspace
  /// holds a buffer of another backend (nothing is freed or allocated); the backend's alloc.
  DevicePtr get(GpuBackend& gpu, std::uint64_t bytes) {
    if (!buffer_.empty() && buffer_.backend() != &gpu)
      fail(Errc::invalid_argument,
           "decode workspace: its {} bytes at {:#x} live on another backend object ({}) than the one asked ({}); "
           "use one workspace per backend",
           buffer_.bytes(), buffer_.ptr().addr, buffer_.backend()->name(), gpu.name());
    if (buffer_.bytes() < bytes) {
      buffer_.reset();
      buffer_ = DeviceBuffer(gpu, bytes);
    }
    return buffer_.ptr();
  }

 private:
  DeviceBuffer buffer_;
};

/// Which kernels a dispatcher ran: the seed kernel, or the split kernel and its combine.
enum class DecodePath { seed, split };

}  // namespace metrale
