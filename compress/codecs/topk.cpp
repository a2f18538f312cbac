// topk: local top-k sparsification with error feedback (Stich et al.; DGC). Workers send the k
// largest |e| of their error accumulator and keep the rest; the server sums the sparse vectors and
// returns their mean (≤ W·k entries), or with global=1 re-selects the top-k of that sum.
// With a layout (optional): 1-D tensors and tensors of fewer than dense_below values are sent
// whole, and k is spent over the other tensors globally (budget=global: the k largest of them) or
// per tensor (budget=layer: k split in proportion to their sizes, largest remainders rounding up,
// so the shares add up to k).
#include <algorithm>
#include <optional>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "../codec_info.hpp"
#include "../payload.hpp"
#include "../sparse_codec.hpp"
#include "../sparse_sum.hpp"

namespace sketchsgd {
namespace {

struct TopKOptions {
  uint64_t k;
  bool global;
  bool ef;
  float momentum;
  payload::SparseFormat format;  // delta-coded indices, 16-bit values
  bool per_layer;                // with a layout: k split over the tensors
  uint64_t dense_below;
  bool sparse_reduce;  // collective drivers: the sparse all-reduce, not the all-gather
};

/// Where a layout sends what: the selected tensors, with their shares of k (budget=layer), and
/// the whole ones.
struct Selection {
  Layout::Split split;
  std::vector<uint64_t> k;  // per selected tensor, with budget=layer

  Selection(const Layout& layout, uint64_t k_all, bool per_layer, uint64_t dense_below)
      : split(layout.partition(
            [&](const Layout::Tensor& t) { return Layout::sent_whole(t, dense_below); })),
        k(per_layer ? split.shares(k_all) : std::vector<uint64_t>()) {}
};

class TopKAggregator final : public Aggregator {
 public:
  TopKAggregator(const Compressor& c, uint32_t world, uint64_t k, bool global,
                 payload::SparseFormat f)
      : Aggregator(c, world), k_(k), global_(global), format_(f) {}

 private:
  void do_add(ByteReader& r, const Header&) override {
    auto s = payload::read_sparse(r, info_.dim, k_, format_);
    r.expect_end();
    sum_.add(s.indices, s.values);
  }

  Message reduce(const Header& phase, uint32_t contributors) override {
    auto [idx, val] = sum_.mean(contributors);
    if (global_ && idx.size() > k_) {
      std::vector<uint32_t> pos(k_);
      std::vector<float> top(k_);
      // In index order: positions in idx, which increases, so the coordinates increase too.
      kernels::cpu::topk(val.data(), val.size(), k_, pos.data(), top.data(), kernels::Order::Index);
      for (auto& p : pos) p = idx[p];
      idx.swap(pos);
      val.swap(top);
    }
    return payload::sparse_update(phase, idx, val, format_);
  }

  void clear() override { sum_.clear(); }

  uint64_t k_;
  bool global_;
  payload::SparseFormat format_;
  SparseSum sum_;
};

class TopK final : public Compressor, public SparseListCodec {
 public:
  TopK(uint64_t dim, std::string spec, const TopKOptions& o, const Layout& layout,
       const Device& device)
      : Compressor(CodecId::TopK, dim, std::move(spec), device),
        o_(o),
        fb_(dim, o.momentum, o.ef, device) {
    if (!layout.empty()) sel_.emplace(layout, o.k, o.per_layer, o.dense_below);
  }

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<TopKAggregator>(*this, world, sent(), o_.global, o_.format);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return payload::sparse_bytes(sent(), o_.format);
    return kind == MessageKind::Update ? payload::sparse_bytes(dim(), o_.format) : 0;
  }

  bool reduces_sparse() const override { return o_.sparse_reduce; }
  uint64_t budget() const override { return sent(); }
  payload::Sparse pairs(std::span<const uint8_t> message) const override {
    decode_header(message, max_payload(MessageKind::Gradient));
    ByteReader r(payload_of(message));
    auto s = payload::read_sparse(r, dim(), sent(), o_.format);
    r.expect_end();
    return s;
  }
  payload::SparseFormat list_format() const override { return o_.format; }
  void refund(const payload::Sparse& dropped) override {
    if (o_.ef && !dropped.indices.empty())
      ops::add_sparse(device(), ops_, fb_.error(), dropped.indices, dropped.values, 1.0f);
  }

 private:
  /// Most entries a worker sends: k, and with a layout every value of the whole tensors.
  uint64_t sent() const {
    return sel_ ? std::min<uint64_t>(o_.k + sel_->split.whole_size, dim()) : o_.k;
  }

