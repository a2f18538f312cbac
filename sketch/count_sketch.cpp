#include <sketchsgd/sketch/count_sketch.hpp>

#include <algorithm>
#include <cmath>

#include <map>
#include <mutex>
#include <tuple>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/elementwise.hpp>
#include <sketchsgd/kernels/hash.hpp>
#include <sketchsgd/kernels/ops.hpp>

namespace sketchsgd {
namespace {

constexpr uint32_t kMagic = 0x53435353;  // "SSCS"
constexpr uint16_t kVersion = 2;  // 2: blocked hashing (hashing byte 2, log2 of the block after it)
constexpr size_t kHeaderBytes = 4 + 2 + 1 + 1 + 8 + 4 + 4 + 8;
constexpr uint64_t kMaxTable = uint64_t(1) << 31;  // floats: 8 GiB

/// Precomputed hash tables (random buckets: rows × dim; blocked windows: rows × ⌈dim / B⌉, on a
/// GPU with their grouping by window after them) are
/// shared by every sketch of one config on one device: a server holding many sketches of one job
/// pays for the table once.
std::shared_ptr<const Buffer<uint32_t>> shared_hashes(const SketchConfig& c, const Device& d) {
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, uint64_t, int, uint32_t>;
  static std::mutex mutex;
  static std::map<Key, std::weak_ptr<const Buffer<uint32_t>>> cache;
  const uint32_t block = c.blocked() ? hash::blocked_shape(c.block, c.cols).size() : 0;
  const Key key{c.dim, c.rows, c.cols, c.seed, d.gpu, block};
  std::lock_guard lock(mutex);
  if (auto hit = cache[key].lock()) return hit;
  kernels::SketchLayout layout{c.dim, c.rows, c.cols, c.seed};
  layout.block = c.blocked() ? c.block : 0;
  auto table = std::make_shared<Buffer<uint32_t>>(ops::precomputed_words(d, layout), d);
  ops::precompute(d, layout, table->data());
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
  SKETCHSGD_REQUIRE(hashing == Hashing::OnTheFly || hashing == Hashing::Precomputed ||
                        hashing == Hashing::Blocked,
                    InvalidArgument, "unknown hashing mode ", int(hashing));
  SKETCHSGD_REQUIRE(!blocked() || (block >= 1 && block <= 65536 && (block & (block - 1)) == 0),
                    InvalidArgument, "sketch block must be a power of two in [1, 65536], got ",
                    block);
}

CountSketch::CountSketch(const SketchConfig& config, const Device& device)
    : config_(config), device_(device) {
  config_.validate();
  const auto scope = device_.activate();
  table_ = Buffer<float>(size_t(config_.rows) * config_.cols, device_);
  if (config_.hashing != Hashing::OnTheFly) packed_ = shared_hashes(config_, device_);
}

CountSketch CountSketch::to(const Device& device) const {
  CountSketch out(config_, device);  // zeroed and synchronised: ready for any stream
  ops::copy_across(device_, device, out.table_.data(), table_.data(), table_.size());
  out.empty_ = empty_;
  return out;
}

kernels::SketchLayout CountSketch::layout() const {
  kernels::SketchLayout l{config_.dim, config_.rows, config_.cols, config_.seed};
  l.block = config_.blocked() ? config_.block : 0;
  return packed_ ? ops::with_precomputed(device_, l, packed_->data()) : l;
}

void CountSketch::check_indices(std::span<const uint32_t> indices, const char* what) const {
  device_.require_accessible(indices.data(), indices.size_bytes(), what);
  const size_t bad = ops::find_out_of_range(device_, scratch_, indices, config_.dim);
  if (bad != kernels::kNone)
    detail::raise<InvalidArgument>(what, ": index ", ops::value_at(device_, indices, bad),
                                   " at position ", bad, " out of range for dim ", config_.dim);
}

void CountSketch::accumulate(std::span<const float> x, float scale) {
  SKETCHSGD_REQUIRE(x.size() == config_.dim, InvalidArgument, "accumulate: vector of length ",
                    x.size(), " into a sketch of dim ", config_.dim);
  accumulate(x, 0, scale);
}

void CountSketch::accumulate(std::span<const float> x, uint64_t offset, float scale) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(offset <= config_.dim && x.size() <= config_.dim - offset, InvalidArgument,
                    "accumulate: slice [", offset, ", ", offset + x.size(),
                    ") outside the sketch's dim ", config_.dim);
  SKETCHSGD_REQUIRE(is_finite(scale), NonFiniteError, "accumulate: scale is not finite");
  device_.require_accessible(x.data(), x.size_bytes(), "accumulate");
  const size_t bad =
      ops::sketch_add(device_, scratch_, layout(), table_.data(), x, offset, scale, empty_);
  if (bad != kernels::kNone)  // the table is as it was
    detail::raise<NonFiniteError>("accumulate: non-finite value ", ops::value_at(device_, x, bad),
                                  " at coordinate ", offset + bad);
  if (!x.empty()) empty_ = false;
}

CountSketch& CountSketch::operator+=(const CountSketch& other) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(config_.compatible(other.config_), ConfigMismatch,
                    "cannot merge sketches of different configs: (dim ", config_.dim, ", rows ",
                    config_.rows, ", cols ", config_.cols, ", seed ", config_.seed, ") vs (dim ",
                    other.config_.dim, ", rows ", other.config_.rows, ", cols ", other.config_.cols,
                    ", seed ", other.config_.seed, ")");
  SKETCHSGD_REQUIRE(device_.gpu == other.device_.gpu, InvalidArgument, "cannot merge a sketch on ",
                    other.device_.name(), " into one on ", device_.name(), " (use to())");
  // On a GPU other's table may still be written on its own stream, and may be changed there
  // right after this returns: wait on both sides.
  const bool cross = other.device_.stream != device_.stream;
  if (cross) gpu::synchronize(other.device_.stream);
  ops::axpy(device_, table_.span(), other.table_.span(), 1.0f);
  if (cross) gpu::synchronize(device_.stream);
  empty_ = empty_ && other.empty_;
  return *this;
}

