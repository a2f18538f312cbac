// dense: the fp32 baseline. Workers send the gradient (or, with momentum, their local momentum,
// whose mean is the momentum of the mean gradient); the server returns the mean.
#include <sketchsgd/compress/feedback.hpp>
#include <sketchsgd/compress/registry.hpp>
#include "../mean_aggregator.hpp"
#include "../ops.hpp"
#include "../summable.hpp"

namespace sketchsgd {
namespace {

class DenseAggregator final : public SummableAggregator {
 public:
  using SummableAggregator::SummableAggregator;

 private:
  Message reduce_sum(std::span<float> sum, const Header& phase, uint32_t contributors) override {
    ops::scale(device_, sum, 1.0f / float(contributors));
    return dense_update(phase, ops::to_host(device_, sum, staging_));
  }
  std::vector<float> staging_;  // the mean on its way from a GPU
};

class Dense final : public SummableCodec {
 public:
  Dense(uint64_t dim, std::string spec, float momentum, const Device& device)
      : SummableCodec(CodecId::Dense, dim, std::move(spec), device, WireFloat::F32),
        fb_(dim, momentum, false, device) {}

  std::unique_ptr<Aggregator> make_aggregator(uint32_t world) const override {
    return std::make_unique<DenseAggregator>(*this, world);
  }
  uint64_t sum_size(MessageKind kind) const override {
    return kind == MessageKind::Gradient ? dim() : 0;
  }

 private:
  uint64_t reply_bytes(MessageKind kind) const override {
    return kind == MessageKind::Update ? dense_bytes(dim()) : 0;
  }
  void do_encode_sum(std::span<const float> g, uint64_t, std::span<float> out) override {
    const auto v = fb_.absorb(g);
    detail::copy_bytes(out.data(), v.data(), v.size_bytes(), device());
  }
  void do_apply(ByteReader& r, const Header&, std::span<float> step) override {
    read_dense_update(r, step, device());
  }
  Feedback* feedback() override { return &fb_; }

  Feedback fb_;
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
