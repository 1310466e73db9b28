// The number formats of core/metrale/formats.hpp on the device, bit for bit the same (SPEC §3
// "Number formats"): E4M3 through the hardware's satfinite conversion, E2M1 by its rounding
// thresholds (sm_90 has no E2M1 conversion), NVFP4 groups by the same amax / 6 rule.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace metrale {

__device__ inline float e4m3_decode(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// Round to nearest even, saturate to ±448 (±inf too), NaN → 0x7F.
__device__ inline uint8_t e4m3_encode(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// {0, 0.5, 1, 1.5, 2, 3, 4, 6}: computed, not looked up, so nothing goes to local memory.
__device__ inline float e2m1_decode(uint8_t code) {
  const uint32_t exp = (code >> 1) & 0x3, mant = code & 0x1;
  const float v = exp == 0 ? 0.5f * static_cast<float>(mant)
                           : (1.0f + 0.5f * static_cast<float>(mant)) * static_cast<float>(1u << (exp - 1));
  return (code & 0x8) != 0 ? -v : v;
}

// Round to nearest even between {0, 0.5, 1, 1.5, 2, 3, 4, 6}: a tie goes to the code with an
// even mantissa bit (0, 1, 2, 4 and 6 below); saturate to ±6; NaN → +0.
__device__ inline uint8_t e2m1_encode(float x) {
  if (isnan(x)) return 0;
  const uint8_t sign = signbit(x) ? 0x8 : 0x0;
  const float a = fabsf(x);
  uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

// scale = E4M3(amax / 6); codes = E2M1(x / scale), element 2m in the low nibble of byte m; a zero
// scale gives zero codes; a NaN makes the scale NaN.
__device__ inline void nvfp4_encode_group(const float (&x)[16], uint8_t (&packed)[8], uint8_t& scale_code) {
  float amax = 0.0f;
  bool has_nan = false;
  for (int e = 0; e < 16; ++e) {
    has_nan = has_nan || isnan(x[e]);
    amax = fmaxf(amax, fabsf(x[e]));
  }
  if (has_nan) amax = __int_as_float(0x7FC00000);
  scale_code = e4m3_encode(amax / 6.0f);
  const float scale = e4m3_decode(scale_code);
  for (int m = 0; m < 8; ++m) {
    uint8_t lo = 0, hi = 0;
    if (scale != 0.0f) {
      lo = e2m1_encode(x[2 * m] / scale);
      hi = e2m1_encode(x[2 * m + 1] / scale);
    }
    packed[m] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace metrale
