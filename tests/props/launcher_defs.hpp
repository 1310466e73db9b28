// Building blocks of launchers.cpp's definitions (private to tests/props/): a typed launcher
// definition, sentinel draws, and the rule kinds every launcher shares (null pointer, zero count,
// value past a limit, bad float).
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <algorithm>
#include <bit>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "arb.hpp"
#include "launchers.hpp"
#include "props.hpp"  // emulated_multiprocessors

namespace metrale::props::defs {

constexpr std::uint32_t kU32Max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint32_t kI32Max = 0x7FFF'FFFF;

/// A launcher over its argument struct: draw, launch, expected record, rules.
template <class Args>
struct Def {
  const char* module;
  const char* entry;
  std::function<Args()> arb;
  std::function<void(GpuBackend&, KernelHandle, const Args&)> launch;
  std::function<ExpectedLaunch(const Args&)> expect;
  std::vector<std::function<BrokenRule(Args&)>> rules;
};

template <class Args>
class TypedArgs final : public LauncherArgs {
 public:
  TypedArgs(std::shared_ptr<const Def<Args>> def, Args a) : def_(std::move(def)), a_(std::move(a)) {}
  ExpectedLaunch expected() const override { return def_->expect(a_); }
  void launch(GpuBackend& gpu, KernelHandle kernel) const override { def_->launch(gpu, kernel, a_); }
  std::size_t rules() const override { return def_->rules.size(); }
  BrokenRule break_rule(std::size_t i) override { return def_->rules.at(i)(a_); }

 private:
  std::shared_ptr<const Def<Args>> def_;
  Args a_;
};

template <class Args>
Launcher erase(Def<Args> d) {
  auto def = std::make_shared<const Def<Args>>(std::move(d));
  return {def->module, def->entry,
          [def]() -> std::unique_ptr<LauncherArgs> { return std::make_unique<TypedArgs<Args>>(def, def->arb()); }};
}

/// A value in [lo, hi] (both included), drawn over the whole range whatever rapidcheck's size
/// (sentinels should be far apart from the first case on); it still shrinks towards lo.
inline std::uint64_t u64(std::uint64_t lo, std::uint64_t hi) {
  return hi == ~0ull ? std::max(lo, *rc::gen::resize(100, rc::gen::arbitrary<std::uint64_t>()))
                     : *rc::gen::resize(100, rc::gen::inRange<std::uint64_t>(lo, hi + 1));
}
inline std::uint32_t u(std::uint32_t lo, std::uint32_t hi) { return static_cast<std::uint32_t>(u64(lo, hi)); }
inline bool coin() { return *rc::gen::arbitrary<bool>(); }

/// The most bytes a drawn buffer may span: a sentinel's slot (2^56 bytes) less its offset, so
/// that the launchers' overlap checks see buffers apart.
inline constexpr std::uint64_t kMaxExtent = 1ull << 54;

/// A value in [lo, hi] small enough that `value` × `unit_bytes` stays within kMaxExtent (lo if
/// even lo is not: the caller's other factors must leave room).
inline std::uint32_t u_fit(std::uint32_t lo, std::uint32_t hi, std::uint64_t unit_bytes) {
  return u(lo, static_cast<std::uint32_t>(
                   std::clamp<std::uint64_t>(kMaxExtent / std::max<std::uint64_t>(unit_bytes, 1), lo, hi)));
}

/// Distinct, non-null, 256-byte aligned device addresses (never dereferenced: dry runs): the
/// i-th drawn one lies at a random 256-byte step in the first 4 GiB of its own 2^56-byte slot
/// (slots below 0x100). A second Sentinels of one argument set takes another `first_slot`.
class Sentinels {
 public:
  explicit Sentinels(std::uint64_t first_slot = 0x10) : next_slot_(first_slot) {}
  DevicePtr next() {
    const std::uint64_t slot = next_slot_++;
    return DevicePtr{(slot << 56) + u64(0, (1ull << 24) - 1) * 256};
  }

