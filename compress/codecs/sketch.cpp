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
//
// With a layout (optional): 1-D tensors and tensors of fewer than dense_below values (biases) are
// not sketched but sent whole after the table; the server sums them and the update carries their
// mean at every one of their coordinates besides the k heavy hitters of the other tensors (the
// selection passes over whole coordinates: an estimate there is only collisions). Whole ones are
// selected every round, so, like every selected coordinate, their momentum is reset: workers
// zero u and v there (Sketched-SGD), the FetchSGD server sends their mean gradient.
#include <algorithm>
#include <optional>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include <sketchsgd/sketch/count_sketch.hpp>
#include "../codec_info.hpp"
#include "../payload.hpp"
#include "../summable.hpp"

namespace sketchsgd {
namespace {

struct SketchOptions {
  SketchConfig sketch;
  uint64_t k;
  uint64_t candidates;  // p2·k capped at dim; 0 without a second round
  float momentum;
  bool fetch;                    // FetchSGD: momentum and error live on the server, as sketches
  WireFloat wire;                // the table's float format on the wire
  payload::SparseFormat update;  // the update's indices: u32 or delta-coded (values fp32)
  // With a layout: the tensors sent whole and the sketched rest, as runs.
  std::vector<Layout::Run> whole, sketched;
  uint64_t whole_size = 0;

