#include "model.hpp"

#include <cstring>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::demo {

FlatModel::FlatModel(const std::string& kind, uint64_t seed, torch::Device device) : kind_(kind) {
  torch::manual_seed(seed);
  namespace nn = torch::nn;
  if (kind == "mlp") {
    net_ = nn::Sequential(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                          nn::Linear(1024, 10));
  } else if (kind == "cnn") {
    net_ = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 5).padding(2)), nn::ReLU(),
                          nn::MaxPool2d(nn::MaxPool2dOptions(2)),
                          nn::Conv2d(nn::Conv2dOptions(32, 64, 5).padding(2)), nn::ReLU(),
                          nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Flatten(),
                          nn::Linear(64 * 7 * 7, 128), nn::ReLU(), nn::Linear(128, 10));
  } else {
    throw InvalidArgument("model must be mlp or cnn, got '" + kind + "'");
  }
  // Initialised on the CPU (the same numbers on every device), then moved; every parameter then
  // becomes a view of one flat vector.
  net_->to(device);
  int64_t total = 0;
  for (const auto& p : net_->parameters()) total += p.numel();
  flat_ = torch::empty({total}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  int64_t at = 0;
  torch::NoGradGuard no_grad;
  for (auto& p : net_->parameters()) {
    auto view = flat_.narrow(0, at, p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    at += p.numel();
  }
}

torch::Tensor FlatModel::forward(const torch::Tensor& x) {
  return net_->forward(kind_ == "cnn" ? x.view({-1, 1, 28, 28}) : x.view({-1, 784}));
}

torch::Tensor FlatModel::view(std::span<float> v) const {
  return torch::from_blob(v.data(), {int64_t(v.size())},
                          torch::TensorOptions().dtype(torch::kFloat32).device(flat_.device()));
}

Layout FlatModel::layout() const {
  std::vector<std::vector<uint64_t>> shapes;
  for (const auto& p : net_->parameters()) {
    std::vector<uint64_t> s(p.sizes().begin(), p.sizes().end());
    shapes.push_back(s.empty() ? std::vector<uint64_t>{1} : s);
  }
  return Layout(std::move(shapes));
}

void FlatModel::load(std::span<const float> p) {
  SKETCHSGD_REQUIRE(int64_t(p.size()) == dim(), InvalidArgument, "load: ", p.size(), " values for ",
                    dim(), " parameters");
  torch::NoGradGuard no_grad;
  flat_.copy_(view({const_cast<float*>(p.data()), p.size()}));
}

float FlatModel::gradient(const torch::Tensor& x, const torch::Tensor& y, std::span<float> grad) {
  SKETCHSGD_REQUIRE(int64_t(grad.size()) == dim(), InvalidArgument, "gradient buffer of ",
                    grad.size(), " for ", dim(), " parameters");
  for (auto& p : net_->parameters())
    if (p.grad().defined()) p.grad().zero_();
  const auto loss = torch::nn::functional::cross_entropy(forward(x.to(device())), y.to(device()));
  loss.backward();
  torch::NoGradGuard no_grad;
  torch::Tensor out = view(grad);
  int64_t at = 0;
  for (const auto& p : net_->parameters()) {
    out.narrow(0, at, p.numel()).copy_(p.grad().reshape({-1}));
    at += p.numel();
  }
  return loss.item<float>();
}

double FlatModel::accuracy(const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  const int64_t n = x.size(0);
  for (int64_t i = 0; i < n; i += 1000) {
    const int64_t m = std::min<int64_t>(1000, n - i);
    const auto pred = forward(x.narrow(0, i, m).to(device())).argmax(1);
    correct += pred.eq(y.narrow(0, i, m).to(device())).sum().item<int64_t>();
  }
  return n ? double(correct) / double(n) : 0.0;
}

}  // namespace sketchsgd::demo
