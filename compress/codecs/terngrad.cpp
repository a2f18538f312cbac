// terngrad: TernGrad (Wen et al. 2017). Each element becomes s·sign(g)·Bernoulli(|g|/s) — unbiased
// — packed four 2-bit codes a byte, one scaler s per chunk: max|g|, or with clip=c, min(max|g|,
// c·σ) (values beyond ±s saturate). Random bits come from Philox keyed by (seed, round, sender), so
// runs reproduce. The server averages the dequantised vectors (dense downlink). With a layout
// (optional) the scalers are per tensor (chunks never straddle two; scale_runs.hpp).
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

/// Parsed Gradient payload: scales and codes (validated on unpack).
struct Ternary {
  std::vector<float> scales;
  std::span<const uint8_t> codes;
};

Ternary read_ternary(ByteReader& r, const ScaleRuns& runs, uint64_t chunk) {
  const uint32_t wire_chunk = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(wire_chunk == chunk, WireError, "terngrad chunk ", wire_chunk,
                    " differs from the codec's ", chunk);
  Ternary t;
  t.scales = payload::read_scales(r, runs.scales());
  t.codes = r.take<uint8_t>(runs.code_bytes());
  r.expect_end();
  return t;
}

class TernAggregator final : public MeanAggregator {
 public:
  TernAggregator(const Compressor& c, uint32_t world, const ScaleRuns& runs, uint64_t chunk)
      : MeanAggregator(c, world), runs_(runs), chunk_(chunk) {}

 private:
  void do_add(ByteReader& r, const Header&) override {
    const auto t = read_ternary(r, runs_, chunk_);
    // unpack_ternary validates every code of a run before it writes; with several runs, all are
    // decoded first, so a rejected message changes nothing.
    auto& s = sum();
    const bool one = runs_.runs().size() == 1;
    if (!one) decoded_.resize(info_.dim);
    for (const auto& run : runs_.runs()) {
      const size_t bad = kernels::cpu::unpack_ternary(
          t.codes.data() + run.code_at, run.numel, run.chunk, t.scales.data() + run.scale_at, 1.0f,
          (one ? s.data() : decoded_.data()) + run.offset, one);
      SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "terngrad: invalid code at element ",
                        run.offset + bad);
    }
    if (!one) kernels::cpu::axpy(s.data(), decoded_.data(), s.size(), 1.0f);
  }
  ScaleRuns runs_;
  uint64_t chunk_;
  std::vector<float> decoded_;
};

class TernGrad final : public Compressor {
 public:
  TernGrad(uint64_t dim, std::string spec, uint64_t chunk, const Layout& layout, float clip,
           uint64_t seed, bool ef, float momentum, const Device& device)
      : Compressor(CodecId::TernGrad, dim, std::move(spec), device),
        chunk_(chunk),
        runs_(dim, chunk, layout),
        clip_(clip),
        seed_(seed),
        fb_(dim, momentum, ef, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<TernAggregator>(*this, world, runs_, chunk_);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return 4 + 4 * runs_.scales() + runs_.code_bytes();
    return kind == MessageKind::Update ? dense_bytes(dim()) : 0;
  }

 private:
  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto v = fb_.absorb(g);
    std::vector<float> scales(runs_.scales());
    for (const auto& run : runs_.runs()) {
      const auto stats =
          ops::chunk_stats(device(), ops_, v.subspan(run.offset, run.numel), run.chunk);
      for (uint64_t c = 0; c < stats.size(); ++c)
        scales[run.scale_at + c] =
            clip_ > 0 ? std::min(stats[c].abs_max, clip_ * stats[c].stddev) : stats[c].abs_max;
    }
    // One random stream per (round, sender, run): runs do not repeat each other's bits.
    const uint64_t stream = (h.round << 32) ^ h.sender;
    const uint64_t at = 4 + 4 * scales.size();
    Message m = Message::build(h, max_payload(MessageKind::Gradient), [&](ByteWriter& w) {
      w.put(uint32_t(chunk_));
      w.put_array(std::span<const float>(scales));
      uint8_t* codes = w.grow(runs_.code_bytes());
      for (size_t i = 0; i < runs_.runs().size(); ++i) {
        const auto& run = runs_.runs()[i];
        ops::ternarize(device(), ops_, v.subspan(run.offset, run.numel), run.chunk,
                       std::span<const float>(scales).subspan(run.scale_at, run.scales()), seed_,
                       stream ^ (uint64_t(i) << 16), codes + run.code_at);
      }
    });
    if (fb_.has_error()) {  // e −= what was sent
      const auto codes = payload_of(m).subspan(at);
      for (const auto& run : runs_.runs())
        ops::unpack_ternary(device(), ops_, codes.subspan(run.code_at, (run.numel + 3) / 4),
                            run.chunk,
                            std::span<const float>(scales).subspan(run.scale_at, run.scales()),
                            -1.0f, fb_.error().subspan(run.offset, run.numel), true);
    }
    return m;
  }

  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    read_dense_update(r, step, device());
  }

  uint64_t chunk_;
  ScaleRuns runs_;
  float clip_;
  uint64_t seed_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(
    kTernGrad,
    {"terngrad",
     "TernGrad 2-bit stochastic ternary gradients; server averages",
     {{"chunk", "elements per scaler (0: one for the whole vector, or per tensor with a layout)", 0,
       0, 4294967295.0},
      {"clip", "scaler = min(max|g|, clip * stddev) per chunk; 0: max|g|", 0, 0, 100, false},
      {"seed", "seed of the Philox random stream", 1, 0, 4294967295.0},
      {"ef", "1: error feedback", 0, 0, 1},
      {"momentum", "local momentum before quantisation", 0, 0, 0.999, false}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       uint64_t chunk = o.integer("chunk");
       if (chunk == 0 || chunk > dim) chunk = dim;
       return std::make_unique<TernGrad>(dim, std::move(spec), chunk, o.layout(),
                                         float(o.number("clip")), o.integer("seed"), o.flag("ef"),
                                         float(o.number("momentum")), device);
     },
     LayoutUse::Optional,
     {"terngrad:ef=1", "terngrad:chunk=64,clip=2.5,momentum=0.5"}});

}  // namespace
}  // namespace sketchsgd
