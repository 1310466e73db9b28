// Shared test helpers: where the golden files are, NaN poisoning, error checks.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "metrale/emu/emulator.hpp"
#include "metrale/error.hpp"
#include "metrale/kernel_case.hpp"
#include "metrale/mla_fast.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::test {

/// A golden file: from `METRALE_GOLDEN_DIR` when it is set and not empty (a test fails when that
/// folder does not hold it: the run asked for those files), else from `../shared/golden` beside
/// the checkout (CI has it there), else the copy shipped in cases/golden.
inline std::filesystem::path golden(const std::string& name) {
  if (const char* env = std::getenv("METRALE_GOLDEN_DIR"); env != nullptr && *env != '\0') {
    const auto p = std::filesystem::path(env) / name;
    if (!std::filesystem::is_regular_file(p)) FAIL("METRALE_GOLDEN_DIR=" << env << " holds no file " << name);
    return p;
  }
  const auto shared = std::filesystem::path(METRALE_SOURCE_DIR) / ".." / "shared" / "golden" / name;
  if (std::filesystem::exists(shared)) return shared;
  return std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "golden" / name;
}

/// A folder under the temporary directory for one test, named `name` and this process's id, so that
/// two checkouts testing at once do not share it.
inline std::filesystem::path scratch_dir(const std::string& name) {
  return std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
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

/// A DeepSeek golden case's tensors times powers of two: q by 2^e, the KV rows (kv_latent,
/// k_rope) by 2^-e, and the file's expected outputs to match (q_absorbed by 2^e; o_latent and
/// attn_out, linear in V, by 2^-e). The logits are unchanged, so a replay's errors are the
/// unscaled case's as long as the cache holds the smaller values.
inline SafeTensors scaled_case(SafeTensors f, int e) {
  const auto scale = [&f](const char* name, int by) {
    auto values = f.at(name).to_f32();
    for (float& v : values) v = std::ldexp(v, by);
    f.tensors[name] = Tensor::from<float>(f.at(name).shape, values);
  };
  for (const char* name : {"q_nope", "q_rope", "q_absorbed"}) scale(name, e);
  for (const char* name : {"kv_latent", "k_rope", "o_latent", "attn_out"}) scale(name, -e);
  return f;
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

/// The backends kernel tests run on: the emulator, and CUDA when a device
/// answers (said once, on the first call, when it does not).
inline std::vector<std::string> backends() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n{"emu"};
#ifdef METRALE_WITH_CUDA
    if (CudaBackend::available()) {
      n.push_back("cuda");
    } else {
      WARN("kernel tests skip the CUDA backend: " << CudaBackend::unavailable_reason());
    }
#else
    WARN("kernel tests skip the CUDA backend: not built");
#endif
    return n;
  }();
  return names;
}

inline std::unique_ptr<GpuBackend> make_backend(const std::string& name) {
#ifdef METRALE_WITH_CUDA
  if (name == "cuda") {
    // One backend kept for the whole run holds the device's primary context: without it each
    // backend's end releases the context, and the next one creates it again (about 0.1 s each,
    // thousands of times over the properties).
    static const CudaBackend keep_context;
    return std::make_unique<CudaBackend>();
  }
#endif
  (void)name;
  return std::make_unique<emu::EmulatorBackend>();
}

/// Run `c` on `gpu` and check each output against the case's expectation, within the case's
/// tolerance for it (`required`: the case must give one; else a missing one is Tolerance{}).
/// Returns the outputs.
inline std::map<std::string, Tensor> check_expected(GpuBackend& gpu, const KernelCase& c, bool required = true) {
  auto out = run_kernel_case(gpu, c);
  for (const auto& [param, want] : c.expected) {
    const Tolerance tol = required || c.tolerance.count(param) ? c.tolerance.at(param) : Tolerance{};
    const auto r = check_output(param, out.at(param), want, tol);
    INFO(param << ": " << r.bad << " of " << r.count << " outside the tolerance, worst " << r.worst);
    CHECK(r.pass);
  }
  return out;
}

/// Run `c` on every test backend: each output against the case's expectation,
/// and a device's against the emulator's for the same arithmetic.
inline void check_case(const KernelCase& c) {
  INFO("case: " << c.name);
  std::map<std::string, Tensor> emu_out;
  for (const auto& name : backends()) {
    INFO("backend: " << name);
    auto gpu = make_backend(name);
    if (entry_unavailable(*gpu, c.module, c.entry)) continue;  // mla_wgmma off sm_90 or in too little shared memory
    auto out = check_expected(*gpu, c, false);
    if (name == "emu") {
      emu_out = std::move(out);
      continue;
    }
    for (const auto& [param, want] : c.expected) {
      const auto& ref = emu_out.at(param);
      const auto same = check_output(param, out.at(param), ref, backend_tolerance(c, param, ref));
      INFO(param << " against the emulator: " << same.bad << " of " << same.count << " differ, worst " << same.worst);
      CHECK(same.pass);
    }
  }
}

}  // namespace metrale::test
