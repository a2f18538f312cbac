#include "count_sketch.hpp"

#include <cmath>

#include <map>
#include <mutex>
#include <tuple>

#include "../kernels/elementwise.hpp"
#include "../kernels/error.hpp"
#include "../kernels/hash.hpp"

namespace sketchsgd {
namespace {

constexpr uint32_t kMagic = 0x53435353;  // "SSCS"
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 4 + 2 + 1 + 1 + 8 + 4 + 4 + 8;
constexpr uint64_t kMaxTable = uint64_t(1) << 31;  // floats: 8 GiB

/// Precomputed hash tables are shared by every sketch of one (dim, rows, cols, seed): a server
/// holding many sketches of one job pays for the table once.
std::shared_ptr<const std::vector<uint32_t>> shared_hashes(const SketchConfig& c) {
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, uint64_t>;
  static std::mutex mutex;
  static std::map<Key, std::weak_ptr<const std::vector<uint32_t>>> cache;
  const Key key{c.dim, c.rows, c.cols, c.seed};
  std::lock_guard lock(mutex);
  if (auto hit = cache[key].lock()) return hit;
  auto table = std::make_shared<std::vector<uint32_t>>(size_t(c.rows) * c.dim);
  kernels::SketchLayout layout{c.dim, c.rows, c.cols, c.seed, nullptr};
  kernels::cpu::precompute_hashes(layout, table->data());
  cache[key] = table;
  return table;
}

}  // namespace

void SketchConfig::validate() const {
  SKETCHSGD_REQUIRE(dim >= 1 && dim <= 0xFFFFFFFFull, InvalidArgument,
                    "sketch dim must be in [1, 2^32-1], got ", dim);
  SKETCHSGD_REQUIRE(rows >= 1 && rows <= uint32_t(elem::kMaxRows), InvalidArgument,
                    "sketch rows must be in [1, ", elem::kMaxRows, "], got ", rows);
  SKETCHSGD_REQUIRE(cols >= 1 && cols <= hash::kMaxCols, InvalidArgument,
                    "sketch cols must be in [1, 2^31], got ", cols);
  SKETCHSGD_REQUIRE(uint64_t(rows) * cols <= kMaxTable, InvalidArgument, "sketch table of ", rows,
                    " x ", cols, " floats exceeds the limit of 2^31 floats");
  SKETCHSGD_REQUIRE(hashing == Hashing::OnTheFly || hashing == Hashing::Precomputed,
                    InvalidArgument, "unknown hashing mode ", int(hashing));
}

CountSketch::CountSketch(const SketchConfig& config) : config_(config) {
  config_.validate();
  table_.assign(size_t(config_.rows) * config_.cols, 0.0f);
  if (config_.hashing == Hashing::Precomputed) packed_ = shared_hashes(config_);
}

kernels::SketchLayout CountSketch::layout() const {
  return {config_.dim, config_.rows, config_.cols, config_.seed,
          packed_ ? packed_->data() : nullptr};
}

void CountSketch::accumulate(std::span<const float> x, float scale) {
  SKETCHSGD_REQUIRE(x.size() == config_.dim, InvalidArgument, "accumulate: vector of length ",
                    x.size(), " into a sketch of dim ", config_.dim);
  accumulate(x, 0, scale);
}

void CountSketch::accumulate(std::span<const float> x, uint64_t offset, float scale) {
  SKETCHSGD_REQUIRE(offset <= config_.dim && x.size() <= config_.dim - offset, InvalidArgument,
                    "accumulate: slice [", offset, ", ", offset + x.size(),
                    ") outside the sketch's dim ", config_.dim);
  SKETCHSGD_REQUIRE(is_finite(scale), NonFiniteError, "accumulate: scale is not finite");
  const auto l = layout();
  const size_t stop = kernels::cpu::accumulate(l, table_.data(), x.data(), x.size(), offset, scale);
  if (stop != kernels::kNone) {
    if (empty_) {
      zero();
    } else if (stop > 0) {
      kernels::cpu::accumulate(l, table_.data(), x.data(), stop, offset, -scale);
    }
    const size_t bad = stop + kernels::cpu::find_nonfinite(x.data() + stop, x.size() - stop);
    detail::raise<NonFiniteError>("accumulate: non-finite value ", x[bad], " at coordinate ",
                                  offset + bad);
  }
  if (!x.empty()) empty_ = false;
}

CountSketch& CountSketch::operator+=(const CountSketch& other) {
  SKETCHSGD_REQUIRE(config_.compatible(other.config_), ConfigMismatch,
                    "cannot merge sketches of different configs: (dim ", config_.dim, ", rows ",
                    config_.rows, ", cols ", config_.cols, ", seed ", config_.seed, ") vs (dim ",
                    other.config_.dim, ", rows ", other.config_.rows, ", cols ", other.config_.cols,
                    ", seed ", other.config_.seed, ")");
  kernels::cpu::axpy(table_.data(), other.table_.data(), table_.size(), 1.0f);
  empty_ = empty_ && other.empty_;
  return *this;
}

void CountSketch::add_table(std::span<const float> table, float scale) {
  SKETCHSGD_REQUIRE(table.size() == table_.size(), ConfigMismatch, "add_table: ", table.size(),
                    " floats into a ", config_.rows, " x ", config_.cols, " sketch");
  kernels::cpu::axpy(table_.data(), table.data(), table_.size(), scale);
  empty_ = false;
}

void CountSketch::scale(float a) {
  SKETCHSGD_REQUIRE(std::isfinite(a), InvalidArgument, "scale: factor ", a, " is not finite");
  kernels::cpu::scale(table_.data(), table_.size(), a);
}

void CountSketch::zero_buckets(std::span<const uint32_t> indices) {
  for (size_t i = 0; i < indices.size(); ++i)
    SKETCHSGD_REQUIRE(indices[i] < config_.dim, InvalidArgument, "zero_buckets: index ",
                      indices[i], " out of range for dim ", config_.dim);
  kernels::cpu::zero_buckets(layout(), table_.data(), indices.data(), indices.size());
}

void CountSketch::zero() {
  std::fill(table_.begin(), table_.end(), 0.0f);
  empty_ = true;
}

void CountSketch::estimate(std::span<const uint32_t> indices, std::span<float> out) const {
  SKETCHSGD_REQUIRE(out.size() == indices.size(), InvalidArgument, "estimate: ", indices.size(),
                    " indices but room for ", out.size(), " values");
  for (size_t i = 0; i < indices.size(); ++i)
    SKETCHSGD_REQUIRE(indices[i] < config_.dim, InvalidArgument, "estimate: index ", indices[i],
                      " out of range for dim ", config_.dim);
  kernels::cpu::estimate(layout(), table_.data(), indices.data(), indices.size(), out.data());
}

std::vector<float> CountSketch::estimate(std::span<const uint32_t> indices) const {
  std::vector<float> out(indices.size());
  estimate(indices, out);
  return out;
}

void CountSketch::estimate_all(std::span<float> out) const {
  SKETCHSGD_REQUIRE(out.size() == config_.dim, InvalidArgument, "estimate_all: output of length ",
                    out.size(), " for dim ", config_.dim);
  kernels::cpu::estimate_all(layout(), table_.data(), out.data());
}

std::vector<float> CountSketch::estimate_all() const {
  std::vector<float> out(config_.dim);
  estimate_all(out);
  return out;
}

TopK CountSketch::top_k(uint64_t k) const {
  SKETCHSGD_REQUIRE(k <= config_.dim, InvalidArgument, "top_k: k = ", k, " exceeds dim ",
                    config_.dim);
  TopK out;
  out.indices.resize(k);
  out.values.resize(k);
  kernels::cpu::estimate_topk(layout(), table_.data(), k, out.indices.data(), out.values.data());
  return out;
}

double CountSketch::l2_estimate() const { return kernels::cpu::l2_estimate(layout(), table_.data()); }

Bytes CountSketch::serialize() const {
  Bytes out;
  out.reserve(kHeaderBytes + table_.size() * sizeof(float) + 4);
  ByteWriter w(out);
  w.put(kMagic);
  w.put(kVersion);
  w.put(uint8_t(config_.hashing));
  w.put(uint8_t(0));
  w.put(config_.dim);
  w.put(config_.rows);
  w.put(config_.cols);
  w.put(config_.seed);
  w.put_array(std::span<const float>(table_));
  w.put(crc32c(out));
  return out;
}

CountSketch CountSketch::deserialize(std::span<const uint8_t> bytes) {
  ByteReader r(bytes, "serialised sketch");
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == kMagic, WireError, "serialised sketch: bad magic");
  const auto version = r.get<uint16_t>();
  SKETCHSGD_REQUIRE(version == kVersion, WireError, "serialised sketch: version ", version,
                    " (this build reads ", kVersion, ")");
  SketchConfig c;
  c.hashing = Hashing(r.get<uint8_t>());
  SKETCHSGD_REQUIRE(r.get<uint8_t>() == 0, WireError, "serialised sketch: reserved byte set");
  c.dim = r.get<uint64_t>();
  c.rows = r.get<uint32_t>();
  c.cols = r.get<uint32_t>();
  c.seed = r.get<uint64_t>();
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw WireError(std::string("serialised sketch: ") + e.what());
  }
  const uint64_t n = uint64_t(c.rows) * c.cols;
  SKETCHSGD_REQUIRE(r.left() == n * sizeof(float) + 4, WireError, "serialised sketch: ", r.left(),
                    " bytes left for a ", c.rows, " x ", c.cols, " table");
  const auto body = bytes.first(bytes.size() - 4);
  ByteReader tail(bytes.last(4));
  SKETCHSGD_REQUIRE(crc32c(body) == tail.get<uint32_t>(), WireError,
                    "serialised sketch: checksum mismatch");
  CountSketch s(c);
  r.get_array(std::span<float>(s.table_));
  SKETCHSGD_REQUIRE(kernels::cpu::find_nonfinite(s.table_.data(), s.table_.size()) == kernels::kNone,
                    WireError, "serialised sketch: non-finite table entry");
  s.empty_ = false;
  return s;
}

}  // namespace sketchsgd
