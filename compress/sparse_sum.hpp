// The server side shared by gathered codecs whose workers send sparse lists (topk, sparseloco):
// each worker's list (strictly increasing indices) added as it comes, then the mean: equal
// indices summed in the order of their values' bits, so the sum never depends on the order in
// which messages arrived.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "payload.hpp"

namespace sketchsgd {

class SparseSum {
 public:
  /// One worker's list, indices strictly increasing.
  void add(std::span<const uint32_t> idx, std::span<const float> val);
  /// The union of the lists' indices (increasing) with each one's sum / contributors.
  payload::Sparse mean(uint32_t contributors);
  void clear();

 private:
  std::vector<uint32_t> idx_;
  std::vector<float> val_;
  std::vector<size_t> starts_;  // where each list begins
};

}  // namespace sketchsgd
