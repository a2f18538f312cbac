// sketch: Sketched-SGD (Ivkin et al. 2019). Workers keep momentum u and error v (v += ρu + g) and
// send the count sketch S(v). The server sums the sketches (linear: the sum is the sketch of Σv)
// and recovers the heavy hitters:
//   p2 = 0: the update is the top-k of the summed sketch's estimates;
//   p2 > 0: it first asks every worker for its exact v at the top p2·k candidates (Query/Answer),
//           sums them, and the update is the exact top-k of that sum.
// The update holds Σ/W, the mean over contributing workers; workers zero u and v at its
// coordinates.
//
// fetch=1 is FetchSGD (Rothchild et al. 2020): workers are stateless and send S(g); the server
// keeps momentum and error as sketches, S_u = ρ·S_u + mean S(g), S_e += S_u, the update is the
// top-k of S_e's estimates, and the cells of S_u and S_e that the update's coordinates hash to are
// zeroed (the reference code's reset: subtracting S(Δ) instead diverges unless sketches are very
// large).
#include <algorithm>
#include <optional>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "../ops.hpp"
#include "../payload.hpp"

namespace sketchsgd {
namespace {

struct SketchOptions {
  SketchConfig sketch;
  uint64_t k;
  uint64_t candidates;  // p2·k capped at dim; 0 without a second round
  float momentum;
  bool fetch;      // FetchSGD: momentum and error live on the server, as sketches
  WireFloat wire;  // the table's float format on the wire
  payload::SparseFormat update;  // the update's indices: u32 or delta-coded (values fp32)
};

Message sparse_update(Header h, std::vector<uint32_t> idx, std::vector<float> val,
                      payload::SparseFormat f) {
  payload::sort_by_index(idx, val);
  h.kind = MessageKind::Update;
  return Message::build(h, payload::sparse_bytes(idx.size(), f),
                        [&](ByteWriter& w) { payload::write_sparse(w, idx, val, f); });
}

class SketchAggregator final : public Aggregator {
 public:
  SketchAggregator(const Compressor& c, uint32_t world, const SketchOptions& o)
      : Aggregator(c, world), o_(o), sum_(o.sketch, c.device()) {
    if (o.fetch) {
      momentum_.emplace(o.sketch, device_);
      error_.emplace(o.sketch, device_);
    }
    if (device_.is_gpu()) staging_ = Buffer<float>(sum_.table().size(), device_);
  }

  Bytes save_state() const override {
    if (!o_.fetch) return {};
    Bytes out;
    ByteWriter w(out);
    for (const auto* s : {&*momentum_, &*error_}) {
      const Bytes b = s->serialize();
      w.put(uint64_t(b.size()));
      w.put_array(std::span<const uint8_t>(b));
    }
    return out;
  }

  void load_state(std::span<const uint8_t> state) override {
    if (!o_.fetch) return Aggregator::load_state(state);
    ByteReader r(state, "fetchsgd state");
    std::vector<CountSketch> got;
    for (int i = 0; i < 2; ++i) {
      const auto n = r.get<uint64_t>();
      got.push_back(CountSketch::deserialize(r.take<uint8_t>(n), device_));
      SKETCHSGD_REQUIRE(got.back().config().compatible(o_.sketch), WireError,
                        "fetchsgd state of another sketch shape or seed");
    }
    r.expect_end();
    momentum_->zero();
    *momentum_ += got[0];
    error_->zero();
    *error_ += got[1];
  }

