// Number formats of the KV cache and the activations (SPEC §3 "Number
// formats"). Inline: the emulator's ports call them per element. The truth for
// E4M3 and E2M1 is `golden/quant_codecs.safetensors` (ml_dtypes); where the SPEC
// differs from ml_dtypes (E4M3 saturates ±inf to ±448) the SPEC stands.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace metrale {

// ---- BF16 -------------------------------------------------------------------

/// A bfloat16 value stored as its bits.
struct Bf16 {
  std::uint16_t bits = 0;

  /// Round to nearest even; NaN stays NaN (made quiet).
  static constexpr Bf16 from_float(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7FFF'FFFFu) > 0x7F80'0000u) return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
    const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
    return Bf16{static_cast<std::uint16_t>(rounded >> 16)};
  }
  constexpr float to_float() const { return std::bit_cast<float>(std::uint32_t{bits} << 16); }
  constexpr bool operator==(const Bf16&) const = default;
};

/// `f` rounded to the nearest BF16 value, as a float.
constexpr float bf16_round(float f) { return Bf16::from_float(f).to_float(); }

// ---- FP16 (IEEE binary16) ---------------------------------------------------

/// `f` rounded to the nearest FP16 value (ties to even, subnormals kept, beyond
/// 65504 + half an ulp to ±inf, NaN stays NaN), as a float: what CUDA's
/// `__float2half_rn` gives. The fast decode's MMA operands (kernels/mla_fast.cu).
inline float f16_round(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFF'FFFFu) >= 0x7F80'0000u) return f;       // inf, NaN
  if (std::fabs(f) < 0x1p-14f) {                           // subnormal range: step 2^-24
    return std::nearbyint(f * 0x1p24f) * 0x1p-24f;         // exact scaling; nearbyint ties to even
  }
  const std::uint32_t rounded = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;  // 10 mantissa bits
  const float r = std::bit_cast<float>(rounded);
  return std::fabs(r) > 65504.0f ? std::copysign(std::numeric_limits<float>::infinity(), f) : r;
}

// ---- E4M3 (float8_e4m3fn) ---------------------------------------------------

inline constexpr float kE4m3Max = 448.0f;
inline constexpr std::uint8_t kE4m3Nan = 0x7F;

namespace detail {
inline float e4m3_value(std::uint8_t code) {
  const bool neg = (code & 0x80) != 0;
  const int exp = (code >> 3) & 0xF;
  const int mant = code & 0x7;
  float v;
  if (exp == 0xF && mant == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = static_cast<float>(mant) * 0x1p-9f;
  } else {
    v = (1.0f + static_cast<float>(mant) * 0.125f) * std::ldexp(1.0f, exp - 7);
  }
  return neg ? -v : v;
}
// All 256 values, computed once: the ports decode every cache element through this.
inline const std::array<float, 256> kE4m3Values = [] {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<std::size_t>(c)] = e4m3_value(static_cast<std::uint8_t>(c));
  return t;
}();
}  // namespace detail

/// Value of an E4M3 code: bias 7, subnormal step 2^-9, NaN at 0x7F and 0xFF,
/// no infinity.
inline float e4m3_decode(std::uint8_t code) { return detail::kE4m3Values[code]; }

/// E4M3 code of `x`: round to nearest even, saturate to ±448 (±inf too,
/// "satfinite"), NaN → 0x7F.
inline std::uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return kE4m3Nan;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7E;
  if (a < 0x1p-6f) {  // subnormal range, step 2^-9; 8 steps is the smallest normal
    return sign | static_cast<std::uint8_t>(std::nearbyint(a * 0x1p9f));
  }
  int e2 = 0;
  const float m = std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int exp = e2 - 1;                    // a = s * 2^exp, s in [1, 2)
  int q = static_cast<int>(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
  if (q == 8) {
    q = 0;
    ++exp;
  }
  return sign | static_cast<std::uint8_t>(((exp + 7) << 3) | q);
}

// ---- E2M1 (float4_e2m1fn) ---------------------------------------------------

inline constexpr float kE2m1Max = 6.0f;

/// Value of an E2M1 code (low nibble): {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
constexpr float e2m1_decode(std::uint8_t code) {
  constexpr std::array<float, 8> kMag{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[code & 0x7];
  return (code & 0x8) != 0 ? -v : v;
}

/// E2M1 code of `x` (low nibble): round to nearest even, saturate to ±6. E2M1
/// has no NaN: NaN encodes as +0 (an NVFP4 group keeps NaN in its scale).
inline std::uint8_t e2m1_encode(float x) {
  if (std::isnan(x)) return 0;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  if (a >= kE2m1Max) return sign | 0x7;
  if (a < 1.0f) return sign | static_cast<std::uint8_t>(std::nearbyint(a * 2.0f));  // step 0.5
  int e2 = 0;
  const float m = std::frexp(a, &e2);
  int exp = e2 - 1;  // 0, 1 or 2
  int q = static_cast<int>(std::nearbyint((m * 2.0f - 1.0f) * 2.0f));
  if (q == 2) {
    q = 0;
    ++exp;
  }
  if (exp > 2) return sign | 0x7;
  return sign | static_cast<std::uint8_t>(((exp + 1) << 1) | q);
}

// ---- NVFP4: 16 E2M1 values sharing one E4M3 scale ----------------------------

inline constexpr std::size_t kNvfp4Group = 16;

/// Encode one group of 16 values: scale = E4M3(amax / 6), codes = E2M1(x / scale)
/// packed two a byte, element 2m in the low nibble of byte m. A group whose
/// scale decodes to 0 gets codes 0 (it decodes to zeros, never NaN); a NaN in
/// the group makes the scale NaN (0x7F), so the group decodes to NaN.
inline void nvfp4_encode_group(std::span<const float, kNvfp4Group> x, std::span<std::uint8_t, 8> packed,
                               std::uint8_t& scale_code) {
  float amax = 0.0f;
  bool has_nan = false;
  for (float v : x) {
    has_nan = has_nan || std::isnan(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (has_nan) amax = std::numeric_limits<float>::quiet_NaN();
  scale_code = e4m3_encode(amax / kE2m1Max);
  const float scale = e4m3_decode(scale_code);
  for (std::size_t m = 0; m < 8; ++m) {
    std::uint8_t lo = 0, hi = 0;
    if (scale != 0.0f) {
      lo = e2m1_encode(x[2 * m] / scale);
      hi = e2m1_encode(x[2 * m + 1] / scale);
    }
    packed[m] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

/// Element `i` (0..15) of a packed group: E2M1 code times the decoded scale.
inline float nvfp4_decode(std::span<const std::uint8_t, 8> packed, std::uint8_t scale_code, std::size_t i) {
  const std::uint8_t byte = packed[i / 2];
  const std::uint8_t code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  return e2m1_decode(code) * e4m3_decode(scale_code);
}

}  // namespace metrale
