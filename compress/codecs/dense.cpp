// dense: the fp32 baseline. Workers send the gradient (or, with momentum, their local momentum,
// whose mean is the momentum of the mean gradient); the server returns the mean.
#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/mean_aggregator.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include "../ops.hpp"
#include "../payload.hpp"

namespace sketchsgd {
namespace {

class DenseAggregator final : public MeanAggregator {
 public:
  using MeanAggregator::MeanAggregator;

 private:
  void absorb(ByteReader& r, const Header&) override {
    const auto g = payload::read_floats(r, info_.dim, "gradient value");
    r.expect_end();
    add_values(g);
  }
  void absorb_sum(std::span<const float> g, MessageKind) override {
    const auto host = ops::to_host(device_, g, staging_);
    SKETCHSGD_REQUIRE(kernels::cpu::find_nonfinite(host.data(), host.size()) == kernels::kNone,
                      WireError, "dense: summed gradient is not finite");
    add_values(host);
  }
  void add_values(std::span<const float> g) {  // host values, validated
    auto& s = sum();
    kernels::cpu::axpy(s.data(), g.data(), g.size(), 1.0f);
  }

  std::vector<float> staging_;  // a summed GPU vector on its way to the host
};

class Dense final : public Compressor {
 public:
  Dense(uint64_t dim, std::string spec, float momentum, const Device& device)
      : Compressor(CodecId::Dense, dim, std::move(spec), device),
        fb_(dim, momentum, false, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<DenseAggregator>(*this, world);
  }
  uint64_t max_payload(MessageKind kind) const override {
    return kind == MessageKind::Gradient || kind == MessageKind::Update ? dense_bytes(dim()) : 0;
  }
  uint64_t sum_size(MessageKind kind) const override {
    return kind == MessageKind::Gradient ? dim() : 0;
  }

 private:
  Message do_encode(std::span<const float> g, const Header& h) override {
    const auto v = ops::to_host(device(), fb_.absorb(g), staging_);
    return Message::build(h, v.size_bytes(), [&](ByteWriter& w) { w.put_array(v); });
  }
  void do_encode_sum(std::span<const float> g, std::span<float> out) override {
    const auto v = fb_.absorb(g);
    detail::copy_bytes(out.data(), v.data(), v.size_bytes(), device());
  }
  void do_decode(ByteReader& r, const Header&, std::span<float> step) const override {
    read_dense_update(r, step, device());
  }

  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
  std::vector<float> staging_;  // host copy of a GPU vector for the wire
};

SKETCHSGD_REGISTER_CODEC(kDense, {"dense",
                                  "fp32 gradients, server returns the mean",
                                  {{"momentum", "local momentum rho", 0, 0, 0.999, false}},
                                  [](const Options& o, uint64_t dim, std::string spec,
                                     const Device& device) {
                                    return std::make_unique<Dense>(
                                        dim, std::move(spec), float(o.number("momentum")), device);
                                  }});

}  // namespace
}  // namespace sketchsgd