 private:
  void absorb(ByteReader& r, const Header& h) override {
    const uint64_t n = info_.sum_size[size_t(h.kind)];
    if (h.kind == MessageKind::Gradient && o_.wire != WireFloat::F32) {
      const auto v = payload::read_values(r, n, o_.wire, "sketch cell");  // finite-checked
      r.expect_end();
      if (!device_.is_gpu()) return sum_.add_table(v);
      staging_.upload(v);
      return absorb_sum(staging_.span(), h.kind);
    }
    if (h.kind == MessageKind::Gradient && device_.is_gpu()) {
      // Straight from the message bytes to the device, validated there: no host pass.
      const auto bytes = r.take<uint8_t>(n * sizeof(float));
      r.expect_end();
      detail::copy_bytes(staging_.data(), bytes.data(), bytes.size(), device_);
      return absorb_sum(staging_.span(), h.kind);
    }
    if (h.kind == MessageKind::Answer) {
      const uint32_t count = r.get<uint32_t>();
      SKETCHSGD_REQUIRE(count == n, WireError, "answer of ", count, " values to a query of ", n);
    }
    const auto v =
        payload::read_floats(r, n, h.kind == MessageKind::Answer ? "answer value" : "sketch cell");
    r.expect_end();
    if (h.kind == MessageKind::Answer) return add_answers(v);
    sum_.add_table(v);
  }

  /// Messages and all-reduced sums both end here: a table (in the device's memory) or the
  /// candidates' values.
  void absorb_sum(std::span<const float> v, MessageKind kind) override {
    if (kind == MessageKind::Gradient) {
      const size_t bad = ops::find_nonfinite(device_, ops_, v);
      SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "sketch cell ", bad, " is not finite");
      sum_.add_table(v);
      return;
    }
    const auto host = ops::to_host(device_, v, host_);
    SKETCHSGD_REQUIRE(kernels::cpu::find_nonfinite(host.data(), host.size()) == kernels::kNone,
                      WireError, "answer value is not finite");
    add_answers(host);
  }

  void add_answers(std::span<const float> v) {  // host values, validated
    SKETCHSGD_REQUIRE(v.size() == candidates_.size(), ProtocolError, "answer of ", v.size(),
                      " values to a query of ", candidates_.size());
    kernels::cpu::axpy(answers_.data(), v.data(), v.size(), 1.0f);
  }

  Message reduce(const Header& phase, uint32_t contributors) override {
    const auto scope = device_.activate();
    const float inv = 1.0f / float(contributors);
    if (phase.kind == MessageKind::Answer) {
      std::vector<uint32_t> pos(std::min<uint64_t>(o_.k, answers_.size()));
      std::vector<float> val(pos.size());
      kernels::cpu::topk(answers_.data(), answers_.size(), pos.size(), pos.data(), val.data());
      for (auto& p : pos) p = candidates_[p];
      kernels::cpu::scale(val.data(), val.size(), inv);
      return sparse_update(phase, std::move(pos), std::move(val), o_.update);
    }
    if (o_.fetch) {
      sum_.scale(inv);  // the mean sketch
      momentum_->scale(o_.momentum);
      *momentum_ += sum_;
      *error_ += *momentum_;
      TopK top;
      if (device_.is_gpu()) {  // select and reset on the device; only the k results come back
        if (top_idx_.size() != o_.k) {
          top_idx_ = Buffer<uint32_t>(o_.k, device_);
          top_val_ = Buffer<float>(o_.k, device_);
        }
        error_->top_k(top_idx_.span(), top_val_.span());
        momentum_->zero_buckets(top_idx_.span());
        error_->zero_buckets(top_idx_.span());
        top.indices = top_idx_.to_vector();
        top.values = top_val_.to_vector();
      } else {
        top = error_->top_k(o_.k, TopKOrder::Index);  // what the message needs
        momentum_->zero_buckets(top.indices);
        error_->zero_buckets(top.indices);
      }
      return sparse_update(phase, std::move(top.indices), std::move(top.values), o_.update);
    }
    if (o_.candidates == 0) {
      TopK top = sum_.top_k(o_.k, TopKOrder::Index);
      kernels::cpu::scale(top.values.data(), top.values.size(), inv);
      return sparse_update(phase, std::move(top.indices), std::move(top.values), o_.update);
    }
    candidates_ = sum_.top_k(o_.candidates, TopKOrder::Index).indices;
    answers_.assign(candidates_.size(), 0.0f);
    Header h = phase;
    h.kind = MessageKind::Query;
    return Message::build(h, 4 + 4 * candidates_.size(), [&](ByteWriter& w) {
      w.put(uint32_t(candidates_.size()));
      w.put_array(std::span<const uint32_t>(candidates_));
    });
  }