  void select(std::span<const float> v, std::vector<uint32_t>& idx, std::vector<float>& val) {
    if (!sel_) return ops::topk(device(), ops_, v, o_.k, idx, val, kernels::Order::Index);
    auto add = [&](const std::vector<uint32_t>& i, uint64_t offset) {
      for (uint32_t j : i) idx.push_back(uint32_t(j + offset));
    };
    std::vector<uint32_t> ti;
    std::vector<float> tv;
    if (o_.per_layer) {
      for (size_t i = 0; i < sel_->split.kept.size(); ++i) {
        const auto& t = sel_->split.kept[i];
        if (sel_->k[i] == 0) continue;
        ops::topk(device(), ops_, v.subspan(t.offset, t.numel), sel_->k[i], ti, tv);
        add(ti, t.offset);
      }
    } else {
      // The k largest of the selected tensors: of the whole vector, whole tensors' picks dropped
      // (they are sent anyway), topped up until k of the others are in.
      uint64_t want = std::min<uint64_t>(o_.k, dim() - sel_->split.whole_size), ask = want;
      auto in_whole = [&](uint32_t j) {
        for (const auto& p : sel_->split.whole)
          if (j >= p.offset && j < p.offset + p.numel) return true;
        return false;
      };
      while (want > 0) {
        ops::topk(device(), ops_, v, std::min<uint64_t>(ask, dim()), ti, tv);
        std::vector<uint32_t> keep;
        for (uint32_t j : ti)
          if (!in_whole(j) && keep.size() < want) keep.push_back(j);
        if (keep.size() == want || ask >= dim()) {
          add(keep, 0);
          break;
        }
        ask += want - keep.size();
      }
    }
    for (const auto& p : sel_->split.whole)
      for (uint64_t j = 0; j < p.numel; ++j) idx.push_back(uint32_t(p.offset + j));
    std::sort(idx.begin(), idx.end());
    val = ops::gather(device(), ops_, v, idx);
  }

  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto v = fb_.absorb(g);
    std::vector<uint32_t> idx;
    std::vector<float> val;
    select(v, idx, val);
    payload::sort_by_index(idx, val);
    Message m;
    try {
      m = Message::build(h, payload::sparse_bytes(idx.size(), o_.format),
                         [&](ByteWriter& w) { payload::write_sparse(w, idx, val, o_.format); });
    } catch (const NonFiniteError&) {
      fb_.undo(g);  // a value beyond fp16's range: as if this gradient never came
      throw;
    }
    fb_.mask(idx);  // residual = input − sent, exactly: with 16-bit values, what rounding lost
    if (o_.ef && o_.format.values != WireFloat::F32) {
      auto lost = val;
      payload::round_values(lost, o_.format.values);
      for (size_t i = 0; i < lost.size(); ++i) lost[i] = val[i] - lost[i];
      ops::add_sparse(device(), ops_, fb_.error(), idx, lost, 1.0f);
    }
    return m;
  }

  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    payload::read_sparse_into(r, ops_, dim(), step, device(), o_.format);
  }
  void do_apply_step(ByteReader& r, const Header&, std::span<float> params, float lr) override {
    payload::read_sparse_axpy(r, ops_, dim(), params, -lr, device(), o_.format);
  }

  TopKOptions o_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
  std::optional<Selection> sel_;
};

SKETCHSGD_REGISTER_CODEC(
    kTopK,
    {"topk",
     "local top-k with error feedback; server sums the sparse vectors",
     {{"k", "coordinates sent per worker (0: dim / 100)", 0, 0, 4294967295.0, true, {}, true},
      {"global", "1: downlink re-selects the global top-k of the sum", 0, 0, 1},
      {"ef", "1: error feedback (keep what was not sent)", 1, 0, 1},
      {"momentum", "local momentum before selection", 0, 0, 0.999, false},
      {"index",
       "indices on the wire: u32, or delta (gaps as varints, ~1 byte each)",
       0,
       0,
       1,
       true,
       {"u32", "delta"}},
      {"wire", "values on the wire", 0, 0, 2, true, {"fp32", "fp16", "bf16"}},
      {"budget",
       "with a layout: k over all selected tensors (global) or split per tensor (layer)",
       0,
       0,
       1,
       true,
       {"global", "layer"}},
      {"dense_below", "with a layout: tensors with fewer values (and 1-D ones) are sent whole", 0,
       0, 4294967295.0},
      {"reduce",
       "among ranks (DDP, DiLoCo, FSDP): gather every rank's list, or sparse (a sparse all-reduce "
       "keeping at most k values, what it drops back to error feedback)",
       0,
       0,
       1,
       true,
       {"gather", "sparse"}}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       TopKOptions t{o.integer("k"),
                     o.flag("global"),
                     o.flag("ef"),
                     float(o.number("momentum")),
                     {o.flag("index"), WireFloat(o.integer("wire"))},
                     o.flag("budget"),
                     o.integer("dense_below"),
                     o.flag("reduce")};
       if (t.k == 0) t.k = std::max<uint64_t>(1, dim / 100);
       SKETCHSGD_REQUIRE(t.k <= dim, InvalidArgument, "topk: k = ", t.k, " exceeds dim ", dim);
       SKETCHSGD_REQUIRE(!(t.global && t.sparse_reduce), InvalidArgument,
                         "topk: global=1 re-selects a server's sum; reduce=sparse selects the "
                         "ranks' own: choose one");
       return std::make_unique<TopK>(dim, std::move(spec), t, o.layout(), device);
     },
     LayoutUse::Optional,
     {"topk:momentum=0.9", "topk:momentum=0.9,global=1,index=delta,wire=bf16",
      "topk:index=delta,wire=fp16,reduce=sparse"}});

}  // namespace
}  // namespace sketchsgd
