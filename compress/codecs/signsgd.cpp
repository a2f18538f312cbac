// signsgd: 1-bit signs, 32 per word (Bernstein et al. 2018). sign(0) = +1 on the workers.
//   ef=0: the server takes the majority vote; ties (even W) give 0, so the downlink carries three
//         states and uses the 2-bit ternary codes. momentum>0 gives Signum.
//   ef=1: EF-signSGD (Karimireddy et al. 2019): p = e + g, send (‖p‖₁/n per chunk)·sign(p),
//         e = p − sent. The server averages the scaled signs (dense downlink).
#include <algorithm>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/mean_aggregator.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "../ops.hpp"
#include "../payload.hpp"

namespace sketchsgd {
namespace {

uint64_t words_of(uint64_t dim) {
  return (dim + 31) / 32;
}
uint64_t chunks_of(uint64_t dim, uint64_t chunk) {
  return (dim + chunk - 1) / chunk;
}

struct Signs {
  std::vector<float> scales;  // ef only
  std::vector<uint32_t> words;
};

Signs read_signs(ByteReader& r, uint64_t dim, uint64_t chunks) {
  Signs s;
  if (chunks) s.scales = payload::read_scales(r, chunks);
  s.words.resize(words_of(dim));
  r.get_array(std::span<uint32_t>(s.words));
  r.expect_end();
  SKETCHSGD_REQUIRE(kernels::cpu::sign_padding_clear(s.words.data(), dim), WireError,
                    "signsgd: padding bits set in the last word");
  return s;
}

class VoteAggregator final : public Aggregator {
 public:
  using Aggregator::Aggregator;

 private:
  void absorb(ByteReader& r, const Header&) override {
    const auto s = read_signs(r, info_.dim, 0);
    if (neg_.size() != info_.dim) neg_.assign(info_.dim, 0);
    kernels::cpu::count_negative(s.words.data(), info_.dim, neg_.data());
  }
  Message reduce(const Header& phase, uint32_t contributors) override {
    std::vector<float> vote(info_.dim);
    for (size_t j = 0; j < vote.size(); ++j) vote[j] = float(contributors) - 2.0f * float(neg_[j]);
    Header h = phase;
    h.kind = MessageKind::Update;
    const size_t nbytes = (vote.size() + 3) / 4;
    return Message::build(h, nbytes, [&](ByteWriter& w) {
      kernels::cpu::pack_ternary(vote.data(), vote.size(), w.grow(nbytes));
    });
  }
  void clear() override { std::fill(neg_.begin(), neg_.end(), 0u); }

  std::vector<uint32_t> neg_;
};

class ScaledSignAggregator final : public MeanAggregator {
 public:
  ScaledSignAggregator(const Compressor& c, uint32_t world, uint64_t chunk)
      : MeanAggregator(c, world), chunk_(chunk) {}

 private:
  void absorb(ByteReader& r, const Header&) override {
    const auto s = read_signs(r, info_.dim, chunks_of(info_.dim, chunk_));
    auto& sum = this->sum();
    kernels::cpu::unpack_signs(s.words.data(), info_.dim, chunk_, s.scales.data(), sum.data(),
                               true);
  }
  uint64_t chunk_;
};

class SignSGD final : public Compressor {
 public:
  SignSGD(uint64_t dim, std::string spec, bool ef, uint64_t chunk, float momentum,
          const Device& device)
      : Compressor(CodecId::SignSGD, dim, std::move(spec), device),
        ef_(ef),
        chunk_(chunk),
        fb_(dim, momentum, ef, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    if (ef_) return std::make_unique<ScaledSignAggregator>(*this, world, chunk_);
    return std::make_unique<VoteAggregator>(*this, world);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return 4 * words_of(dim()) + 4 * scale_count();
    if (kind == MessageKind::Update) return ef_ ? dense_bytes(dim()) : (dim() + 3) / 4;
    return 0;
  }

 private:
  uint64_t scale_count() const { return ef_ ? chunks_of(dim(), chunk_) : 0; }

  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto p = fb_.absorb(g);
    std::vector<float> scales(scale_count());
    if (ef_) {
      const auto stats = ops::chunk_stats(device(), ops_, p, chunk_);
      for (size_t c = 0; c < stats.size(); ++c) scales[c] = stats[c].abs_mean;
    }
    const std::vector<uint32_t> words = ops::pack_signs(device(), ops_, p);
    if (ef_) {  // e = p − scale·sign(p)
      std::vector<float> neg(scales.size());
      for (size_t c = 0; c < scales.size(); ++c) neg[c] = -scales[c];
      ops::unpack_signs(device(), ops_, words, chunk_, neg, fb_.error(), true);
    }
    return Message::build(h, max_payload(MessageKind::Gradient), [&](ByteWriter& w) {
      w.put_array(std::span<const float>(scales));
      w.put_array(std::span<const uint32_t>(words));
    });
  }

  void do_decode(ByteReader& r, const Header&, std::span<float> step) const override {
    if (ef_) return read_dense_update(r, step, device());
    const auto codes = r.take<uint8_t>((dim() + 3) / 4);
    r.expect_end();
    const size_t bad = ops::unpack_ternary(device(), ops_, codes, dim(), {}, 1.0f, step, false);
    SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "signsgd: invalid vote code at ", bad);
  }

  bool ef_;
  uint64_t chunk_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(
    kSignSGD,
    {"signsgd",
     "1-bit signs; majority vote (ef=0) or EF-signSGD scaled signs (ef=1)",
     {{"ef", "1: EF-signSGD (error feedback, scaled signs, averaged)", 0, 0, 1},
      {"chunk", "ef=1: elements per scale (0: one scale for the whole vector)", 0, 0, 4294967295.0},
      {"momentum", "local momentum before the sign (Signum)", 0, 0, 0.999, false}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       uint64_t chunk = o.integer("chunk");
       if (chunk == 0 || chunk > dim) chunk = dim;
       return std::make_unique<SignSGD>(dim, std::move(spec), o.flag("ef"), chunk,
                                        float(o.number("momentum")), device);
     }});

}  // namespace
}  // namespace sketchsgd
