// Count sketch: r rows × c columns of signed buckets, linear in the vectors it summarises.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/core/bytes.hpp>
#include <sketchsgd/core/device.hpp>
#include <sketchsgd/core/scratch.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd {

/// How bucket and sign of each (row, coordinate) are found (kernels/hash.hpp).
enum class Hashing : uint8_t {
  OnTheFly = 0,     ///< random buckets, one multiply-add per (row, coordinate); no memory
  Precomputed = 1,  ///< the same buckets from a packed 4-byte table, rows × dim, shared by
                    ///< sketches of one config
  Blocked = 2,      ///< blocks of `block` coordinates on windows of contiguous columns, from a
                    ///< table of rows × ⌈dim / block⌉ words (default: contiguous, as accurate)
};

struct SketchConfig {
  uint64_t dim = 0;   ///< length of the vectors sketched, 1 … 2^32 − 1
  uint32_t rows = 5;  ///< r, 1 … 32
  uint32_t cols = 0;  ///< c, 1 … 2^31
  uint64_t seed = 0;  ///< processes that merge sketches must use the same seed
  Hashing hashing = Hashing::Blocked;
  /// Blocked hashing: coordinates per window, a power of two ≤ 2^16. When cols < block the block
  /// shrinks to the largest power of two ≤ cols (a window never overlaps itself).
  uint32_t block = 1024;

  /// Throws InvalidArgument naming the bad field.
  void validate() const;
  bool blocked() const { return hashing == Hashing::Blocked; }
  /// Same hashes and table shape: random hashing on the fly and precomputed agree; blocked
  /// hashing agrees only with blocked hashing of the same block size.
  bool compatible(const SketchConfig& other) const {
    return dim == other.dim && rows == other.rows && cols == other.cols && seed == other.seed &&
           blocked() == other.blocked() && (!blocked() || block == other.block);
  }
};

/// Indices and values of heavy hitters: |value| descending, ties by index ascending, or by index
/// when asked for TopKOrder::Index.
struct TopK {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};
using TopKOrder = kernels::Order;

/// A count sketch on a Device. On a GPU the table lives in device memory and every span argument
/// or result (vectors to accumulate, indices, outputs, table()) is device memory; functions that
/// return std::vector or TopK return host copies (the final k results). Hashes are bit-identical
/// on every device, so serialize() on one and deserialize() on another gives the same sketch.
/// Validation on a GPU (finiteness, index ranges) runs on the device and reads back one word.
/// Not thread-safe, const functions included: on a GPU they share the sketch's scratch memory.
class CountSketch {
 public:
  explicit CountSketch(const SketchConfig& config, const Device& device = Device::cpu());

  const SketchConfig& config() const { return config_; }
  const Device& device() const { return device_; }
  /// The same sketch on another device (a copy of the table).
  CountSketch to(const Device& device) const;

  /// table += scale · S(x); x.size() must equal dim. Non-finite values throw NonFiniteError (found
  /// in the same pass) and leave the sketch as it was (bit for bit when it was empty, otherwise up
  /// to float rounding of the undone partial sum).
  void accumulate(std::span<const float> x, float scale = 1.0f);
  /// Accumulates a slice x of the full vector starting at coordinate offset (per-layer sketching).
  void accumulate(std::span<const float> x, uint64_t offset, float scale);

  /// Adds another sketch of a compatible config (ConfigMismatch otherwise).
  CountSketch& operator+=(const CountSketch& other);
  /// Adds a raw table of rows × cols floats (a peer's sketch received as bytes).
  void add_table(std::span<const float> table, float scale = 1.0f);
  void zero();
  /// table *= a
  void scale(float a);
  /// Zeroes every cell these coordinates hash to (indices < dim; FetchSGD's reset).
  void zero_buckets(std::span<const uint32_t> indices);

  std::vector<float> estimate(std::span<const uint32_t> indices) const;
  void estimate(std::span<const uint32_t> indices, std::span<float> out) const;
  std::vector<float> estimate_all() const;
  void estimate_all(std::span<float> out) const;
  /// The k coordinates of largest estimated magnitude (k ≤ dim), on the host. Index order is
  /// the cheaper one for one-row sketches on the CPU (see kernels::cpu::estimate_topk).
  TopK top_k(uint64_t k, TopKOrder order = TopKOrder::Magnitude) const;
  /// The same into idx and val (k = idx.size() = val.size(), in the sketch's memory): on a GPU
  /// nothing comes back to the host.
  void top_k(std::span<uint32_t> idx, std::span<float> val,
             TopKOrder order = TopKOrder::Magnitude) const;
  /// FetchSGD's selection: the k coordinates of largest estimated magnitude, on the host in index
  /// order, with every bucket they hash to zeroed in this sketch and in `also` (compatible
  /// sketches on the same device).
  TopK extract_top_k(uint64_t k, std::span<CountSketch* const> also = {});
  /// The same into idx and val (k = idx.size() = val.size(), in the sketch's memory).
  void extract_top_k(std::span<uint32_t> idx, std::span<float> val,
                     std::span<CountSketch* const> also = {});
  /// Estimate of ‖x‖₂: sqrt of the median over rows of the row's sum of squares.
  double l2_estimate() const;

  /// Row-major rows × cols table.
  std::span<float> table() { return table_.span(); }
  std::span<const float> table() const { return table_.span(); }

  /// Self-describing bytes (config + table + CRC-32C); deserialize validates every field.
  Bytes serialize() const;
  static CountSketch deserialize(std::span<const uint8_t> bytes,
                                 const Device& device = Device::cpu());

  /// The layout the kernels take (table pointer excluded).
  kernels::SketchLayout layout() const;

 private:
  void check_indices(std::span<const uint32_t> indices, const char* what) const;
  /// Result slots of a selection: equal lengths, k ≤ dim, in this sketch's memory.
  void check_results(std::span<uint32_t> idx, std::span<float> val, const char* what) const;
  /// This table and the others' that a FetchSGD selection zeroes (checked compatible).
  std::vector<float*> reset_tables(std::span<CountSketch* const> also);

  SketchConfig config_;
  Device device_;
  Buffer<float> table_;
  std::shared_ptr<const Buffer<uint32_t>> packed_;  // Precomputed: hashes; Blocked: window words
  bool empty_ = true;        // nothing accumulated since construction or zero(): exact rollback
  mutable Scratch scratch_;  // GPU staging and checks; never shared by copies
};

}  // namespace sketchsgd
