// Count sketch: r rows × c columns of signed buckets, linear in the vectors it summarises.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "../kernels/bytes.hpp"
#include "../kernels/cpu.hpp"

namespace sketchsgd {

/// How bucket and sign of each (row, coordinate) are found. Both give identical hashes.
enum class Hashing : uint8_t {
  OnTheFly = 0,     ///< one multiply-add per (row, coordinate); no memory (default)
  Precomputed = 1,  ///< packed 4-byte table, rows × dim, shared by sketches of the same config
};

struct SketchConfig {
  uint64_t dim = 0;   ///< length of the vectors sketched, 1 … 2^32 − 1
  uint32_t rows = 5;  ///< r, 1 … 32
  uint32_t cols = 0;  ///< c, 1 … 2^31
  uint64_t seed = 0;  ///< processes that merge sketches must use the same seed
  Hashing hashing = Hashing::OnTheFly;

  /// Throws InvalidArgument naming the bad field.
  void validate() const;
  /// Same hashes and table shape (the hashing mode may differ: the hashes are identical).
  bool compatible(const SketchConfig& other) const {
    return dim == other.dim && rows == other.rows && cols == other.cols && seed == other.seed;
  }
};

/// Indices and values of heavy hitters, |value| descending, ties by index ascending.
struct TopK {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

class CountSketch {
 public:
  explicit CountSketch(const SketchConfig& config);

  const SketchConfig& config() const { return config_; }

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
  /// The k coordinates of largest estimated magnitude (k ≤ dim).
  TopK top_k(uint64_t k) const;
  /// Estimate of ‖x‖₂: sqrt of the median over rows of the row's sum of squares.
  double l2_estimate() const;

  /// Row-major rows × cols table.
  std::span<float> table() { return table_; }
  std::span<const float> table() const { return table_; }

  /// Self-describing bytes (config + table + CRC-32C); deserialize validates every field.
  Bytes serialize() const;
  static CountSketch deserialize(std::span<const uint8_t> bytes);

  /// The layout the kernels take (table pointer excluded).
  kernels::SketchLayout layout() const;

 private:
  SketchConfig config_;
  std::vector<float> table_;
  std::shared_ptr<const std::vector<uint32_t>> packed_;  // Precomputed mode only
  bool empty_ = true;  // nothing accumulated since construction or zero(): exact rollback
};

}  // namespace sketchsgd
