// fp16 and bf16 conversions: every half and bfloat16 round-trips, and float → 16 bits rounds to
// nearest even exactly as the compiler's own _Float16 (hardware semantics) and a wide reference do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <sketchsgd/core/half.hpp>

namespace sketchsgd {
namespace {

TEST(Half, EveryHalfRoundTripsAndMatchesTheCompilersConversion) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(half_bits(f), h) << std::hex << h;
#if defined(__FLT16_MAX__)
    _Float16 ref;
    const uint16_t bits = uint16_t(h);
    std::memcpy(&ref, &bits, 2);
    ASSERT_EQ(float(ref), f) << std::hex << h;
#endif
  }
}

TEST(Half, FloatsRoundToNearestEvenLikeHardware) {
#if defined(__FLT16_MAX__)
  std::mt19937 rng(3);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns across the whole range (subnormals, ties, overflow), finite only.
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f)) continue;
    const _Float16 ref = _Float16(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(half_bits(f), want) << f;
  }
  // Exact ties: 1 + 2^-11 lies halfway between 1 and the next half; even wins.
  EXPECT_EQ(half_bits(1.0f + 0x1p-11f), half_bits(1.0f));
  EXPECT_EQ(half_bits(65504.0f), 0x7BFFu);
  EXPECT_EQ(half_bits(65520.0f), 0x7C00u);  // the first value that rounds to Inf
#else
  GTEST_SKIP() << "no _Float16 in this compiler to compare with";
#endif
}

TEST(Bf16, RoundsToNearestEvenAndRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_float(uint16_t(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(bf16_bits(f), b);
  }
  std::mt19937 rng(4);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    // Finite, and below the largest bfloat16 (above it, rounding up gives Inf).
    if (!std::isfinite(f) || ((bits >> 16) & 0x7FFFu) >= 0x7F7Fu) continue;
    const float lo = bf16_float(uint16_t(bits >> 16)), hi = bf16_float(uint16_t((bits >> 16) + 1));
    const double dl = std::fabs(double(f) - lo), dh = std::fabs(double(hi) - f);
    const uint16_t want = dl < dh || (dl == dh && !((bits >> 16) & 1)) ? uint16_t(bits >> 16)
                                                                       : uint16_t((bits >> 16) + 1);
    ASSERT_EQ(bf16_bits(f), want) << f;
  }
}

}  // namespace
}  // namespace sketchsgd
