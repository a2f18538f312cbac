// terngrad: TernGrad (Wen et al. 2017). Each element becomes s·sign(g)·Bernoulli(|g|/s) — unbiased
// — packed four 2-bit codes a byte, one scaler s per chunk: max|g|, or with clip=c, min(max|g|,
// c·σ) (values beyond ±s saturate). Random bits come from Philox keyed by (seed, round, sender), so
// runs reproduce. The server averages the dequantised vectors (dense downlink).
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

uint64_t chunks_of(uint64_t dim, uint64_t chunk) {
  return (dim + chunk - 1) / chunk;
}

/// Parsed Gradient payload: chunk size, scales, codes (validated on unpack).
struct Ternary {
  std::vector<float> scales;
  std::span<const uint8_t> codes;
};

Ternary read_ternary(ByteReader& r, uint64_t dim, uint64_t chunk) {
  const uint32_t wire_chunk = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(wire_chunk == chunk, WireError, "terngrad chunk ", wire_chunk,
                    " differs from the codec's ", chunk);
  Ternary t;
  t.scales = payload::read_scales(r, chunks_of(dim, chunk));
  t.codes = r.take<uint8_t>((dim + 3) / 4);
  r.expect_end();
  return t;
}

class TernAggregator final : public MeanAggregator {
 public:
  TernAggregator(const Compressor& c, uint32_t world, uint64_t chunk)
      : MeanAggregator(c, world), chunk_(chunk) {}

 private:
  void absorb(ByteReader& r, const Header&) override {
    const auto t = read_ternary(r, info_.dim, chunk_);
    // unpack_ternary validates every code before it writes: a rejected message changes nothing.
    auto& s = sum();
    const size_t bad = kernels::cpu::unpack_ternary(t.codes.data(), info_.dim, chunk_,
                                                    t.scales.data(), 1.0f, s.data(), true);
    SKETCHSGD_REQUIRE(bad == kernels::kNone, WireError, "terngrad: invalid code at element ", bad);
  }
  uint64_t chunk_;
};

class TernGrad final : public Compressor {
 public:
  TernGrad(uint64_t dim, std::string spec, uint64_t chunk, float clip, uint64_t seed, bool ef,
           float momentum, const Device& device)
      : Compressor(CodecId::TernGrad, dim, std::move(spec), device),
        chunk_(chunk),
        clip_(clip),
        seed_(seed),
        fb_(dim, momentum, ef, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<TernAggregator>(*this, world, chunk_);
  }
  uint64_t max_payload(MessageKind kind) const override {
    if (kind == MessageKind::Gradient) return 4 + 4 * chunks_of(dim(), chunk_) + (dim() + 3) / 4;
    return kind == MessageKind::Update ? dense_bytes(dim()) : 0;
  }

 private:
  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto v = fb_.absorb(g);
    const uint64_t nc = chunks_of(dim(), chunk_);
    const auto stats = ops::chunk_stats(device(), ops_, v, chunk_);
    std::vector<float> scales(nc);
    for (uint64_t c = 0; c < nc; ++c)
      scales[c] =
          clip_ > 0 ? std::min(stats[c].abs_max, clip_ * stats[c].stddev) : stats[c].abs_max;
    const uint64_t stream = (h.round << 32) ^ h.sender;
    const size_t nbytes = (dim() + 3) / 4;
    Message m = Message::build(h, max_payload(MessageKind::Gradient), [&](ByteWriter& w) {
      w.put(uint32_t(chunk_));
      w.put_array(std::span<const float>(scales));
      ops::ternarize(device(), ops_, v, chunk_, scales, seed_, stream, w.grow(nbytes));
    });
    if (fb_.has_error()) {  // e −= what was sent
      const auto codes = payload_of(m).subspan(4 + 4 * nc);
      ops::unpack_ternary(device(), ops_, codes, chunk_, scales, -1.0f, fb_.error(), true);
    }
    return m;
  }

  void do_decode(ByteReader& r, const Header&, std::span<float> step) const override {
    read_dense_update(r, step, device());
  }

  uint64_t chunk_;
  float clip_;
  uint64_t seed_;
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(
    kTernGrad,
    {"terngrad",
     "TernGrad 2-bit stochastic ternary gradients; server averages",
     {{"chunk", "elements per scaler (0: one scaler for the whole vector)", 0, 0, 4294967295.0},
      {"clip", "scaler = min(max|g|, clip * stddev) per chunk; 0: max|g|", 0, 0, 100, false},
      {"seed", "seed of the Philox random stream", 1, 0, 4294967295.0},
      {"ef", "1: error feedback", 0, 0, 1},
      {"momentum", "local momentum before quantisation", 0, 0, 0.999, false}},
     [](const Options& o, uint64_t dim, std::string spec, const Device& device) {
       uint64_t chunk = o.integer("chunk");
       if (chunk == 0 || chunk > dim) chunk = dim;
       return std::make_unique<TernGrad>(dim, std::move(spec), chunk, float(o.number("clip")),
                                         o.integer("seed"), o.flag("ef"),
                                         float(o.number("momentum")), device);
     }});

}  // namespace
}  // namespace sketchsgd