  void split(const Layout& layout, uint64_t dense_below) {
    const auto s = layout.partition(
        [&](const Layout::Tensor& t) { return Layout::sent_whole(t, dense_below); });
    whole = Layout::Split::runs(s.whole);
    sketched = Layout::Split::runs(s.kept);
    whole_size = s.whole_size;
  }
  uint64_t update_entries() const { return k + whole_size; }
};

Message sorted_update(const Header& h, std::vector<uint32_t> idx, std::vector<float> val,
                      payload::SparseFormat f) {
  payload::sort_by_index(idx, val);
  return payload::sparse_update(h, idx, val, f);
}

class SketchAggregator final : public SummableAggregator {
 public:
  SketchAggregator(const Compressor& c, uint32_t world, const SketchOptions& o)
      : SummableAggregator(c, world), o_(o), sum_(o.sketch, c.device()) {
    if (o.fetch) {
      momentum_.emplace(o.sketch, device_);
      error_.emplace(o.sketch, device_);
    }
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
  /// sum: the table (in the device's memory) and the whole tensors' values; or the candidates'
  /// values.
  Message reduce_sum(std::span<float> sum, const Header& phase, uint32_t contributors) override {
    const float inv = 1.0f / float(contributors);
    if (phase.kind == MessageKind::Answer) {
      const auto answers = ops::to_host(device_, sum, host_);
      std::vector<uint32_t> pos(std::min<uint64_t>(o_.k, answers.size()));
      std::vector<float> val(pos.size());
      kernels::cpu::topk(answers.data(), answers.size(), pos.size(), pos.data(), val.data());
      for (auto& p : pos) p = candidates_[p];
      kernels::cpu::scale(val.data(), val.size(), inv);
      return update(phase, std::move(pos), std::move(val));
    }
    const size_t cells = sum_.table().size();
    sum_.zero();
    sum_.add_table(sum.first(cells));
    // The whole tensors' mean, for this round's update (after a query too).
    const auto whole = ops::to_host(device_, sum.subspan(cells), host_);
    whole_mean_.assign(whole.begin(), whole.end());
    kernels::cpu::scale(whole_mean_.data(), whole_mean_.size(), inv);
    if (o_.fetch) {
      sum_.scale(inv);  // the mean sketch
      momentum_->scale(o_.momentum);
      *momentum_ += sum_;
      *error_ += *momentum_;
      if (o_.whole.empty()) {  // selected and reset in the sketches' memory
        const auto [idx, val] = top_room();
        CountSketch* also[] = {&*momentum_};
        error_->extract_top_k(idx, val, also);
        return device_update(phase, idx, val);
      }
      // Selected on the host, past the whole tensors, and reset.
      TopK top = select(*error_, o_.k);
      const auto kept = ops::on_device(device_, std::span<const uint32_t>(top.indices), top_idx_);
      momentum_->zero_buckets(kept);
      error_->zero_buckets(kept);
      return update(phase, std::move(top.indices), std::move(top.values));
    }
    if (o_.candidates == 0 && o_.whole.empty()) {
      const auto [idx, val] = top_room();
      sum_.top_k(idx, val, TopKOrder::Index);
      ops::scale(device_, val, inv);
      return device_update(phase, idx, val);
    }
    if (o_.candidates == 0) {
      TopK top = select(sum_, o_.k);
      kernels::cpu::scale(top.values.data(), top.values.size(), inv);
      return update(phase, std::move(top.indices), std::move(top.values));
    }
    candidates_ = select(sum_, o_.candidates).indices;
    Header h = phase;
    h.kind = MessageKind::Query;
    return Message::build(h, 4 + 4 * candidates_.size(), [&](ByteWriter& w) {
      w.put(uint32_t(candidates_.size()));
      w.put_array(std::span<const uint32_t>(candidates_));
    });
  }

  /// Room for k selected pairs in the sketch's memory.
  std::pair<std::span<uint32_t>, std::span<float>> top_room() {
    if (top_idx_.size() < o_.k) top_idx_ = Buffer<uint32_t>(o_.k, device_);
    if (top_val_.size() < o_.k) top_val_ = Buffer<float>(o_.k, device_);
    return {top_idx_.span().first(o_.k), top_val_.span().first(o_.k)};
  }

  /// The update from pairs in index order in the sketch's memory: on a GPU built there and
  /// copied once into the message (no host sort, no pair-by-pair writing).
  Message device_update(Header h, std::span<const uint32_t> idx, std::span<const float> val) {
    h.kind = MessageKind::Update;
    return Message::build(h, payload::sparse_bytes(idx.size(), o_.update), [&](ByteWriter& w) {
      payload::write_sparse(device_, scratch_, w, idx, val, o_.update);
    });
  }

  bool in_whole(uint64_t j) const {
    const auto it = std::upper_bound(o_.whole.begin(), o_.whole.end(), j,
                                     [](uint64_t x, const auto& r) { return x < r.offset; });
    return it != o_.whole.begin() && j < std::prev(it)->offset + std::prev(it)->numel;
  }

  /// The n largest estimates of s in index order, past the whole tensors: their coordinates
  /// are not sketched, so an estimate there is another coordinate's collision, not news.
  TopK select(const CountSketch& s, uint64_t n) const {
    if (o_.whole.empty()) return s.top_k(n, TopKOrder::Index);
    TopK t = s.top_k(std::min<uint64_t>(info_.dim, n + o_.whole_size), TopKOrder::Magnitude);
    TopK out;
    for (size_t i = 0; i < t.indices.size() && out.indices.size() < n; ++i)
      if (!in_whole(t.indices[i])) {
        out.indices.push_back(t.indices[i]);
        out.values.push_back(t.values[i]);
      }
    payload::sort_by_index(out.indices, out.values);
    return out;
  }

  /// The update: the heavy hitters outside the whole tensors, and the whole tensors' mean.
  Message update(const Header& phase, std::vector<uint32_t> idx, std::vector<float> val) const {
    if (o_.whole.empty()) return sorted_update(phase, std::move(idx), std::move(val), o_.update);
    payload::sort_by_index(idx, val);
    std::vector<uint32_t> out_idx;
    std::vector<float> out_val;
    out_idx.reserve(idx.size() + o_.whole_size);
    out_val.reserve(idx.size() + o_.whole_size);
    size_t i = 0, at = 0;
    for (const auto& w : o_.whole) {
      for (; i < idx.size() && idx[i] < w.offset; ++i) {
        out_idx.push_back(idx[i]);
        out_val.push_back(val[i]);
      }
      for (; i < idx.size() && idx[i] < w.offset + w.numel; ++i) {  // (p2's answers) sent exactly
      }
      for (uint64_t j = 0; j < w.numel; ++j) {
        out_idx.push_back(uint32_t(w.offset + j));
        out_val.push_back(whole_mean_[at + j]);
      }
      at += w.numel;
    }
    for (; i < idx.size(); ++i) {
      out_idx.push_back(idx[i]);
      out_val.push_back(val[i]);
    }
    return sorted_update(phase, std::move(out_idx), std::move(out_val), o_.update);
  }

  SketchOptions o_;
  CountSketch sum_;  // the phase's summed table, as a sketch
  std::vector<float> whole_mean_;
  std::vector<float> host_;   // summed values from the GPU
  Buffer<uint32_t> top_idx_;  // the selection in the sketch's memory
  Buffer<float> top_val_;
  Scratch scratch_;  // the update's delta coding on a GPU
  std::vector<uint32_t> candidates_;
  std::optional<CountSketch> momentum_, error_;  // FetchSGD only
};

class SketchCodec final : public SummableCodec {
 public:
  SketchCodec(uint64_t dim, std::string spec, const SketchOptions& o, const Device& device)
      : SummableCodec(CodecId::Sketch, dim, std::move(spec), device, o.wire, WireFloat::F32),
        o_(o),
        fb_(dim, o.fetch ? 0.0f : o.momentum, !o.fetch, device),
        sketch_(o.sketch, device) {
    // FetchSGD's worker keeps no state and the accumulate checks every value it adds (taking
    // the table back on a bad one): no separate pass over the gradient first.
    checks_finite_itself(stateless());
  }

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<SketchAggregator>(*this, world, o_);
  }
  uint64_t sum_size(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return sketch_.table().size() + o_.whole_size;
    return kind == MessageKind::Answer ? o_.candidates : 0;
  }