  void clear() override {
    const auto scope = device_.activate();
    sum_.zero();
    std::fill(answers_.begin(), answers_.end(), 0.0f);
  }

  SketchOptions o_;
  CountSketch sum_;
  Buffer<float> staging_;    // a received table on its way to the GPU
  std::vector<float> host_;  // summed answers from the GPU
  Scratch ops_;
  Buffer<uint32_t> top_idx_;  // FetchSGD on a GPU: the selection, kept across rounds
  Buffer<float> top_val_;
  std::vector<uint32_t> candidates_;
  std::vector<float> answers_;
  std::optional<CountSketch> momentum_, error_;  // FetchSGD only
};

class SketchCodec final : public Compressor {
 public:
  SketchCodec(uint64_t dim, std::string spec, const SketchOptions& o, const Device& device)
      : Compressor(CodecId::Sketch, dim, std::move(spec), device),
        o_(o),
        fb_(dim, o.fetch ? 0.0f : o.momentum, !o.fetch, device),
        sketch_(o.sketch, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<SketchAggregator>(*this, world, o_);
  }
  bool two_rounds() const override { return o_.candidates > 0; }
  WireFloat sum_format() const override { return o_.wire; }
  uint64_t sum_size(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return sketch_.table().size();
    return kind == MessageKind::Answer ? o_.candidates : 0;
  }
  uint64_t max_payload(MessageKind kind) const override {
    switch (kind) {
      case MessageKind::Gradient:
        return wire_bytes(o_.wire) * sketch_.table().size();
      case MessageKind::Query:
      case MessageKind::Answer:
        return 4 + 4 * o_.candidates;
      case MessageKind::Update:
        return payload::sparse_bytes(o_.k, o_.update);
    }
    return 0;
  }

 private:
  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto v = fb_.absorb(g);
    sketch_.zero();
    sketch_.accumulate(v);
    const auto table = ops::to_host(device(), sketch_.table(), staging_);
    try {
      return Message::build(h, wire_bytes(o_.wire) * table.size(), [&](ByteWriter& w) {
        payload::write_values(w, table, o_.wire, "sketch cell");
      });
    } catch (const NonFiniteError&) {
      fb_.undo(g);  // the table did not fit the wire format: as if this gradient never came
      throw;
    }
  }

  void do_encode_sum(std::span<const float> g, std::span<float> out) override {
    const auto v = fb_.absorb(g);
    sketch_.zero();
    sketch_.accumulate(v);
    detail::copy_bytes(out.data(), sketch_.table().data(), out.size_bytes(), device());
  }

  void do_answer_sum(ByteReader& r, std::span<float> out) override {
    const auto idx = payload::read_indices(r, dim(), o_.candidates);
    r.expect_end();
    SKETCHSGD_REQUIRE(idx.size() == out.size(), WireError, "query of ", idx.size(),
                      " candidates, the codec's answer has ", out.size());
    const std::vector<float> val = ops::gather(device(), ops_, fb_.error(), idx);
    detail::copy_bytes(out.data(), val.data(), val.size() * sizeof(float), device());
  }

  Message do_answer(ByteReader& r, const Header& q, uint32_t sender) override {
    const auto idx = payload::read_indices(r, dim(), o_.candidates);
    r.expect_end();
    const std::vector<float> val = ops::gather(device(), ops_, fb_.error(), idx);
    Header h = make_header(MessageKind::Answer, q.round, sender);
    return Message::build(h, 4 + 4 * val.size(), [&](ByteWriter& w) {
      w.put(uint32_t(val.size()));
      w.put_array(std::span<const float>(val));
    });
  }

