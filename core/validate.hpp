// Argument validation shared by the launchers (private to core). Every rule
// throws `invalid_argument` (or `unsupported`) with a message that starts with
// the kernel's name and names the bad value.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "metrale/device.hpp"
#include "metrale/error.hpp"

namespace metrale::detail {

/// CUDA's limits on gridDim.x, and on gridDim.y and gridDim.z.
inline constexpr std::uint32_t kMaxGridX = 0x7FFF'FFFF;
inline constexpr std::uint32_t kMaxGridYZ = 65535;

struct Validator {
  std::string_view kernel;

  void non_null(std::initializer_list<std::pair<const char*, DevicePtr>> ptrs) const {
    for (const auto& [name, p] : ptrs)
      if (!p) fail(Errc::invalid_argument, "{}: {} is null", kernel, name);
  }
  void positive(std::initializer_list<std::pair<const char*, std::uint64_t>> values) const {
    for (const auto& [name, v] : values)
      if (v == 0) fail(Errc::invalid_argument, "{}: {} is 0", kernel, name);
  }
  void at_most(const char* name, std::uint64_t value, std::uint64_t limit) const {
    if (value > limit) fail(Errc::invalid_argument, "{}: {} {} exceeds {}", kernel, name, value, limit);
  }
  void positive_finite(const char* name, float value) const {
    if (!std::isfinite(value) || value <= 0.0f)
      fail(Errc::invalid_argument, "{}: {} {} is not a finite positive number", kernel, name, value);
  }
  template <class... Args>
  void check(bool ok, fmt::format_string<Args...> format, Args&&... args) const {
    if (!ok) throw Error(Errc::invalid_argument, fmt::format("{}: ", kernel) + fmt::format(format, std::forward<Args>(args)...));
  }
};

}  // namespace metrale::detail
