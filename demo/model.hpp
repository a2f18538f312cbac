// The demo's models (libtorch) with all parameters living in one flat float vector, so a worker
// hands its gradient to the codec and takes the server's model back with one copy each. On a
// CUDA device the vector, the gradient and every span below are device memory.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <string>

#include <sketchsgd/compress/layout.hpp>

namespace sketchsgd::demo {

class FlatModel {
 public:
  /// "mlp": 784-1024-1024-10 (1,863,690 parameters); "cnn": two 5×5 conv layers + two dense
  /// layers (~580k). Initialised from seed, identically in every process.
  FlatModel(const std::string& kind, uint64_t seed, torch::Device device = torch::kCPU);

  int64_t dim() const { return flat_.numel(); }
  /// The parameters' shapes in the flat vector's order (for codecs that work per tensor).
  Layout layout() const;
  torch::Device device() const { return flat_.device(); }
  /// The parameters, one contiguous vector (the model's tensors are views into it).
  std::span<float> params() { return {flat_.data_ptr<float>(), size_t(flat_.numel())}; }
  torch::Tensor& flat() { return flat_; }
  /// params = p (p in the model's memory).
  void load(std::span<const float> p);
  /// A tensor over memory of the model's device (no copy).
  torch::Tensor view(std::span<float> v) const;

  /// Forward + backward on a batch (moved to the model's device); writes the flat gradient into
  /// grad (the model's memory) and returns the loss.
  float gradient(const torch::Tensor& x, const torch::Tensor& y, std::span<float> grad);
  /// Accuracy over a data set, in batches.
  double accuracy(const torch::Tensor& x, const torch::Tensor& y);

 private:
  torch::Tensor forward(const torch::Tensor& x);

  std::string kind_;
  torch::nn::Sequential net_;
  torch::Tensor flat_;
};

}  // namespace sketchsgd::demo
