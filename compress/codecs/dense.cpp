// dense: the baseline. Workers send the gradient (or, with momentum, their local momentum, whose
// mean is the momentum of the mean gradient); the server returns the mean. fp32 by default; fp16
// or bf16 on the wire halve both (the sum is taken in float32 and rounded once).
#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include "../summable.hpp"

namespace sketchsgd {
namespace {

class DenseAggregator final : public SummableAggregator {
 public:
  using SummableAggregator::SummableAggregator;

 private:
  void reduce_to(std::span<float> sum, const Header&, uint32_t contributors,
                 std::span<float> out) override {
    ops::scale(device_, sum, 1.0f / float(contributors));
    ops::copy(device_, out, sum);
  }
};

class Dense final : public SummableCodec {
 public:
  Dense(uint64_t dim, std::string spec, float momentum, WireFloat wire, const Device& device)
      : SummableCodec(CodecId::Dense, dim, std::move(spec), device, wire),
        fb_(dim, momentum, false, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<DenseAggregator>(*this, world);
  }
  uint64_t sum_size(MessageKind kind) const override {
    return kind == MessageKind::Gradient ? dim() : 0;
  }
  uint64_t reply_size(MessageKind kind) const override {
    return kind == MessageKind::Update ? dim() : 0;
  }

 private:
  void do_encode_sum(std::span<const float> g, uint64_t, std::span<float> out) override {
    ops::copy(device(), out, fb_.absorb(g));
  }
  void do_apply_values(std::span<const float> update, std::span<float> step) override {
    ops::copy(device(), step, update);
  }
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
};

SKETCHSGD_REGISTER_CODEC(kDense, {"dense",
                                  "whole gradients, server returns the mean",
                                  {{"momentum", "local momentum rho", 0, 0, 0.999, false},
                                   {"wire",
                                    "format of the gradients and the mean on the wire (int8: a "
                                    "scale per 64 values, the mean in fp16)",
                                    0,
                                    0,
                                    3,
                                    true,
                                    {"fp32", "fp16", "bf16", "int8"}}},
                                  [](const Options& o, uint64_t dim, std::string spec,
                                     const Device& device) {
                                    return std::make_unique<Dense>(
                                        dim, std::move(spec), float(o.number("momentum")),
                                        WireFloat(o.integer("wire")), device);
                                  },
                                  LayoutUse::None,
                                  {"dense", "dense:momentum=0.5", "dense:wire=fp16"}});

}  // namespace
}  // namespace sketchsgd
