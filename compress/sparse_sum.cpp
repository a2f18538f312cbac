#include "sparse_sum.hpp"

namespace sketchsgd {

void SparseSum::add(std::span<const uint32_t> idx, std::span<const float> val) {
  starts_.push_back(idx_.size());
  idx_.insert(idx_.end(), idx.begin(), idx.end());
  val_.insert(val_.end(), val.begin(), val.end());
}

payload::Sparse SparseSum::mean(uint32_t contributors) {
  payload::merge_by_index(idx_, val_, starts_);
  payload::Sparse out;
  for (size_t i = 0; i < idx_.size();) {
    size_t j = i;
    float acc = 0.0f;
    for (; j < idx_.size() && idx_[j] == idx_[i]; ++j) acc += val_[j];
    out.indices.push_back(idx_[i]);
    out.values.push_back(acc / float(contributors));
    i = j;
  }
  return out;
}

void SparseSum::clear() {
  idx_.clear();
  val_.clear();
  starts_.clear();
}

}  // namespace sketchsgd