void CountSketch::add_table(std::span<const float> table, float scale) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(table.size() == table_.size(), ConfigMismatch, "add_table: ", table.size(),
                    " floats into a ", config_.rows, " x ", config_.cols, " sketch");
  device_.require_accessible(table.data(), table.size_bytes(), "add_table");
  ops::axpy(device_, table_.span(), table, scale);
  empty_ = false;
}

void CountSketch::scale(float a) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(std::isfinite(a), InvalidArgument, "scale: factor ", a, " is not finite");
  ops::scale(device_, table_.span(), a);
}

void CountSketch::zero_buckets(std::span<const uint32_t> indices) {
  const auto scope = device_.activate();
  check_indices(indices, "zero_buckets");
  ops::zero_buckets(device_, layout(), table_.data(), indices);
}

void CountSketch::zero() {
  const auto scope = device_.activate();
  table_.zero();
  empty_ = true;
}

void CountSketch::estimate(std::span<const uint32_t> indices, std::span<float> out) const {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(out.size() == indices.size(), InvalidArgument, "estimate: ", indices.size(),
                    " indices but room for ", out.size(), " values");
  check_indices(indices, "estimate");
  device_.require_accessible(out.data(), out.size_bytes(), "estimate: output");
  ops::estimate(device_, layout(), table_.data(), indices, out);
}

std::vector<float> CountSketch::estimate(std::span<const uint32_t> indices) const {
  Buffer<float> out(indices.size(), device_);
  estimate(indices, out.span());
  return out.to_vector();
}

void CountSketch::estimate_all(std::span<float> out) const {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(out.size() == config_.dim, InvalidArgument, "estimate_all: output of length ",
                    out.size(), " for dim ", config_.dim);
  device_.require_accessible(out.data(), out.size_bytes(), "estimate_all: output");
  ops::estimate_all(device_, layout(), table_.data(), out);
}

std::vector<float> CountSketch::estimate_all() const {
  Buffer<float> out(config_.dim, device_);
  estimate_all(out.span());
  return out.to_vector();
}

void CountSketch::top_k(std::span<uint32_t> idx, std::span<float> val, TopKOrder order) const {
  const auto scope = device_.activate();
  check_results(idx, val, "top_k");
  ops::estimate_topk(device_, scratch_, layout(), table_.data(), idx, val, order);
}

TopK CountSketch::top_k(uint64_t k, TopKOrder order) const {
  SKETCHSGD_REQUIRE(k <= config_.dim, InvalidArgument, "top_k: k = ", k, " exceeds dim ",
                    config_.dim);
  const auto scope = device_.activate();
  TopK out;
  ops::estimate_topk(device_, scratch_, layout(), table_.data(), k, order, out.indices, out.values);
  return out;
}

