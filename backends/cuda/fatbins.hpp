// The fatbins of kernels/*.cu embedded at build time (generated fatbins.cpp).
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace metrale {

/// The fatbin of module `name` (the `.cu` stem), or an empty span.
std::span<const unsigned char> cuda_fatbin(std::string_view name);

}  // namespace metrale
