// CRC-32C: the streams-and-combine path of large inputs against a bitwise reference, at lengths
// around where it starts and at odd lengths, and chaining (crc of A then B = crc of A ‖ B).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include <sketchsgd/core/bytes.hpp>

namespace sketchsgd {
namespace {

uint32_t reference(std::span<const uint8_t> data, uint32_t crc = 0) {
  crc = ~crc;
  for (uint8_t byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

std::vector<uint8_t> noise(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

TEST(Crc32c, MatchesABitwiseReferenceAtEveryLengthClass) {
  // The check value of the standard (RFC 3720's "123456789").
  const std::string nine = "123456789";
  EXPECT_EQ(crc32c(std::span(reinterpret_cast<const uint8_t*>(nine.data()), nine.size())),
            0xE3069283u);
  for (size_t n : {0, 1, 7, 8, 9, 4095, 4096, 4097, 4104, 24 * 1000 + 5, 100003, 1 << 20}) {
    const auto v = noise(n, uint32_t(n));
    EXPECT_EQ(crc32c(v), reference(v)) << n;
    EXPECT_EQ(crc32c(v, 0x12345678u), reference(v, 0x12345678u)) << n;
  }
}

TEST(Crc32c, ChainsAcrossPieces) {
  const auto v = noise(300001, 9);
  const std::span<const uint8_t> all(v);
  for (size_t cut : {0, 5, 4096, 150000, 300001}) {
    const uint32_t first = crc32c(all.first(cut));
    EXPECT_EQ(crc32c(all.subspan(cut), first), crc32c(all)) << cut;
  }
}

}  // namespace
}  // namespace sketchsgd
