// The gathered codecs whose messages are sparse lists (topk, sparseloco), as the Round's sparse
// all-reduce (compress/sparse_reduce.hpp, reduce=sparse) needs them: the list a message holds,
// how lists travel, and an error feedback that takes back what the global selection dropped.
#pragma once

#include <cstdint>
#include <span>

#include "payload.hpp"

namespace sketchsgd {

class SparseListCodec {
 public:
  /// Whether the spec asks for the sparse all-reduce (reduce=sparse) under a collective driver.
  virtual bool reduces_sparse() const = 0;
  /// The most values a message's list holds: also the most the sparse update keeps.
  virtual uint64_t budget() const = 0;
  /// The list one of this codec's Gradient messages carries (WireError if it is not one).
  virtual payload::Sparse pairs(std::span<const uint8_t> message) const = 0;
  /// How lists travel between ranks and in the update: the codec's update format.
  virtual payload::SparseFormat list_format() const = 0;
  /// Error feedback takes back values of the last message the update did not keep (nothing
  /// without error feedback).
  virtual void refund(const payload::Sparse& dropped) = 0;

 protected:
  ~SparseListCodec() = default;
};

}  // namespace sketchsgd