  void do_decode(ByteReader& r, const Header&, std::span<float> step) const override {
    payload::read_sparse_into(r, ops_, o_.k, step, device(), o_.update);
  }
  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    fb_.mask(payload::read_sparse_into(r, ops_, o_.k, step, device(), o_.update).indices);
  }
  void do_decode_step(ByteReader& r, const Header&, std::span<float> params,
                      float lr) const override {
    payload::read_sparse_axpy(r, ops_, o_.k, params, -lr, device(), o_.update);
  }
  void do_apply_step(ByteReader& r, const Header&, std::span<float> params, float lr) override {
    fb_.mask(payload::read_sparse_axpy(r, ops_, o_.k, params, -lr, device(), o_.update).indices);
  }

  SketchOptions o_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
  CountSketch sketch_;
  std::vector<float> staging_;  // host copy of a GPU table for the wire
};

SKETCHSGD_REGISTER_CODEC(
    kSketch,
    {"sketch",
     "Sketched-SGD: count sketch of momentum + error, server recovers the top-k heavy hitters",
     {{"rows", "sketch rows r", 5, 1, 32},
      {"cols", "sketch columns c (0: 10 * k)", 0, 0, 2147483648.0},
      {"k", "coordinates in each update (0: dim / 100)", 0, 0, 4294967295.0},
      {"p2", "second round with p2 * k candidates (0: off)", 0, 0, 1000},
      {"momentum", "worker momentum rho", 0.9, 0, 0.999, false},
      {"seed", "hash seed shared by workers and server", 1, 0, 4294967295.0},
      {"hashing",
       "random: a random bucket per (row, coordinate), hashed on the fly; precomputed: the same "
       "from a packed table; blocked: windows of `block` contiguous columns (fast, as accurate)",
       2,
       0,
       2,
       true,
       {"random", "precomputed", "blocked"}},
      {"block", "blocked hashing: coordinates per window, a power of two", 1024, 1, 65536},
      {"fetch", "1: FetchSGD, momentum and error kept as sketches on the server", 0, 0, 1},
      {"wire", "float format of the sketch table on the wire (second-round values stay fp32)", 0,
       0, 2, true, {"fp32", "fp16", "bf16"}},
      {"index", "the update's indices: u32, or delta (gaps as varints, ~1-2 bytes each)", 0, 0, 1,
       true, {"u32", "delta"}}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       SketchOptions s;
       s.k = o.integer("k");
       if (s.k == 0) s.k = std::max<uint64_t>(1, dim / 100);
       SKETCHSGD_REQUIRE(s.k <= dim, InvalidArgument, "sketch: k = ", s.k, " exceeds dim ", dim);
       s.sketch.dim = dim;
       s.sketch.rows = uint32_t(o.integer("rows"));
       const uint64_t cols = o.integer("cols") ? o.integer("cols") : 10 * s.k;
       SKETCHSGD_REQUIRE(cols <= (uint64_t(1) << 31), InvalidArgument, "sketch: cols = ", cols,
                         " exceeds 2^31");
       s.sketch.cols = uint32_t(cols);
       s.sketch.seed = o.integer("seed");
       s.sketch.hashing = Hashing(o.integer("hashing"));
       s.sketch.block = uint32_t(o.integer("block"));
       s.candidates = std::min<uint64_t>(o.integer("p2") * s.k, dim);
       s.momentum = float(o.number("momentum"));
       s.fetch = o.flag("fetch");
       s.wire = WireFloat(o.integer("wire"));
       s.update = {o.flag("index"), WireFloat::F32};
       SKETCHSGD_REQUIRE(
           !(s.fetch && s.candidates), InvalidArgument,
           "sketch: fetch=1 has no second round (workers keep no state to query); set p2=0");
       return std::make_unique<SketchCodec>(dim, std::move(spec), s, device);
     }});

}  // namespace
}  // namespace sketchsgd
