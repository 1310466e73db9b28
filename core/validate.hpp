// Argument validation shared by the launchers (private to core). Every rule
// throws `invalid_argument` (or `unsupported`) with a message that starts with
// the kernel's name and names the bad value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/ranges.h>

#include "metrale/backend.hpp"
#include "metrale/device.hpp"
#include "metrale/error.hpp"
#include "metrale/formats.hpp"

namespace metrale {
struct BatchedGemvArgs;
}

namespace metrale::detail {

/// `what`'s first NaN or infinity refused (`invalid_argument`): "<what>[i] is <value>; <why>".
/// For values a step would store (a KV row), where one poisons every later output.
inline void require_finite(std::string_view what, std::span<const float> values, std::string_view why) {
  const auto bad = std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
  if (bad != values.end())
    fail(Errc::invalid_argument, "{}[{}] is {}; {}", what, std::distance(values.begin(), bad),
         std::isnan(*bad) ? std::abs(*bad) : *bad, why);  // a NaN's sign bit means nothing: "nan", never "-nan"
}

/// log2(e) in FP32, as the wgmma kernels scale their logits by it (exp2 in place of exp).
inline constexpr float kLog2e = 1.4426950408889634f;

/// The largest position a rope rotates: FP32 holds every integer up to 2^24.
inline constexpr std::uint32_t kMaxRopePosition = 1u << 24;

/// Why rope over `rope` dims at position `pos` with base `theta` cannot be computed in FP32, or
/// nothing: theta must be positive and finite, and every angle pos·theta^(−2i/rope) finite — a
/// theta far below 1 (a denormal, say) makes theta^(−2i/rope) overflow, and 0·inf is NaN — and
/// pos at most kMaxRopePosition where a pair rotates (rope ≥ 2).
inline std::optional<std::string> rope_theta_problem(float theta, std::uint32_t rope, std::uint32_t pos) {
  if (!std::isfinite(theta) || theta <= 0.0f) return fmt::format("theta {} is not a finite positive number", theta);
  // The largest frequency: 1 (i = 0) when theta ≥ 1, else theta^(−(rope − 2)/rope) (the last pair).
  const double largest =
      theta >= 1.0f || rope <= 2 ? 1.0 : std::pow(double{theta}, -static_cast<double>(rope - 2) / rope);
  if (!(largest * std::max(1.0, static_cast<double>(pos)) <= 0x1p126))  // FP32's largest is below 2^128
    return fmt::format("theta {} overflows FP32's rotation angles at position {} (frequency up to {:.3g})", theta, pos,
                       largest);
  // Past 2^24 FP32 no longer holds the position itself. (Its angles' rounding grows with the
  // position below that too: 0.011 rad at 2^20, 0.38 at 2^24 for rope 64, theta 10^4; SPEC §3's
  // FP32 math, as the models' own rotary embeddings have it.) A rope of 0 rotates nothing (and one
  // of 1, which the launchers refuse as odd).
  if (rope >= 2 && pos > kMaxRopePosition)
    return fmt::format("position {} is past 2^24 = {}, beyond what the rope's FP32 angles (SPEC §3) hold exactly", pos,
                       kMaxRopePosition);
  return std::nullopt;
}

/// CUDA's limits on gridDim.x, and on gridDim.y and gridDim.z.
inline constexpr std::uint32_t kMaxGridX = 0x7FFF'FFFF;
inline constexpr std::uint32_t kMaxGridYZ = 65535;

struct Validator {
  std::string_view kernel;

