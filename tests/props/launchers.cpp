#include "launchers.hpp"

#include <cmath>
#include <limits>

#include "arb.hpp"
#include "launcher_defs.hpp"

namespace metrale::props {

namespace defs {

float positive_float() { return arb_scale(1e-3f, 1e6f); }

float bad_positive_float() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  return *rc::gen::element(0.0f, -0.0f, -positive_float(), inf, -inf, std::numeric_limits<float>::quiet_NaN());
}

float non_finite_float() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  return *rc::gen::element(inf, -inf, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace defs

std::vector<Launcher> launchers() {
  auto all = defs::absorbed_launchers();
  for (auto& l : defs::fast_and_k3_launchers()) all.push_back(std::move(l));
  return all;
}

std::string describe(const ExpectedLaunch& e) {
  std::string s = fmt::format("{}.{} grid ({},{},{}) block ({},{},{})", e.module, e.entry, e.grid.x, e.grid.y,
                              e.grid.z, e.block.x, e.block.y, e.block.z);
  for (const auto& [name, a] : e.args) {
    if (a.kind == ArgKind::f32) {
      s += fmt::format(" {}={}", name, a.as_f32());
    } else if (a.kind == ArgKind::ptr) {
      s += fmt::format(" {}={:#x}", name, a.bits);
    } else {
      s += fmt::format(" {}={}", name, a.bits);
    }
  }
  return s;
}

}  // namespace metrale::props
