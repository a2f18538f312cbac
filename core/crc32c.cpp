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
constexpr uint32_t kPoly = 0x82F63B78u;  // reflected: bit 31 is x^0, bit 0 is x^31

/// a · b mod P for reflected polynomials.
uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i, a <<= 1) {
    if (a & 0x80000000u) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b · x
  }
  return product;
}

/// A raw CRC register carried past n zero bytes: c · x^(8n) mod P. The register is linear in
/// (state, data), so crc(A ‖ B, c) = shift(crc(A, c), |B|) ^ crc(B, 0): independent streams
/// combine into one.
uint32_t shift(uint32_t c, uint64_t n) {
  uint32_t power = 0x00800000u;  // x^8
  for (; n; n >>= 1, power = multiply(power, power))
    if (n & 1) c = multiply(c, power);
  return c;
}

__attribute__((target("sse4.2"))) uint32_t crc_serial(const uint8_t* p, size_t n, uint32_t crc) {
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

/// The crc32 instruction takes 3 cycles and issues every cycle: three independent streams over
/// thirds of the data keep it busy (about 3x one stream on large messages), then combine.
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  constexpr size_t kMin = 1 << 12;  // below this the combine is not worth it
  if (n < kMin) return crc_serial(p, n, crc);
  const size_t third = n / 24 * 8;  // bytes per stream, a multiple of 8
  const uint8_t *a = p, *b = p + third, *c = p + 2 * third;
  uint64_t ca = crc, cb = 0, cc = 0;
  for (size_t i = 0; i < third; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, a + i, 8);
    std::memcpy(&wb, b + i, 8);
    std::memcpy(&wc, c + i, 8);
    ca = _mm_crc32_u64(ca, wa);
    cb = _mm_crc32_u64(cb, wb);
    cc = _mm_crc32_u64(cc, wc);
  }
  const uint32_t joined =
      shift(uint32_t(ca), 2 * third) ^ shift(uint32_t(cb), third) ^ uint32_t(cc);
  return crc_serial(p + 3 * third, n - 3 * third, joined);
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