 private:
  uint64_t reply_bytes(MessageKind kind) const override {
    if (kind == MessageKind::Query) return o_.candidates ? 4 + 4 * o_.candidates : 0;
    return kind == MessageKind::Update ? payload::sparse_bytes(o_.update_entries(), o_.update) : 0;
  }
  bool stateless() const { return o_.fetch && o_.whole.empty(); }

  /// The sketch of v, the whole tensors left out.
  void sketch(std::span<const float> v) {
    sketch_.zero();
    if (stateless()) {
      try {
        return sketch_.accumulate(v);
      } catch (const NonFiniteError&) {
        require_finite(v, "encode");  // raised as every codec's encode raises
        throw;
      }
    }
    if (o_.whole.empty()) return sketch_.accumulate(v);
    for (const auto& run : o_.sketched)
      sketch_.accumulate(v.subspan(run.offset, run.numel), run.offset, 1.0f);
  }
  /// The whole tensors' values of v, in order, into out (memory of the device, or the host).
  void copy_whole(std::span<const float> v, float* out) const {
    for (const auto& run : o_.whole) {
      detail::copy_bytes(out, v.data() + run.offset, run.numel * sizeof(float), device());
      out += run.numel;
    }
  }

  void do_encode_sum(std::span<const float> g, uint64_t, std::span<float> out) override {
    const auto v = fb_.absorb(g);
    sketch(v);
    const size_t cells = sketch_.table().size();
    detail::copy_bytes(out.data(), sketch_.table().data(), cells * sizeof(float), device());
    copy_whole(v, out.data() + cells);
  }

  void do_answer_sum(ByteReader& r, std::span<float> out) override {
    const auto idx = payload::read_indices(r, dim(), o_.candidates);
    r.expect_end();
    SKETCHSGD_REQUIRE(idx.size() == out.size(), WireError, "query of ", idx.size(),
                      " candidates, the codec's answer has ", out.size());
    const std::vector<float> val = ops::gather(device(), ops_, fb_.error(), idx);
    detail::copy_bytes(out.data(), val.data(), val.size() * sizeof(float), device());
  }

  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    fb_.mask(
        payload::read_sparse_into(r, ops_, o_.update_entries(), step, device(), o_.update).indices);
  }
  void do_apply_step(ByteReader& r, const Header&, std::span<float> params, float lr) override {
    fb_.mask(
        payload::read_sparse_axpy(r, ops_, o_.update_entries(), params, -lr, device(), o_.update)
            .indices);
  }

  SketchOptions o_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
  CountSketch sketch_;
};

SKETCHSGD_REGISTER_CODEC(
    kSketch,
    {"sketch",
     "Sketched-SGD: count sketch of momentum + error, server recovers the top-k heavy hitters",
     {{"rows", "sketch rows r", 5, 1, 32},
      {"cols", "sketch columns c (0: 10 * k)", 0, 0, 2147483648.0, true, {}, true, 4},
      {"k", "coordinates in each update (0: dim / 100)", 0, 0, 4294967295.0, true, {}, true},
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
      {"wire",
       "format of the sketch table on the wire (int8: a scale per 64 values; second-round "
       "values stay fp32)",
       0,
       0,
       3,
       true,
       {"fp32", "fp16", "bf16", "int8"}},
      {"index",
       "the update's indices: u32, or delta (gaps as varints, ~1-2 bytes each)",
       0,
       0,
       1,
       true,
       {"u32", "delta"}},
      {"dense_below", "with a layout: tensors with fewer values (and 1-D ones) are sent whole", 0,
       0, 4294967295.0}},
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
       if (!o.layout().empty()) {
         s.split(o.layout(), o.integer("dense_below"));
         s.candidates = std::min(s.candidates, dim - s.whole_size);  // chosen past whole tensors
       }
       SKETCHSGD_REQUIRE(
           !(s.fetch && s.candidates), InvalidArgument,
           "sketch: fetch=1 has no second round (workers keep no state to query); set p2=0");
       return std::make_unique<SketchCodec>(dim, std::move(spec), s, device);
     },
     LayoutUse::Optional,
     // One-round recovery from the automatic 10·k columns is too noisy for the training test's
     // dense gradients (it diverges at any step): it trains with k = dim / 20, cols = dim / 2.
     {{"sketch:rows=3", 1.0f, "cols=1000,k=100"},
      "sketch:rows=3,p2=2,hashing=random",
      {"sketch:rows=1,fetch=1,index=delta", 1.0f, "cols=1000,k=100"},
      {"sketch:rows=3,wire=fp16", 1.0f, "cols=1000,k=100"}}});

}  // namespace
}  // namespace sketchsgd
