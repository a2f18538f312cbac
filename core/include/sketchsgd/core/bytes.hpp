// Little-endian byte writer and bounds-checked reader for wire messages and serialised sketches.
// The reader never trusts a length: every read is checked against what is left and throws
// WireError.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {

static_assert(std::endian::native == std::endian::little,
              "sketchsgd's wire format is little-endian; big-endian hosts are not supported");

using Bytes = std::vector<uint8_t>;

class ByteWriter {
 public:
  explicit ByteWriter(Bytes& out) : out_(out) {}

  template <class T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }

  template <class T>
  void put_array(std::span<const T> values) {
    const size_t at = out_.size();
    out_.resize(at + values.size_bytes());
    if (!values.empty()) std::memcpy(out_.data() + at, values.data(), values.size_bytes());
  }

  /// Reserves n bytes and returns where they start, for kernels that write in place.
  uint8_t* grow(size_t n) {
    const size_t at = out_.size();
    out_.resize(at + n);
    return out_.data() + at;
  }

  size_t size() const { return out_.size(); }

 private:
  Bytes& out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in, const char* what = "message")
      : in_(in), what_(what) {}

  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  /// A view of the next n elements of T (count checked against the bytes left before multiplying).
  template <class T>
  std::span<const uint8_t> take(uint64_t n) {
    SKETCHSGD_REQUIRE(n <= left() / sizeof(T), WireError, what_, " truncated: needs ", n, " x ",
                      sizeof(T), " bytes, ", left(), " left");
    auto out = in_.subspan(pos_, size_t(n) * sizeof(T));
    pos_ += out.size();
    return out;
  }

  template <class T>
  void get_array(std::span<T> out) {
    auto bytes = take<T>(out.size());
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  }

  size_t left() const { return in_.size() - pos_; }
  size_t pos() const { return pos_; }

  void expect_end() const {
    SKETCHSGD_REQUIRE(left() == 0, WireError, what_, " has ", left(), " trailing bytes");
  }

 private:
  void need(size_t n) const {
    SKETCHSGD_REQUIRE(n <= left(), WireError, what_, " truncated at byte ", pos_);
  }

  std::span<const uint8_t> in_;
  const char* what_;
  size_t pos_ = 0;
};

/// CRC-32C (Castagnoli), hardware-accelerated with SSE4.2 where the CPU has it.
uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc = 0);
/// Appends the CRC-32C of out's bytes: a sealed state or file.
void seal(Bytes& out);
/// The bytes before the seal; WireError ("<what>: truncated" or "<what>: checksum mismatch")
/// when they are too short or do not match it.
std::span<const uint8_t> unseal(std::span<const uint8_t> bytes, const char* what);

}  // namespace sketchsgd
