// Shared test helpers: where the golden files are, NaN poisoning, error checks.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "metrale/error.hpp"

namespace metrale::test {

/// `../shared/golden` beside the checkout (CI has it there), or
/// `METRALE_GOLDEN_DIR`.
inline std::filesystem::path golden_dir() {
  if (const char* env = std::getenv("METRALE_GOLDEN_DIR")) return env;
  return std::filesystem::path(METRALE_SOURCE_DIR) / ".." / "shared" / "golden";
}

/// A golden file: from golden_dir(), else the copy shipped in cases/golden.
inline std::filesystem::path golden(const std::string& name) {
  auto p = golden_dir() / name;
  if (std::filesystem::exists(p)) return p;
  return std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "golden" / name;
}

/// Run `body`, require it to throw `Error` with `code` and a message that
/// contains every string of `needles`.
template <class F>
void require_error(F&& body, Errc code, std::initializer_list<std::string> needles) {
  try {
    body();
  } catch (const Error& e) {
    INFO("error: " << e.what());
    CHECK(to_string(e.code()) == to_string(code));
    for (const auto& n : needles) CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains(n));
    return;
  }
  FAIL("no metrale::Error was thrown");
}

/// ‖a − b‖ / ‖b‖ (b the reference); NaN anywhere gives NaN.
inline double rel_l2(std::span<const double> a, std::span<const double> b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

}  // namespace metrale::test
