// What the dispatchers of the fast paths (DeepSeek's mla_fast, K3's k3_fast) share: the workspace
// their split kernels write partial results to, and which path ran.
#pragma once

#include <cstdint>

#include "metrale/backend.hpp"
#include "metrale/buffer.hpp"

namespace metrale {

/// A device buffer reused across decode steps, grown when a step needs more.
class DecodeWorkspace {
 public:
  /// At least `bytes` of device memory. Errors: the backend's alloc.
  DevicePtr get(GpuBackend& gpu, std::uint64_t bytes) {
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