 private:
  std::uint64_t next_slot_;
};

/// A finite float, any sign (inv_sqrt_d, logit_scale).
inline float finite_float() {
  return static_cast<float>(*rc::gen::resize(100, rc::gen::inRange(-1'000'000, 1'000'001))) / static_cast<float>(u(1, 1000));
}
/// A finite float > 0 that is not a power of two.
float positive_float();

/// A float no "finite positive" rule accepts: 0, −0, negative, ±inf, NaN.
float bad_positive_float();
/// ±inf or NaN.
float non_finite_float();

inline ExpectedLaunch launch_of(const char* module, const char* entry, Dim3 grid, Dim3 block) {
  return {module, entry, grid, block, {}};
}
/// Output rows per block of the wide GEMV, from its contract: a row per segment of
/// S = bit_floor(min(32, k/16)) lanes (at least 1), 2 steps of 32/S rows per warp, 8 warps.
inline std::uint32_t wide_gemv_rows(std::uint32_t k) {
  return 8 * 2 * (32 / std::max(1u, std::bit_floor(std::min(32u, k / 16))));
}
/// The combine's blocks per (sequence, head) on the emulator's SMs (emulated_multiprocessors:
/// 132, or 48 playing a GB10): enough for 8 blocks an SM, at most one per 64-dim tile, at least one.
inline std::uint32_t combine_blocks(std::uint32_t heads, std::uint32_t seqs, std::uint32_t dim) {
  const std::uint64_t n = std::uint64_t{heads} * seqs, want = (8ull * emulated_multiprocessors() + n - 1) / n,
                      tiles = (dim + 63ull) / 64;
  return static_cast<std::uint32_t>(std::max<std::uint64_t>(1, std::min(want, tiles)));
}

inline KernelArg P(DevicePtr p) { return KernelArg::ptr(p); }
inline KernelArg U(std::uint32_t v) { return KernelArg::u32(v); }
inline KernelArg F(float v) { return KernelArg::f32(v); }
inline KernelArg Q(std::uint64_t v) { return KernelArg::u64(v); }

/// Rule: `field` null. Message "<kernel>: <name> is null".
template <class Args>
std::function<BrokenRule(Args&)> null_rule(const char* kernel, const char* name, DevicePtr Args::*field) {
  return [=](Args& a) {
    a.*field = {};
    return BrokenRule{fmt::format("{} null", name), Errc::invalid_argument, {kernel, fmt::format("{} is null", name)}};
  };
}
/// Rule: `field` 0. Message "<kernel>: <name> is 0".
template <class Args, class Member>
std::function<BrokenRule(Args&)> zero_rule(const char* kernel, const char* name, Member field) {
  return [=](Args& a) {
    a.*field = 0;
    return BrokenRule{fmt::format("{} 0", name), Errc::invalid_argument, {kernel, fmt::format("{} is 0", name)}};
  };
}
/// Rule: `field` past `limit`. Message "<kernel>: <name> <value> exceeds <limit>".
template <class Args>
std::function<BrokenRule(Args&)> over_rule(const char* kernel, const char* name, std::uint32_t Args::*field,
                                           std::uint32_t limit) {
  return [=](Args& a) {
    a.*field = u(limit + 1, kU32Max);
    return BrokenRule{fmt::format("{} past {}", name, limit),
                      Errc::invalid_argument,
                      {kernel, fmt::format("{} {} exceeds {}", name, a.*field, limit)}};
  };
}
/// Rule: a scale that is not finite and positive. Message names the field.
template <class Args>
std::function<BrokenRule(Args&)> scale_rule(const char* kernel, const char* name, float Args::*field) {
  return [=](Args& a) {
    a.*field = bad_positive_float();
    return BrokenRule{fmt::format("{} {}", name, a.*field),
                      Errc::invalid_argument,
                      {kernel, fmt::format("{} {} is not a finite positive number", name, a.*field)}};
  };
}

// An E4M3 scale whose product with the largest code (448) is past FP32's range.
template <class Args>
std::function<BrokenRule(Args&)> e4m3_scale_rule(const char* kernel, const char* name, float Args::*field) {
  return [=](Args& a) {
    a.*field = std::numeric_limits<float>::max() / arb_scale(2.0f, 447.0f);  // (arb_scale's span × 10^6 is finite)
    return BrokenRule{
        fmt::format("{} x 448 past FP32", name),
        Errc::invalid_argument,
        {kernel, fmt::format("{} {} times the largest E4M3 code (448) is past FP32's range", name, a.*field)}};
  };
}

// A finite logit scale whose product with log2(e) (the wgmma kernels' base-2 logits) is past
// FP32's range (Validator::logit_scale).
template <class Args>
std::function<BrokenRule(Args&)> logit_scale_rule(const char* kernel, const char* name, float Args::*field) {
  return [=](Args& a) {
    a.*field = (coin() ? 1.0f : -1.0f) * std::numeric_limits<float>::max() * arb_scale(0.7f, 1.0f);
    return BrokenRule{fmt::format("{} x log2(e) past FP32", name),
                      Errc::invalid_argument,
                      {kernel, fmt::format("{} {} times log2(e) (the wgmma kernels' base-2 logits) is past FP32's "
                                           "range",
                                           name, a.*field)}};
  };
}

// The launchers of each module (launchers_absorbed.cpp, launchers_fast.cpp).
std::vector<Launcher> absorbed_launchers();
std::vector<Launcher> fast_and_k3_launchers();

}  // namespace metrale::props::defs
