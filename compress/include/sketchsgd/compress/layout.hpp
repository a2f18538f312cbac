// The tensors a flat vector is made of (a model's parameters in order), for codecs that work per
// tensor: PowerSGD factors each matrix, and small tensors go uncompressed. Written in a spec as
//   layout=1024x784+1024+10x1024+10      (tensors joined by '+', dimensions by 'x')
// so it is part of the canonical spec: a server and its workers agree on it the way they agree on
// every other option.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sketchsgd {

class Layout {
 public:
  /// One tensor: where it starts in the flat vector and its matrix view (rows = first
  /// dimension, cols = the product of the others; a 1-D tensor of n is n × 1).
  struct Tensor {
    uint64_t offset;
    uint64_t numel;
    uint64_t rows;
    uint64_t cols;
    size_t dims;
  };

  /// A stretch of the flat vector.
  struct Run {
    uint64_t offset;
    uint64_t numel;
  };

  /// The layout cut in two by a rule: the tensors a codec compresses (kept) and the ones it sends
  /// whole, each in the layout's order.
  struct Split {
    std::vector<Tensor> kept, whole;
    uint64_t kept_size = 0, whole_size = 0;

    /// The stretches one side covers, neighbouring tensors merged.
    static std::vector<Run> runs(const std::vector<Tensor>& side);
    /// k spread over the kept tensors in proportion to their sizes: floors first, then one more
    /// to the largest remainders, none past its tensor's size (k capped at kept_size).
    std::vector<uint64_t> shares(uint64_t k) const;
  };

  Layout() = default;  ///< no layout: one flat vector
  /// InvalidArgument for an empty shape, a zero dimension, or more than 2^32 − 1 values.
  explicit Layout(std::vector<std::vector<uint64_t>> shapes);
  /// The text form above; InvalidArgument naming what is wrong.
  static Layout parse(std::string_view text);

  /// The rule of codecs that send small tensors uncompressed (topk, sketch): 1-D tensors and
  /// tensors of fewer than dense_below values go whole.
  static bool sent_whole(const Tensor& t, uint64_t dense_below) {
    return t.dims < 2 || t.numel < dense_below;
  }

  /// The one split of every codec and the DDP hook; sent_whole(t) says where tensor t goes.
  Split partition(const std::function<bool(const Tensor&)>& sent_whole) const;
  /// runs in order, each merged into the one before it where it starts where that one ends.
  static std::vector<Run> merge(std::span<const Run> runs);

  bool empty() const { return tensors_.empty(); }
  uint64_t size() const { return size_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<std::vector<uint64_t>>& shapes() const { return shapes_; }
  std::string text() const;

  bool operator==(const Layout& o) const { return shapes_ == o.shapes_; }

 private:
  std::vector<std::vector<uint64_t>> shapes_;
  std::vector<Tensor> tensors_;
  uint64_t size_ = 0;
};

}  // namespace sketchsgd
