// signsgd: 1-bit signs, 32 per word (Bernstein et al. 2018). sign(0) = +1 on the workers.
//   ef=0: the server takes the majority vote; ties (even W) give 0, so the downlink carries three
//         states and uses the 2-bit ternary codes. momentum>0 gives Signum.
//   ef=1: EF-signSGD (Karimireddy et al. 2019): p = e + g, send (‖p‖₁/n per chunk)·sign(p),
//         e = p − sent. The server averages the scaled signs (dense downlink).
// With a layout (optional) the scales are per tensor (chunks never straddle two; scale_runs.hpp).
#include <algorithm>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "../codec_info.hpp"
#include "../mean_aggregator.hpp"
#include "../payload.hpp"
#include "../scale_runs.hpp"

namespace sketchsgd {
namespace {

struct Signs {
  std::vector<float> scales;  // ef only
  std::vector<uint32_t> words;
};

Signs read_signs(ByteReader& r, const ScaleRuns& runs, bool scaled) {
  Signs s;
  if (scaled) s.scales = payload::read_scales(r, runs.scales());
  s.words.resize(runs.words());
  r.get_array(std::span<uint32_t>(s.words));
  r.expect_end();
  for (const auto& run : runs.runs())
    SKETCHSGD_REQUIRE(kernels::cpu::sign_padding_clear(s.words.data() + run.word_at, run.numel),
                      WireError, "signsgd: padding bits set in the last word of a run");
  return s;
}

class VoteAggregator final : public Aggregator {
 public:
  VoteAggregator(const Compressor& c, uint32_t world, const ScaleRuns& runs)
      : Aggregator(c, world), runs_(runs) {}

 private:
  void do_add(ByteReader& r, const Header&) override {
    const auto s = read_signs(r, runs_, false);
    if (neg_.size() != info_.dim) neg_.assign(info_.dim, 0);
    for (const auto& run : runs_.runs())
      kernels::cpu::count_negative(s.words.data() + run.word_at, run.numel,
                                   neg_.data() + run.offset);
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

  ScaleRuns runs_;
  std::vector<uint32_t> neg_;
};

class ScaledSignAggregator final : public MeanAggregator {
 public:
  ScaledSignAggregator(const Compressor& c, uint32_t world, const ScaleRuns& runs)
      : MeanAggregator(c, world), runs_(runs) {}

 private:
  void do_add(ByteReader& r, const Header&) override {
    const auto s = read_signs(r, runs_, true);
    auto& sum = this->sum();
    for (const auto& run : runs_.runs())
      kernels::cpu::unpack_signs(s.words.data() + run.word_at, run.numel, run.chunk,
                                 s.scales.data() + run.scale_at, sum.data() + run.offset, true);
  }
  ScaleRuns runs_;
};

class SignSGD final : public Compressor {
 public:
  SignSGD(uint64_t dim, std::string spec, bool ef, const ScaleRuns& runs, float momentum,
          const Device& device)
      : Compressor(CodecId::SignSGD, dim, std::move(spec), device),
        ef_(ef),
        runs_(runs),
        fb_(dim, momentum, ef, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    if (ef_) return std::make_unique<ScaledSignAggregator>(*this, world, runs_);
    return std::make_unique<VoteAggregator>(*this, world, runs_);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return 4 * runs_.words() + 4 * scale_count();
    if (kind == MessageKind::Update) return ef_ ? dense_bytes(dim()) : (dim() + 3) / 4;
    return 0;
  }

 private:
  uint64_t scale_count() const { return ef_ ? runs_.scales() : 0; }

  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto p = fb_.absorb(g);
    std::vector<float> scales(scale_count());
    std::vector<uint32_t> words;
    words.reserve(runs_.words());
    for (const auto& run : runs_.runs()) {
      const auto part = p.subspan(run.offset, run.numel);
      if (ef_) {
        const auto stats = ops::chunk_stats(device(), ops_, part, run.chunk);
        for (size_t c = 0; c < stats.size(); ++c) scales[run.scale_at + c] = stats[c].abs_mean;
      }
      const std::vector<uint32_t> w = ops::pack_signs(device(), ops_, part);
      if (ef_) {  // e = p − scale·sign(p)
        std::vector<float> neg(run.scales());
        for (size_t c = 0; c < neg.size(); ++c) neg[c] = -scales[run.scale_at + c];
        ops::unpack_signs(device(), ops_, w, run.chunk, neg,
                          fb_.error().subspan(run.offset, run.numel), true);
      }
      words.insert(words.end(), w.begin(), w.end());
    }
    return Message::build(h, max_payload(MessageKind::Gradient), [&](ByteWriter& w) {
      w.put_array(std::span<const float>(scales));
      w.put_array(std::span<const uint32_t>(words));
    });
  }

  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    if (ef_) return read_dense_update(r, step, device());
    const auto codes = r.take<uint8_t>((dim() + 3) / 4);
    r.expect_end();
    const size_t bad = ops::unpack_ternary(device(), ops_, codes, dim(), {}, 1.0f, step, false);
    SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "signsgd: invalid vote code at ", bad);
  }

  bool ef_;
  ScaleRuns runs_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(
    kSignSGD,
    {"signsgd",
     "1-bit signs; majority vote (ef=0) or EF-signSGD scaled signs (ef=1)",
     {{"ef", "1: EF-signSGD (error feedback, scaled signs, averaged)", 0, 0, 1},
      {"chunk",
       "ef=1: elements per scale (0: one scale for the whole vector, or per tensor with a layout)",
       0, 0, 4294967295.0},
      {"momentum", "local momentum before the sign (Signum)", 0, 0, 0.999, false}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       return std::make_unique<SignSGD>(dim, std::move(spec), o.flag("ef"),
                                        ScaleRuns(dim, o.integer("chunk"), o.layout()),
                                        float(o.number("momentum")), device);
     },
     LayoutUse::Optional,
     {"signsgd:ef=1", "signsgd", "signsgd:ef=1,chunk=64,momentum=0.9"}});

}  // namespace
}  // namespace sketchsgd