std::vector<float*> CountSketch::reset_tables(std::span<CountSketch* const> also) {
  std::vector<float*> reset{table_.data()};
  for (CountSketch* s : also) {
    SKETCHSGD_REQUIRE(
        s != nullptr && s != this && config_.compatible(s->config_) && s->device_ == device_,
        InvalidArgument,
        "extract_top_k: the sketches to reset must be others of a compatible config "
        "on the same device and stream");
    reset.push_back(s->table_.data());
  }
  return reset;
}

TopK CountSketch::extract_top_k(uint64_t k, std::span<CountSketch* const> also) {
  const auto scope = device_.activate();
  SKETCHSGD_REQUIRE(k <= config_.dim, InvalidArgument, "extract_top_k: k = ", k, " exceeds dim ",
                    config_.dim);
  TopK out;
  ops::extract_topk(device_, scratch_, layout(), table_.data(), k, reset_tables(also), out.indices,
                    out.values);
  return out;
}

void CountSketch::extract_top_k(std::span<uint32_t> idx, std::span<float> val,
                                std::span<CountSketch* const> also) {
  const auto scope = device_.activate();
  check_results(idx, val, "extract_top_k");
  ops::extract_topk(device_, scratch_, layout(), table_.data(), reset_tables(also), idx, val);
}

void CountSketch::check_results(std::span<uint32_t> idx, std::span<float> val,
                                const char* what) const {
  SKETCHSGD_REQUIRE(idx.size() == val.size(), InvalidArgument, what, ": ", idx.size(),
                    " index slots but ", val.size(), " value slots");
  SKETCHSGD_REQUIRE(idx.size() <= config_.dim, InvalidArgument, what, ": k = ", idx.size(),
                    " exceeds dim ", config_.dim);
  device_.require_accessible(idx.data(), idx.size_bytes(), what);
  device_.require_accessible(val.data(), val.size_bytes(), what);
}

double CountSketch::l2_estimate() const {
  const auto scope = device_.activate();
  return ops::l2_estimate(device_, scratch_, layout(), table_.data());
}

Bytes CountSketch::serialize() const {
  const auto scope = device_.activate();
  Bytes out;
  out.reserve(kHeaderBytes + table_.size() * sizeof(float) + 4);
  ByteWriter w(out);
  w.put(kMagic);
  w.put(kVersion);
  w.put(uint8_t(config_.hashing));
  uint8_t log2_block = 0;
  while (config_.blocked() && (1u << log2_block) < config_.block) ++log2_block;
  w.put(log2_block);
  w.put(config_.dim);
  w.put(config_.rows);
  w.put(config_.cols);
  w.put(config_.seed);
  std::vector<float> staging;
  w.put_array(ops::to_host(device_, table_.span(), staging));
  seal(out);
  return out;
}

CountSketch CountSketch::deserialize(std::span<const uint8_t> bytes, const Device& device) {
  ByteReader r(bytes, "serialised sketch");
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == kMagic, WireError, "serialised sketch: bad magic");
  const auto version = r.get<uint16_t>();
  // Version 1 (random hashing only) is read as it was written.
  SKETCHSGD_REQUIRE(version == 1 || version == kVersion, WireError, "serialised sketch: version ",
                    version, " (this build reads 1 and ", kVersion, ")");
  SketchConfig c;
  c.hashing = Hashing(r.get<uint8_t>());
  const uint8_t log2_block = r.get<uint8_t>();
  SKETCHSGD_REQUIRE(version > 1 || c.hashing != Hashing::Blocked, WireError,
                    "serialised sketch: version 1 has no blocked hashing");
  SKETCHSGD_REQUIRE(c.blocked() ? log2_block <= 16 : log2_block == 0, WireError,
                    "serialised sketch: block byte ", int(log2_block), " for hashing mode ",
                    int(c.hashing));
  c.block = 1u << log2_block;
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
  CountSketch s(c, device);
  std::vector<float> table(n);
  r.get_array(std::span<float>(table));
  SKETCHSGD_REQUIRE(kernels::cpu::find_nonfinite(table.data(), table.size()) == kernels::kNone,
                    WireError, "serialised sketch: non-finite table entry");
  s.table_.upload(table);
  s.empty_ = false;
  return s;
}

}  // namespace sketchsgd
