// qsgd: QSGD (Alistarh et al. 2017). Each value becomes sign · norm · l / s with l a level of
// s = 2^(bits−1) − 1, chosen between the two levels around |x|·s/norm with the probability that
// makes it unbiased, one norm per bucket of `bucket` values (the L2 norm of the paper, or max |x|,
// which gives each level more values at low bits). Random bits come from Philox keyed by (seed,
// round, sender), so runs reproduce. The server averages the dequantised vectors (dense
// downlink). With a layout (optional) buckets never straddle two tensors (scale_runs.hpp).
// Gathered. Error feedback (ef=1) keeps what the rounding lost; it needs a contraction, which the
// unbiased quantiser Q is not when its variance factor ω = min(b/s², √b/s) (bucket b; Alistarh
// et al., Lemma 3.1) exceeds 1 — the error then grows without bound. So with ef=1 workers send
// Q(x)/(1 + ω), a contraction (Stich and Karimireddy 2020), by shrinking the norms they send:
// the codes and the wire format stay the same.
#include <algorithm>
#include <cmath>

#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "../codec_info.hpp"
#include "../mean_aggregator.hpp"
#include "../payload.hpp"
#include "../scale_runs.hpp"

namespace sketchsgd {
namespace {

struct QsgdOptions {
  uint32_t bits;
  bool l2;
  uint64_t seed;
};

/// out = the message's values, weighted; WireError (nothing written) for a corrupt payload.
void unpack(std::span<const float> norms, std::span<const uint8_t> codes, const ScaleRuns& runs,
            uint32_t bits, float weight, float* out, bool accumulate) {
  for (const auto& run : runs.runs()) {
    const size_t bad = kernels::cpu::qsgd_unpack(codes.data() + run.code_at, run.numel, run.chunk,
                                                 norms.data() + run.scale_at, bits, weight,
                                                 out + run.offset, accumulate);
    SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "qsgd: invalid code at element ",
                      run.offset + bad);
  }
}

class QsgdAggregator final : public MeanAggregator {
 public:
  QsgdAggregator(const Compressor& c, uint32_t world, const ScaleRuns& runs, uint32_t bits)
      : MeanAggregator(c, world), runs_(runs), bits_(bits) {}

 private:
  void do_add(ByteReader& r, const Header&) override {
    const auto norms = payload::read_scales(r, runs_.scales());
    const auto codes = r.take<uint8_t>(runs_.code_bytes());
    r.expect_end();
    decoded_.resize(info_.dim);  // every run decoded before the sum changes
    unpack(norms, codes, runs_, bits_, 1.0f, decoded_.data(), false);
    auto& s = sum();
    kernels::cpu::axpy(s.data(), decoded_.data(), s.size(), 1.0f);
  }

  ScaleRuns runs_;
  uint32_t bits_;
  std::vector<float> decoded_;
};

class Qsgd final : public Compressor {
 public:
  Qsgd(uint64_t dim, std::string spec, const QsgdOptions& o, uint64_t bucket, const Layout& layout,
       bool ef, float momentum, const Device& device)
      : Compressor(CodecId::QSGD, dim, std::move(spec), device),
        o_(o),
        runs_(dim, bucket, layout, o.bits),
        fb_(dim, momentum, ef, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<QsgdAggregator>(*this, world, runs_, o_.bits);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return 4 * runs_.scales() + runs_.code_bytes();
    return kind == MessageKind::Update ? dense_bytes(dim()) : 0;
  }

 private:
  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto v = fb_.absorb(g);
    std::vector<float> norms(runs_.scales());
    for (const auto& run : runs_.runs())
      kernels::cpu::chunk_norms(v.data() + run.offset, run.numel, run.chunk, o_.l2,
                                norms.data() + run.scale_at);
    for (size_t c = 0; c < norms.size(); ++c)
      if (!std::isfinite(norms[c])) {
        fb_.undo(g);  // a norm beyond float's range: as if this gradient never came
        throw NonFiniteError("qsgd: the norm of bucket " + std::to_string(c) +
                             " overflows float32");
      }
    std::vector<float> sent = norms;
    if (fb_.has_error())
      for (const auto& run : runs_.runs()) {
        const double b = double(run.chunk), s = double((1u << (o_.bits - 1)) - 1);
        const float shrink = float(1.0 / (1.0 + std::min(b / (s * s), std::sqrt(b) / s)));
        for (uint64_t c = 0; c < run.scales(); ++c) sent[run.scale_at + c] *= shrink;
      }
    // One random stream per (round, sender, run): runs do not repeat each other's bits.
    const uint64_t stream = (h.round << 32) ^ h.sender;
    Message m = Message::build(h, max_payload(MessageKind::Gradient), [&](ByteWriter& w) {
      w.put_array(std::span<const float>(sent));
      uint8_t* codes = w.grow(runs_.code_bytes());
      for (size_t i = 0; i < runs_.runs().size(); ++i) {
        const auto& run = runs_.runs()[i];
        kernels::cpu::qsgd_pack(v.data() + run.offset, run.numel, run.chunk,
                                norms.data() + run.scale_at, o_.bits, o_.seed,
                                stream ^ (uint64_t(i) << 16), codes + run.code_at);
      }
    });
    if (fb_.has_error())  // e −= what was sent
      unpack(sent, payload_of(m).subspan(4 * sent.size()), runs_, o_.bits, -1.0f,
             fb_.error().data(), true);
    return m;
  }

  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    read_dense_update(r, step, device());
  }
  Feedback* feedback() override { return &fb_; }

  QsgdOptions o_;
  ScaleRuns runs_;
  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(
    kQsgd,
    {"qsgd",
     "QSGD: stochastic quantisation to 2^(bits-1) - 1 levels with a norm per bucket; server "
     "averages",
     {{"bits", "bits per value, sign included: 2, 4 or 8", 4, 2, 8},
      {"bucket", "values per norm (0: one for the whole vector, or per tensor with a layout)", 512,
       0, 4294967295.0},
      {"norm", "the bucket's norm: l2 (the paper's) or max |x|", 0, 0, 1, true, {"l2", "max"}},
      {"seed", "seed of the Philox random stream", 1, 0, 4294967295.0},
      {"ef", "1: error feedback (keep what the rounding lost; sends Q(x) / (1 + omega))", 0, 0, 1},
      {"momentum", "local momentum before quantisation", 0, 0, 0.999, false}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       const auto bits = uint32_t(o.integer("bits"));
       SKETCHSGD_REQUIRE(bits == 2 || bits == 4 || bits == 8, InvalidArgument,
                         "qsgd: bits = ", bits, "; use 2, 4 or 8 (codes fill whole bytes)");
       SKETCHSGD_REQUIRE(!device.is_gpu(), InvalidArgument,
                         "qsgd has no CUDA implementation: build it on the CPU");
       const QsgdOptions q{bits, o.integer("norm") == 0, o.integer("seed")};
       return std::make_unique<Qsgd>(dim, std::move(spec), q, o.integer("bucket"), o.layout(),
                                     o.flag("ef"), float(o.number("momentum")), device);
     },
     LayoutUse::Optional,
     {"qsgd:ef=1", "qsgd:bits=2,bucket=64,norm=max,momentum=0.5"}});

}  // namespace
}  // namespace sketchsgd
