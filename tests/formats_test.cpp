// The number formats (SPEC §3 "Number formats") against ml_dtypes' tables in
// golden/quant_codecs.safetensors and against brute-force nearest-even searches
// over those tables. Expected values come from the golden file, from the SPEC's
// definitions written out by hand, or from the brute force — never from
// formats.hpp itself.
#include <catch2/catch.hpp>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "metrale/formats.hpp"
#include "metrale/safetensors.hpp"
#include "support.hpp"

namespace {

using metrale::Bf16;
using metrale::e2m1_decode;
using metrale::e2m1_encode;
using metrale::e4m3_decode;
using metrale::e4m3_encode;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

const metrale::SafeTensors& codecs() {
  static const metrale::SafeTensors file = metrale::SafeTensors::read(metrale::test::golden("quant_codecs.safetensors"));
  return file;
}

// ml_dtypes' value of every E4M3 code.
const std::vector<float>& e4m3_table() {
  static const std::vector<float> t = codecs().at("fp8_e4m3fn_decode").values<float>();
  return t;
}

// ml_dtypes' value of every E2M1 code.
const std::vector<float>& e2m1_table() {
  static const std::vector<float> t = codecs().at("fp4_e2m1_decode").values<float>();
  return t;
}

// The code of the magnitude nearest to `a` (≥ 0) among `mags` (the finite
// non-negative values, in code order), ties to the even code. In a
// sign-magnitude format adjacent values have adjacent codes, so "even code" is
// "even mantissa". Distances are compared through the midpoint of the two
// candidates, which is exact in double (|a − m| itself rounds for large a and
// would fake ties).
std::uint8_t nearest_even(double a, std::span<const float> mags) {
  std::size_t best = 0;
  for (std::size_t c = 1; c < mags.size(); ++c) {
    const double mb = mags[best], mc = mags[c];
    const double mid = (mb + mc) / 2;
    const bool closer = mc > mb ? a > mid : a < mid;
    const bool tie = a == mid && mb != mc;
    if (closer || (tie && c % 2 == 0 && best % 2 != 0)) best = c;
  }
  return static_cast<std::uint8_t>(best);
}

// Reference E4M3 encode of a finite x: nearest finite value (so |x| > 448
// saturates to 448, the SPEC's satfinite), ties to even, sign kept (−0 too).
std::uint8_t ref_e4m3(float x) {
  const std::span<const float> mags(e4m3_table().data(), 0x7F);  // 0x00..0x7E
  return static_cast<std::uint8_t>(nearest_even(std::fabs(static_cast<double>(x)), mags) |
                                   (std::signbit(x) ? 0x80 : 0x00));
}

std::uint8_t ref_e2m1(float x) {
  const std::span<const float> mags(e2m1_table().data(), 8);  // 0x0..0x7
  return static_cast<std::uint8_t>(nearest_even(std::fabs(static_cast<double>(x)), mags) | (std::signbit(x) ? 0x8 : 0x0));
}

// Reference BF16 encode of a finite x: the two BF16 values around x are the
// truncation of its bits and the next code; nearest wins, ties to even.
std::uint16_t ref_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto lo = static_cast<std::uint16_t>(u >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);  // next magnitude (may be inf)
  const double vx = std::fabs(static_cast<double>(x));
  const double vlo = std::fabs(static_cast<double>(std::bit_cast<float>(std::uint32_t{lo} << 16)));
  const double vhi = std::fabs(static_cast<double>(std::bit_cast<float>(std::uint32_t{hi} << 16)));
  const double dlo = vx - vlo, dhi = vhi - vx;
  if (std::isinf(vhi)) {
    // IEEE overflow: from half an ulp above the largest finite value, round to inf.
    const double half_ulp = std::ldexp(1.0, 127 - 8);
    return dlo >= half_ulp ? hi : lo;
  }
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace

// ---- E4M3 ---------------------------------------------------------------------

TEST_CASE("e4m3 decode matches ml_dtypes for all 256 codes", "[formats][e4m3]") {
  const auto& table = e4m3_table();
  REQUIRE(table.size() == 256);
  for (int c = 0; c < 256; ++c) {
    INFO("code 0x" << std::hex << c);
    const float got = e4m3_decode(static_cast<std::uint8_t>(c));
    if (c == 0x7F || c == 0xFF) {
      CHECK(std::isnan(table[c]));
      CHECK(std::isnan(got));
    } else {
      CHECK(bits_of(got) == bits_of(table[c]));  // bits: −0 at 0x80 too
    }
  }
}

TEST_CASE("e4m3 encode matches every ml_dtypes pair", "[formats][e4m3]") {
  const auto in = codecs().at("fp8_encode_in").values<float>();
  const auto out = codecs().at("fp8_encode_out").values<std::uint8_t>();
  REQUIRE(in.size() == out.size());
  REQUIRE(in.size() > 1000);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (e4m3_encode(in[i]) != out[i]) {
      ++mismatches;
      INFO("pair " << i << ": x = " << std::hexfloat << in[i] << " expected 0x" << std::hex << int{out[i]} << " got 0x"
                   << int{e4m3_encode(in[i])});
      CHECK(e4m3_encode(in[i]) == out[i]);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("e4m3 encode saturates to 448 (satfinite)", "[formats][e4m3]") {
  const float big[] = {448.0f, 448.5f, 456.0f, std::nextafter(464.0f, 0.0f), 464.0f, 470.0f, 480.0f, 1e30f,
                       std::numeric_limits<float>::max(), kInf};
  for (float x : big) {
    INFO("x = " << x);
    CHECK(int{e4m3_encode(x)} == 0x7E);
    CHECK(int{e4m3_encode(-x)} == 0xFE);
  }
  CHECK(e4m3_decode(0x7E) == 448.0f);
  CHECK(e4m3_decode(0xFE) == -448.0f);
  // Just below the top: 416 = 1.625·2^8 is 0x7D; 432 ties between 0x7D (odd)
  // and 0x7E.
  CHECK(e4m3_decode(0x7D) == 416.0f);
  CHECK(int{e4m3_encode(416.0f)} == 0x7D);
  CHECK(int{e4m3_encode(432.0f)} == 0x7E);
  CHECK(int{e4m3_encode(std::nextafter(432.0f, 0.0f))} == 0x7D);
}

TEST_CASE("e4m3 nan, zeros and subnormals", "[formats][e4m3]") {
  CHECK(int{e4m3_encode(kNan)} == 0x7F);
  CHECK(int{e4m3_encode(-kNan)} == 0x7F);
  CHECK(int{e4m3_encode(from_bits(0x7F80'0001u))} == 0x7F);  // signalling NaN
  CHECK(std::isnan(e4m3_decode(0x7F)));
  CHECK(std::isnan(e4m3_decode(0xFF)));

  CHECK(int{e4m3_encode(0.0f)} == 0x00);
  CHECK(int{e4m3_encode(-0.0f)} == 0x80);
  CHECK(std::signbit(e4m3_decode(0x80)));
  CHECK(e4m3_decode(0x80) == 0.0f);

  const float sub = 0x1p-9f;  // smallest subnormal, code 1
  CHECK(int{e4m3_encode(sub)} == 0x01);
  CHECK(e4m3_decode(0x01) == sub);
  CHECK(int{e4m3_encode(sub / 2)} == 0x00);   // tie between 0 (even) and 1
  CHECK(int{e4m3_encode(-sub / 2)} == 0x80);  // … keeping the sign
  CHECK(int{e4m3_encode(std::nextafter(sub / 2, 1.0f))} == 0x01);
  CHECK(int{e4m3_encode(1.5f * sub)} == 0x02);  // tie between 1 and 2 (even)
  CHECK(int{e4m3_encode(2.5f * sub)} == 0x02);  // tie between 2 (even) and 3
  CHECK(int{e4m3_encode(1e-30f)} == 0x00);
  CHECK(int{e4m3_encode(-1e-30f)} == 0x80);
  CHECK(int{e4m3_encode(std::numeric_limits<float>::denorm_min())} == 0x00);
  // 7.5 steps ties between the largest subnormal (0x07, odd) and the smallest
  // normal 2^-6 (0x08).
  CHECK(int{e4m3_encode(7.5f * sub)} == 0x08);
  CHECK(e4m3_decode(0x07) == 7.0f * sub);
  CHECK(e4m3_decode(0x08) == 0x1p-6f);
}

TEST_CASE("e4m3 encode of every midpoint and its neighbours matches the brute force", "[formats][e4m3]") {
  const auto& t = e4m3_table();
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = (t[c] + t[c + 1]) / 2;  // exact: a 5-bit significand
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf), t[c]}) {
      for (float s : {x, -x}) {
        INFO("x = " << std::hexfloat << s);
        CHECK(int{e4m3_encode(s)} == int{ref_e4m3(s)});
      }
    }
  }
}

TEST_CASE("e4m3 encode agrees with a brute-force nearest-even search", "[formats][e4m3][property]") {
  rc::prop("arbitrary float, scaled through the e4m3 range", [](float x) {
    RC_PRE(std::isfinite(x));
    for (int j = 0; j <= 40; ++j) {
      const float y = std::ldexp(x, -j);
      RC_ASSERT(int{e4m3_encode(y)} == int{ref_e4m3(y)});
    }
  });
  rc::prop("any finite bit pattern", [](std::uint32_t bits) {
    const float x = from_bits(bits);
    RC_PRE(std::isfinite(x));
    RC_ASSERT(int{e4m3_encode(x)} == int{ref_e4m3(x)});
  });
  rc::prop("dense in [2^-12, 2^10)", [] {
    const int e = *rc::gen::inRange(-12, 10);
    const std::uint32_t m = *rc::gen::inRange<std::uint32_t>(0, 1u << 23);
    const bool neg = *rc::gen::arbitrary<bool>();
    const float x = std::ldexp(1.0f + static_cast<float>(m) * 0x1p-23f, e) * (neg ? -1.0f : 1.0f);
    RC_ASSERT(int{e4m3_encode(x)} == int{ref_e4m3(x)});
  });
}

// ---- E2M1 ---------------------------------------------------------------------

TEST_CASE("e2m1 decode matches ml_dtypes for all 16 codes", "[formats][e2m1]") {
  const auto& table = e2m1_table();
  REQUIRE(table.size() == 16);
  for (int c = 0; c < 16; ++c) {
    INFO("code 0x" << std::hex << c);
    CHECK(bits_of(e2m1_decode(static_cast<std::uint8_t>(c))) == bits_of(table[c]));
    // Only the low nibble is the code.
    CHECK(bits_of(e2m1_decode(static_cast<std::uint8_t>(c | 0xA0))) == bits_of(table[c]));
  }
}

TEST_CASE("e2m1 encode matches every ml_dtypes pair", "[formats][e2m1]") {
  const auto in = codecs().at("fp4_encode_in").values<float>();
  const auto out = codecs().at("fp4_encode_out").values<std::uint8_t>();
  REQUIRE(in.size() == out.size());
  REQUIRE(in.size() > 1000);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (e2m1_encode(in[i]) != (out[i] & 0xF)) {
      ++mismatches;
      INFO("pair " << i << ": x = " << std::hexfloat << in[i] << " expected 0x" << std::hex << int{out[i]} << " got 0x"
                   << int{e2m1_encode(in[i])});
      CHECK(e2m1_encode(in[i]) == (out[i] & 0xF));
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("e2m1 saturation, ties, nan and zeros", "[formats][e2m1]") {
  CHECK(int{e2m1_encode(5.0f)} == 0x6);  // tie between 4 (0x6, even) and 6
  CHECK(int{e2m1_encode(-5.0f)} == 0xE);
  CHECK(int{e2m1_encode(std::nextafter(5.0f, kInf))} == 0x7);
  for (float x : {6.0f, 6.5f, 7.0f, 1e9f, std::numeric_limits<float>::max(), kInf}) {
    INFO("x = " << x);
    CHECK(int{e2m1_encode(x)} == 0x7);
    CHECK(int{e2m1_encode(-x)} == 0xF);
  }
  // Ties at every other gap, to the even code.
  CHECK(int{e2m1_encode(0.25f)} == 0x0);
  CHECK(int{e2m1_encode(0.75f)} == 0x2);
  CHECK(int{e2m1_encode(1.25f)} == 0x2);
  CHECK(int{e2m1_encode(1.75f)} == 0x4);
  CHECK(int{e2m1_encode(2.5f)} == 0x4);
  CHECK(int{e2m1_encode(3.5f)} == 0x6);

  CHECK(int{e2m1_encode(kNan)} == 0x0);
  CHECK(int{e2m1_encode(-kNan)} == 0x0);
  CHECK(int{e2m1_encode(0.0f)} == 0x0);
  CHECK(int{e2m1_encode(-0.0f)} == 0x8);
  CHECK(int{e2m1_encode(-0.1f)} == 0x8);
  CHECK(std::signbit(e2m1_decode(0x8)));
}

TEST_CASE("e2m1 encode of every midpoint and its neighbours matches the brute force", "[formats][e2m1]") {
  const auto& t = e2m1_table();
  for (int c = 0; c < 7; ++c) {
    const float mid = (t[c] + t[c + 1]) / 2;
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf), t[c]}) {
      for (float s : {x, -x}) {
        INFO("x = " << std::hexfloat << s);
        CHECK(int{e2m1_encode(s)} == int{ref_e2m1(s)});
      }
    }
  }
}

TEST_CASE("e2m1 encode agrees with a brute-force nearest-even search", "[formats][e2m1][property]") {
  rc::prop("arbitrary float, scaled through the e2m1 range", [](float x) {
    RC_PRE(std::isfinite(x));
    for (int j = 0; j <= 40; ++j) {
      const float y = std::ldexp(x, -j);
      RC_ASSERT(int{e2m1_encode(y)} == int{ref_e2m1(y)});
    }
  });
  rc::prop("dense in [2^-3, 2^4)", [] {
    const int e = *rc::gen::inRange(-3, 4);
    const std::uint32_t m = *rc::gen::inRange<std::uint32_t>(0, 1u << 23);
    const bool neg = *rc::gen::arbitrary<bool>();
    const float x = std::ldexp(1.0f + static_cast<float>(m) * 0x1p-23f, e) * (neg ? -1.0f : 1.0f);
    RC_ASSERT(int{e2m1_encode(x)} == int{ref_e2m1(x)});
  });
}

// ---- BF16 ---------------------------------------------------------------------

TEST_CASE("bf16 rounds to nearest even at exact ties", "[formats][bf16]") {
  struct Case {
    std::uint32_t in;
    std::uint16_t out;
  };
  // Bit patterns worked out by hand: the low 16 bits 0x8000 are an exact tie.
  const Case cases[] = {
      {0x3F80'0000u, 0x3F80},  // 1.0 exact
      {0x3F80'8000u, 0x3F80},  // tie, 0x3F80 even
      {0x3F81'8000u, 0x3F82},  // tie, 0x3F81 odd → up
      {0x3F80'8001u, 0x3F81},  // above the tie
      {0x3F80'7FFFu, 0x3F80},  // below the tie
      {0xBF81'8000u, 0xBF82},  // negative tie rounds away in magnitude to even
      {0x3FFF'8000u, 0x4000},  // carry into the exponent
      {0x7F7F'8000u, 0x7F80},  // tie at the largest finite (odd) → inf
      {0x7F7F'FFFFu, 0x7F80},  // FLT_MAX → inf
      {0x7F7F'7FFFu, 0x7F7F},  // just below → largest finite
      {0x0000'8000u, 0x0000},  // subnormal tie → 0
      {0x0001'8000u, 0x0002},  // subnormal tie, odd → up
      {0x8000'0000u, 0x8000},  // −0
      {0x7F80'0000u, 0x7F80},  // inf
      {0xFF80'0000u, 0xFF80},  // −inf
  };
  for (const auto& c : cases) {
    INFO("in 0x" << std::hex << c.in);
    CHECK(int{Bf16::from_float(from_bits(c.in)).bits} == int{c.out});
  }
  CHECK(Bf16{0x3F80}.to_float() == 1.0f);
  CHECK(Bf16{0xC040}.to_float() == -3.0f);
  CHECK(metrale::bf16_round(from_bits(0x3F81'8000u)) == from_bits(0x3F82'0000u));
}

TEST_CASE("bf16 nan stays nan", "[formats][bf16]") {
  // Payloads only in the low 16 bits would truncate to inf; 0x7FFFFFFF would
  // carry into the sign with a plain rounding add.
  for (std::uint32_t u : {0x7FC0'0000u, 0x7F80'0001u, 0xFF80'0001u, 0x7FFF'FFFFu, 0xFFFF'FFFFu, 0x7F80'8000u}) {
    INFO("in 0x" << std::hex << u);
    const Bf16 b = Bf16::from_float(from_bits(u));
    CHECK(std::isnan(b.to_float()));
    CHECK((b.bits & 0x8000) == ((u >> 16) & 0x8000));  // the sign is kept
  }
}

TEST_CASE("bf16 agrees with a brute-force nearest-even choice", "[formats][bf16][property]") {
  rc::prop("any finite bit pattern", [](std::uint32_t bits) {
    const float x = from_bits(bits);
    RC_PRE(std::isfinite(x));
    RC_ASSERT(int{Bf16::from_float(x).bits} == int{ref_bf16(x)});
  });
  rc::prop("exact ties", [](std::uint32_t bits) {
    const float x = from_bits((bits & 0xFFFF'0000u) | 0x8000u);
    RC_PRE(std::isfinite(x));
    RC_ASSERT(int{Bf16::from_float(x).bits} == int{ref_bf16(x)});
  });
}

// ---- FP16 ---------------------------------------------------------------------

namespace {

// IEEE binary16 by its definition: exponent field e, mantissa m, bias 15.
double f16_value(std::uint32_t bits) {
  const std::uint32_t e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
  const double v = e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
  return (bits & 0x8000) != 0 ? -v : v;
}

// The nearest binary16 value of a finite x by search over the positive codes 0..0x7BFF, ties to
// the even code; from 65520 (half an ulp past 65504) ±inf.
double ref_f16(float x) {
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return std::copysign(std::numeric_limits<double>::infinity(), x);
  std::uint32_t lo = 0, hi = 0x7BFF;  // largest code with value ≤ a
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (f16_value(mid) <= a) lo = mid; else hi = mid - 1;
  }
  const double vlo = f16_value(lo), vhi = lo == 0x7BFF ? 65536.0 : f16_value(lo + 1);
  const double d_lo = a - vlo, d_hi = vhi - a;
  const double r = d_lo < d_hi || (d_lo == d_hi && lo % 2 == 0) ? vlo : vhi;
  return std::copysign(r, x);
}

}  // namespace

TEST_CASE("f16 rounds to nearest even, subnormals and overflow included", "[formats][f16]") {
  // Worked out by hand.
  CHECK(metrale::f16_round(1.0f) == 1.0f);
  CHECK(metrale::f16_round(1.0f + 0x1p-11f) == 1.0f);                  // tie, even stays
  CHECK(metrale::f16_round(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);    // tie, odd goes up
  CHECK(metrale::f16_round(1.0f + 0x1p-11f + 0x1p-20f) == 1.0f + 0x1p-10f);
  CHECK(metrale::f16_round(65504.0f) == 65504.0f);
  CHECK(metrale::f16_round(65519.99f) == 65504.0f);
  CHECK(std::isinf(metrale::f16_round(65520.0f)));
  CHECK(metrale::f16_round(-65520.0f) == -std::numeric_limits<float>::infinity());
  CHECK(metrale::f16_round(0x1p-24f) == 0x1p-24f);                     // smallest subnormal
  CHECK(metrale::f16_round(0x1p-25f) == 0.0f);                         // tie with 0, even
  CHECK(metrale::f16_round(3 * 0x1p-25f) == 0x1p-23f);                 // tie, odd goes up
  CHECK(metrale::f16_round(0x1p-14f - 0x1p-26f) == 0x1p-14f);          // into the normals
  CHECK(std::signbit(metrale::f16_round(-0x1p-30f)));                  // −0 keeps its sign
  CHECK(std::isnan(metrale::f16_round(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isinf(metrale::f16_round(std::numeric_limits<float>::infinity())));
}

TEST_CASE("f16 agrees with a nearest-even search over every binary16 value", "[formats][f16][property]") {
  // Every code's value, midpoint and their float neighbours.
  for (std::uint32_t code = 0; code < 0x7C00; ++code) {
    const float v = static_cast<float>(f16_value(code));
    const float mid = static_cast<float>((f16_value(code) + (code == 0x7BFF ? 65536.0 : f16_value(code + 1))) / 2);
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      INFO("x " << x);
      REQUIRE(static_cast<double>(metrale::f16_round(x)) == ref_f16(x));
    }
  }
  rc::prop("any finite bit pattern", [](std::uint32_t bits) {
    const float x = from_bits(bits);
    RC_PRE(std::isfinite(x));
    RC_ASSERT(static_cast<double>(metrale::f16_round(x)) == ref_f16(x));
  });
}

// ---- NVFP4 --------------------------------------------------------------------

namespace {

struct Group {
  std::array<float, 16> x{};
  std::array<std::uint8_t, 8> packed{};
  std::uint8_t scale = 0xAA;  // poisoned: the encoder must write it
  std::array<float, 16> decoded{};

  void run() {
    packed.fill(0xAA);
    metrale::nvfp4_encode_group(std::span<const float, 16>(x), std::span<std::uint8_t, 8>(packed), scale);
    for (std::size_t i = 0; i < 16; ++i) decoded[i] = metrale::nvfp4_decode(std::span<const std::uint8_t, 8>(packed), scale, i);
  }
};

}  // namespace

TEST_CASE("nvfp4 zero group: scale 0, codes 0, zeros out", "[formats][nvfp4]") {
  for (float z : {0.0f, -0.0f}) {
    Group g;
    g.x.fill(z);
    g.run();
    CHECK(int{g.scale} == 0x00);
    for (auto b : g.packed) CHECK(int{b} == 0);
    for (float d : g.decoded) {
      CHECK(d == 0.0f);
      CHECK_FALSE(std::isnan(d));
    }
  }
}

TEST_CASE("nvfp4 group whose amax/6 underflows e4m3 decodes to zeros", "[formats][nvfp4]") {
  // amax/6 below 2^-10 (half the smallest subnormal) rounds to scale 0;
  // exactly 2^-10 is a tie that also goes to 0 (even).
  for (float amax : {1e-6f, 1e-20f, 6.0f * 0x1p-10f, 6.0f * 0x1p-11f}) {
    INFO("amax = " << std::hexfloat << amax);
    Group g;
    for (std::size_t i = 0; i < 16; ++i) g.x[i] = amax * static_cast<float>(i) / 15.0f * (i % 2 ? -1.0f : 1.0f);
    g.x[15] = -amax;
    g.run();
    CHECK(e4m3_decode(g.scale) == 0.0f);
    for (auto b : g.packed) CHECK(int{b} == 0);
    for (float d : g.decoded) {
      CHECK(d == 0.0f);
      CHECK_FALSE(std::isnan(d));
    }
  }
}

TEST_CASE("nvfp4 group with a nan decodes to nan", "[formats][nvfp4]") {
  Group g;
  for (std::size_t i = 0; i < 16; ++i) g.x[i] = static_cast<float>(i);
  g.x[5] = kNan;
  g.run();
  CHECK(int{g.scale} == 0x7F);
  for (float d : g.decoded) CHECK(std::isnan(d));
}

TEST_CASE("nvfp4 group with inf saturates", "[formats][nvfp4]") {
  Group g;
  g.x.fill(1.0f);
  g.x[3] = kInf;
  g.x[10] = -kInf;
  g.run();
  CHECK(int{g.scale} == 0x7E);  // E4M3(inf / 6) saturates to 448
  CHECK(g.decoded[3] == 6.0f * 448.0f);
  CHECK(g.decoded[10] == -6.0f * 448.0f);
  for (std::size_t i = 0; i < 16; ++i) {
    INFO("element " << i);
    CHECK_FALSE(std::isnan(g.decoded[i]));
    if (i != 3 && i != 10) CHECK(g.decoded[i] == 0.0f);  // 1/448 rounds to 0
  }
}

TEST_CASE("nvfp4 packing: element 2m in the low nibble of byte m", "[formats][nvfp4]") {
  // Element i holds the value of E2M1 code i (from the golden table), amax 6,
  // so the scale is exactly 1 and element i encodes to code i.
  Group g;
  for (std::size_t i = 0; i < 16; ++i) g.x[i] = e2m1_table()[i];
  g.run();
  CHECK(e4m3_decode(g.scale) == 1.0f);
  const std::uint8_t expected[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};
  for (std::size_t m = 0; m < 8; ++m) {
    INFO("byte " << m);
    CHECK(int{g.packed[m]} == int{expected[m]});
  }
  for (std::size_t i = 0; i < 16; ++i) CHECK(bits_of(g.decoded[i]) == bits_of(g.x[i]));

  // Decoding a hand-packed group: byte 0 = 0x71 → element 0 code 1 (0.5),
  // element 1 code 7 (6); scale 2 (0x40).
  const std::array<std::uint8_t, 8> packed{0x71, 0xF0, 0, 0, 0, 0, 0, 0};
  const std::span<const std::uint8_t, 8> p(packed);
  CHECK(metrale::nvfp4_decode(p, 0x40, 0) == 1.0f);
  CHECK(metrale::nvfp4_decode(p, 0x40, 1) == 12.0f);
  CHECK(metrale::nvfp4_decode(p, 0x40, 2) == 0.0f);
  CHECK(metrale::nvfp4_decode(p, 0x40, 3) == -12.0f);
}

TEST_CASE("nvfp4 random groups: error within half an e2m1 step of the scale", "[formats][nvfp4]") {
  const std::uint32_t seed = 20240611;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  // Amplitudes keep amax/6 in E4M3's normal range [2^-6, 448], where the
  // scale's relative error is ≤ 2^-4 so saturated elements stay in bound.
  std::uniform_real_distribution<float> log2_amp(-3.0f, 11.0f);
  for (int n = 0; n < 2000; ++n) {
    Group g;
    const float amp = std::exp2(log2_amp(rng));
    for (auto& v : g.x) v = amp * unit(rng);
    g.run();
    float amax = 0;
    for (float v : g.x) amax = std::max(amax, std::fabs(v));
    INFO("seed " << seed << " group " << n << " amp " << amp << " amax " << amax);
    REQUIRE(int{g.scale} == int{ref_e4m3(amax / 6.0f)});
    const float scale = e4m3_table()[g.scale];
    REQUIRE(scale > 0.0f);
    for (std::size_t i = 0; i < 16; ++i) {
      const float y = std::fabs(g.x[i]) / scale;
      // E2M1 steps: 0.5 below 2, 1 below 4, 2 above (saturation at 6 errs by
      // at most amax/scale − 6 ≤ 6·2^-4 < 1).
      const float half_step = y < 2.0f ? 0.25f : y < 4.0f ? 0.5f : 1.0f;
      const float err = std::fabs(g.decoded[i] - g.x[i]);
      INFO("element " << i << " x " << g.x[i] << " decoded " << g.decoded[i] << " scale " << scale);
      CHECK(err <= half_step * scale * (1.0f + 1e-6f));
      // And the code is the brute-force nearest of x / scale.
      const std::uint8_t code = (i % 2 == 0) ? (g.packed[i / 2] & 0xF) : (g.packed[i / 2] >> 4);
      CHECK(int{code} == int{ref_e2m1(g.x[i] / scale)});
    }
  }
}