  void non_null(std::initializer_list<std::pair<const char*, DevicePtr>> ptrs) const {
    for (const auto& [name, p] : ptrs)
      if (!p) fail(Errc::invalid_argument, "{}: {}", kernel, null_pointer(name));
  }
  /// non_null's words for a null `name` (after "<kernel>: "): run_kernel_case matches them to say
  /// which tensor a case file lacks.
  static std::string null_pointer(std::string_view name) { return fmt::format("{} is null", name); }
  /// Each pointer a multiple of `bytes` (its elements' size or vector width): "<name> <addr> is not
  /// <bytes>-byte aligned".
  void aligned(std::uint64_t bytes, std::initializer_list<std::pair<const char*, DevicePtr>> ptrs) const {
    for (const auto& [name, p] : ptrs)
      if (p.addr % bytes != 0)
        fail(Errc::invalid_argument, "{}: {} {:#x} is not {}-byte aligned", kernel, name, p.addr, bytes);
  }
  void positive(std::initializer_list<std::pair<const char*, std::uint64_t>> values) const {
    for (const auto& [name, v] : values)
      if (v == 0) fail(Errc::invalid_argument, "{}: {} is 0", kernel, name);
  }
  void at_most(const char* name, std::uint64_t value, std::uint64_t limit) const {
    if (value > limit) fail(Errc::invalid_argument, "{}: {} {} exceeds {}", kernel, name, value, limit);
  }
  /// rope_theta_problem's rule for the parameter `theta`.
  void rope_theta(float theta, std::uint32_t rope, std::uint32_t pos) const {
    if (const auto why = rope_theta_problem(theta, rope, pos)) fail(Errc::invalid_argument, "{}: {}", kernel, *why);
  }
  void positive_finite(const char* name, float value) const {
    if (!std::isfinite(value) || value <= 0.0f)
      fail(Errc::invalid_argument, "{}: {} {} is not a finite positive number", kernel, name, value);
  }
  /// An E4M3 cache's scale `name` (dequantised = code · scale): finite and positive, and the
  /// largest code (448) times it finite in FP32, as every kernel multiplies in FP32 (else o is inf).
  void e4m3_scale(const char* name, float value) const {
    positive_finite(name, value);
    if (!std::isfinite(kE4m3Max * value))
      fail(Errc::invalid_argument, "{}: {} {} times the largest E4M3 code ({}) is past FP32's range", kernel, name,
           value, kE4m3Max);
  }
  /// A softmax's logit scale `name`: finite, and finite again times log2(e) in FP32, as the wgmma
  /// kernels take their logits to base 2 (a scale past 2.36e38 made every logit inf and o NaN,
  /// where the reference in double had a finite answer). Every path refuses it, since the
  /// dispatchers may send a step to those kernels (the seed and mma.sync kernels use expf).
  void logit_scale(const char* name, float value) const {
    if (!std::isfinite(value)) fail(Errc::invalid_argument, "{}: {} {} is not finite", kernel, name, value);
    if (!std::isfinite(value * kLog2e))
      fail(Errc::invalid_argument, "{}: {} {} times log2(e) (the wgmma kernels' base-2 logits) is past FP32's range",
           kernel, name, value);
  }
  /// An FP8 step's logit scale: `name` times the cache's `k_scale` (the split path folds the two
  /// into one), times log2(e), finite in FP32; `name` and k_scale each checked before.
  void fp8_logit_scale(const char* name, float value, float k_scale) const {
    if (!std::isfinite(value * k_scale * kLog2e))
      fail(Errc::invalid_argument, "{}: {} {} times k_scale {} (the logit scale) times log2(e) is past FP32's range",
           kernel, name, value, k_scale);
  }
  /// A buffer's bytes [ptr, ptr + bytes), for `disjoint`.
  struct Extent {
    const char* name;
    DevicePtr ptr;
    std::uint64_t bytes;
  };
  /// `out`'s span shares no byte with any of `ins`' (null pointers and empty extents never
  /// overlap): a kernel whose threads write what others read gives an answer that depends on
  /// their order. A span is a buffer's first byte to its last, strides' gaps included, so rows
  /// interleaved in another buffer's gaps are refused too. "<out> spans [a, b), which overlaps
  /// <in>'s [c, d)", in bytes (an end past 2^64 − 1 shown as 2^64 − 1), and that separate
  /// allocations overlap only where the counts that size the spans are too large (the adversarial
  /// trial, forty-fifth session: num_splits 5000 read as an overlap, the count unnamed).
  void disjoint(const Extent& out, std::initializer_list<Extent> ins) const {
    const auto end = [](const Extent& e) { return e.bytes > ~e.ptr.addr ? ~std::uint64_t{0} : e.ptr.addr + e.bytes; };
    for (const auto& in : ins) {
      if (!out.ptr || !in.ptr || out.bytes == 0 || in.bytes == 0) continue;
      const std::uint64_t o = out.ptr.addr, i = in.ptr.addr;  // (differences: no end wraps past 2^64)
      if (o >= i ? o - i < in.bytes : i - o < out.bytes)
        fail(Errc::invalid_argument,
             "{}: {} spans [{:#x}, {:#x}), which overlaps {}{} [{:#x}, {:#x}) (what one thread writes another may "
             "read; where the two are separate allocations, the counts and strides that size these spans are "
             "too large for them)",
             kernel, out.name, o, end(out), in.name, std::string_view(in.name).ends_with('s') ? "'" : "'s", i, end(in));
    }
  }
  template <class... Args>
  void check(bool ok, fmt::format_string<Args...> format, Args&&... args) const {
    if (!ok) throw Error(Errc::invalid_argument, fmt::format("{}: ", kernel) + fmt::format(format, std::forward<Args>(args)...));
  }
};

/// The product of `factors`, saturated at 2^64 − 1 (an extent that large overlaps everything).
inline std::uint64_t saturating_product(std::initializer_list<std::uint64_t> factors) {
  std::uint64_t p = 1;
  for (const std::uint64_t f : factors) {
    if (f != 0 && p > ~std::uint64_t{0} / f) return ~std::uint64_t{0};
    p *= f;
  }
  return p;
}

/// Bytes spanned by `rows` rows of `row` elements at a pitch of `stride` elements, `elem` bytes
/// each (saturated): [rows − 1 pitches, then one row].
inline std::uint64_t strided_bytes(std::uint64_t rows, std::uint64_t stride, std::uint64_t row, std::uint64_t elem) {
  if (rows == 0) return 0;
  const std::uint64_t pitches = saturating_product({rows - 1, stride});
  return saturating_product({pitches > ~row ? ~std::uint64_t{0} : pitches + row, elem});
}

/// Keys per sequence, compressed entries included: the kernels index them with 32 bits.
inline constexpr std::uint64_t kMaxKeys = 0x7FFF'FFFF;

/// A row's byte offset is slot x pitch with |slot| < 2^31 x block_size (any int32 in the table):
/// block_size x pitch < 2^32 keeps it inside int64, so a garbage table entry faults instead of
/// wrapping around to a valid row.
inline void validate_row_offsets(const Validator& v, std::uint32_t block_size, std::uint64_t pitch,
                                 const char* pitch_name) {
  v.check(pitch < (std::uint64_t{1} << 32) / block_size, "block_size {} x {} {} reaches 2^32 (row offsets would wrap)",
          block_size, pitch_name, pitch);
}

/// Compressed-pool entries sit at (s·C + c)·2·cache_stride: keep those offsets inside int64.
inline void validate_comp_offsets(const Validator& v, std::uint32_t num_seqs, std::uint32_t comp_block_count,
                                  std::uint64_t cache_stride) {
  v.check(comp_block_count == 0 ||
              cache_stride < (std::uint64_t{1} << 62) / (2 * std::uint64_t{num_seqs} * comp_block_count),
          "num_seqs {} x comp_block_count {} x 2 x cache_stride {} reaches 2^62 (entry offsets would wrap)", num_seqs,
          comp_block_count, cache_stride);
}

/// `out` apart from what a paged decode reads that its launcher can size: each pool (and
/// comp_pool) from its first `pool_row` bytes — a pool's extent follows its table, device data —
/// and the tables (`Args`: the seed's or the split path's arguments, of the same field names).
template <class Args>
void validate_apart_from_pools_and_tables(const Validator& v, const Validator::Extent& out, const Args& a,
                                          std::uint64_t pool_row, DevicePtr comp_pool) {
  v.disjoint(out, {{"k_cache", a.k_cache, pool_row},
                   {"v_cache", a.v_cache, pool_row},
                   {"comp_pool", comp_pool, pool_row},
                   {"block_tables", a.block_tables, saturating_product({a.num_seqs, a.max_blocks_per_seq, 4})},
                   {"seq_lens", a.seq_lens, std::uint64_t{a.num_seqs} * 4}});
}

/// An NVFP4 block's offset is phys x block_stride_bytes with |phys| < 2^31: keep it inside int64.
inline void validate_block_offsets(const Validator& v, std::uint64_t block_stride_bytes) {
  v.check(block_stride_bytes < (std::uint64_t{1} << 32),
          "block_stride_bytes {} reaches 2^32 (block offsets would wrap)", block_stride_bytes);
}

/// The handle must name one of `entries`: entries that share a signature cannot be told apart by
/// the backend's parameter check, and each expects its own block and shared memory.
inline void validate_entry(const Validator& v, const GpuBackend& gpu, KernelHandle kernel,
                           std::initializer_list<std::string_view> entries) {
  const std::string name = gpu.kernel_name(kernel);
  const std::string_view entry = std::string_view(name).substr(name.find('.') + 1);
  v.check(std::find(entries.begin(), entries.end(), entry) != entries.end(), "kernel {} is not {}", name,
          fmt::join(entries, " or "));
}

/// mla_batched_gemv's rules, which the wide GEMV keeps too: non-null buffers, positive counts,
/// heads within the grid's y, heads apart in the output (defined in mla_absorbed.cpp).
void validate_gemv(const Validator& v, const BatchedGemvArgs& a);
/// The output apart from the input and the weights: a launcher's last rule, once the counts that
/// size the buffers are known to be right.
void validate_gemv_buffers(const Validator& v, const BatchedGemvArgs& a);

}  // namespace metrale::detail
