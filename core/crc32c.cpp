// CRC-32C: SSE4.2 crc32 instruction when present (≈ 8 bytes a cycle), a table otherwise.
#include <sketchsgd/core/bytes.hpp>
#include <sketchsgd/core/error.hpp>

#include <array>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace sketchsgd {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();

uint32_t crc_table(const uint8_t* p, size_t n, uint32_t crc) {
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = uint32_t(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc) {
  crc = ~crc;
#if defined(__x86_64__)
  if (kHasSse42) return ~crc_sse42(data.data(), data.size(), crc);
#endif
  return ~crc_table(data.data(), data.size(), crc);
}

void seal(Bytes& out) {
  const uint32_t crc = crc32c(out);
  ByteWriter(out).put(crc);
}

std::span<const uint8_t> unseal(std::span<const uint8_t> bytes, const char* what) {
  SKETCHSGD_REQUIRE(bytes.size() >= 4, WireError, what, ": truncated (", bytes.size(), " bytes)");
  const auto body = bytes.first(bytes.size() - 4);
  ByteReader tail(bytes.last(4), what);
  SKETCHSGD_REQUIRE(tail.get<uint32_t>() == crc32c(body), WireError, what,
                    ": checksum mismatch (corrupt or truncated)");
  return body;
}

}  // namespace sketchsgd
